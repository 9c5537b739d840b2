# STAGE=transpose docs/scripts/gpu_session.sh
# issues 3, 8: A's panels copied transposed (cuBLAS reads a column-major A
# faster: float64 56.6 against 52.1, float32 54.4 against 53.4 one GPU; JAX's layout)
    SUMMA_TEST_BACKEND=cupy LIMIT=90 run $MPI -np 2 python3 -m pytest -q -p no:cacheprovider \
        --with-mpi tests/test_gpu.py tests/test_transpose.py \
        -k "column_major or transposed" | tail -2
    LIMIT=60 run python3 docs/scripts/layout_probe.py float16 float32 tf32
    LIMIT=70 run python3 docs/scripts/split_probe.py float32 at
    for args in "--dtype float64" "--dtype float32" "--dtype float32 --schedule strips"; do
        for setting in auto no; do
            echo "SUMMA_TRANSPOSE_A=$setting $args"
            LIMIT=60 run $MPI -x SUMMA_TRANSPOSE_A=$setting -np 2 python3 -m summa bench \
                --backend cupy --size 32768 $args --check --repeat 3 --timeout 60 \
                --json "$OUT/transpose.jsonl" | grep -a -E "x 32768|rank   [01]|efficiency"
            [ "$args" = "--dtype float32 --schedule strips" ] && break  # strips keep A
        done
    done
    LIMIT=100 run python3 docs/scripts/compare_peers.py --size 32768 --dtype float64 --gpus 2 \
        --repeat 3 --rounds 2 --peers summa,jax --json "$OUT/peers.jsonl"
