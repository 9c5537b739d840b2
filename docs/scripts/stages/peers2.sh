# STAGE=peers2 docs/scripts/gpu_session.sh
# issues 3, 8: the same-run tables where summa was behind (JAX float64 and TF32,
# cuBLASMp float32), each peer's best of two rounds in alternating order
    SUMMA_TEST_BACKEND=cupy LIMIT=60 run $MPI -np 2 python3 -m pytest -q -p no:cacheprovider \
        --with-mpi tests/test_gpu.py -k "partly or check_of_host" | tail -2
    export XLA_PYTHON_CLIENT_PREALLOCATE=false
    for args in "--size 32768 --dtype float64 --peers summa,jax,nvmath" \
                "--size 32768 --dtype float32 --peers summa,jax,nvmath" \
                "--size 16384 --dtype float32 --precision tf32 --peers summa,jax"; do
        LIMIT=150 run python3 docs/scripts/compare_peers.py $args --gpus 2 --repeat 3 \
            --rounds 2 --json "$OUT/peers.jsonl"
    done
