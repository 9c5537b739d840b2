# STAGE=grid64 docs/scripts/gpu_session.sh
# issues 3, 8: float64 on GPUs now defaults to blocks taller than wide (1x2 on 2
# ranks): against JAX (and cuBLASMp) at both sizes; the GPU tests on 2 ranks
    LIMIT=120 run python3 docs/scripts/compare_peers.py --size 16384 --dtype float64 --gpus 2 \
        --repeat 3 --rounds 3 --peers summa,jax,nvmath --peer-timeout 60 --json "$OUT/grid64.jsonl"
    LIMIT=150 run python3 docs/scripts/compare_peers.py --size 32768 --dtype float64 --gpus 2 \
        --repeat 3 --rounds 2 --peers summa,jax --peer-timeout 60 --json "$OUT/grid64.jsonl"
    TEST_FILES=tests/test_gpu.py mpi_tests 2
