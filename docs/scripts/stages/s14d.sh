# STAGE=s14d docs/scripts/gpu_session.sh
# session 14: float64 on INT8 through SUMMA out of core (first panel whole, strips of at
# least 2048 rows) from page-locked host arrays, against the bare product (ozaki_probe) and
# in memory in the same run: 64 GiB with 16384-wide panels, 24 GiB with 4096 and 8192
    LIMIT=60 run python3 docs/scripts/ozaki_probe.py --sizes 32768 --moduli auto --repeat 2 \
        --json "$OUT/ozaki.jsonl"
    for args in "--device-memory 64GiB --nb 16384" "--device-memory 24GiB" \
                "--device-memory 24GiB --nb 8192" ""; do
        LIMIT=90 run python3 -m summa bench --backend cupy --size 32768 --dtype float64 \
            --precision fp64-int8 $([ -n "$args" ] && echo --out-of-core) $args --check \
            --repeat 2 --no-ideal --json "$OUT/bench.jsonl"
    done
    bench_table "$OUT/bench.jsonl" out_of_core nb tflops check_residual
