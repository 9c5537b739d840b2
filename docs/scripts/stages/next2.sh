# STAGE=next2 docs/scripts/gpu_session.sh
# the next one-GPU session's second call (issue 25): float64 on INT8 out of core with
# its tail in row strips (B's residues once, session 13), against the bare product and
# in memory, same run
    LIMIT=100 run python3 docs/scripts/ozaki_probe.py --sizes 32768 --moduli auto --repeat 2 \
        --json "$OUT/ozaki.jsonl"
    for args in "--device-memory 64GiB --nb 16384" "--device-memory 24GiB" ""; do
        LIMIT=90 run python3 -m summa bench --backend cupy --size 32768 --dtype float64 \
            --precision fp64-int8 $([ -n "$args" ] && echo --out-of-core) $args --check \
            --repeat 2 --no-ideal --json "$OUT/bench.jsonl"
    done
    bench_table "$OUT/bench.jsonl" out_of_core nb tflops check_residual
    # the INT8 rates into a copy of the H200 profile, for summa/profiles/h200.json (issue 25:
    # `model --precision fp64-int8` predicts from it)
    cp summa/profiles/h200.json "$OUT/h200-int8.json"
    LIMIT=150 run python3 -m summa calibrate --backend cupy --precision fp64-int8 --append \
        -o "$OUT/h200-int8.json" --comm mpi --repeat 2
