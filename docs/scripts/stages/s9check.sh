# STAGE=s9check docs/scripts/gpu_session.sh
# issue 5: one GPU float64 host-resident against cuBLASXt (hostpeers' 120 s limit
# cut it); the GPU tests of the doubling head / shrinking tail and of session 8's changes
    LIMIT=400 run python3 docs/scripts/compare_peers.py --size 32768 --dtype float64 --gpus 1 \
        --placement host --peers summa,cublasxt --repeat 2 --rounds 2 --json "$OUT/hostpeers.jsonl"
    TEST_FILES="tests/test_gpu.py tests/test_outofcore.py" mpi_tests 2
    TEST_FILES="tests/test_algorithm.py tests/test_gpu.py tests/test_outofcore.py" mpi_tests 1
