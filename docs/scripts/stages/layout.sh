# STAGE=layout docs/scripts/gpu_session.sh
# issues 3, 8: GEMM rate against operand layout; the layouts XLA gives JAX's matmul
    export XLA_PYTHON_CLIENT_PREALLOCATE=false
    LIMIT=120 run python3 docs/scripts/layout_probe.py float64 float32
    for d in float32 float64; do LIMIT=90 run python3 docs/scripts/split_probe.py $d; done
    for grid in 2x1 1x2 2x1 1x2; do  # the block's orientation, as the probe's second shape
        LIMIT=60 run $MPI -np 2 python3 -m summa bench --backend cupy --size 32768 \
            --dtype float64 --grid $grid --repeat 3 --json "$OUT/layout.jsonl"
    done
    XLA_FLAGS="--xla_dump_to=$OUT/xla --xla_dump_hlo_as_text" LIMIT=90 run python3 \
        docs/scripts/compare_peers.py --size 32768 --dtype float64 --gpus 2 --repeat 1 --peers jax
    run bash -c "grep -h -E 'custom-call|all-gather|dot\\(' $OUT/xla/*after_optimizations.txt \
        | grep -v threefry | cut -c1-900 | sort -u | head -20"
