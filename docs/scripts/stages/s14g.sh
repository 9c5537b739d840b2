# STAGE=s14g docs/scripts/gpu_session.sh
# session 14: float64 on INT8 out of core under 24 GiB, panel widths around the default 8192
# (s14e: 50.3 TFLOP/s, 0.87 of the bare product)
    for nb in 12288 6144; do
        LIMIT=60 run python3 -m summa bench --backend cupy --size 32768 --dtype float64 \
            --precision fp64-int8 --out-of-core --device-memory 24GiB --nb $nb --check \
            --repeat 2 --no-ideal --json "$OUT/bench.jsonl"
    done
    bench_table "$OUT/bench.jsonl" out_of_core nb tflops check_residual
