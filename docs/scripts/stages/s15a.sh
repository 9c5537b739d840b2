# STAGE=s15a docs/scripts/gpu_session.sh
# the next one-GPU session's first call (built in session 14 after its device time): the
# pool's reads of the caller with iovecs made by NumPy (its worker idled 0.149 s before the
# first GEMM against 0.017 in the process), in the process and pooled, same call; then
# cuBLASLt's INT8 algorithms against gemmEx (s14h's probe), and the float64 product through
# the fastest of them (SUMMA_INT8_GEMM=cublaslt)
    LIMIT=100 SUMMA_TEST_BACKEND=cupy run python3 -m pytest -q -p no:cacheprovider --with-mpi \
        tests/test_remote.py tests/test_pool.py
    for peer in "" --pool; do
        LIMIT=80 run python3 docs/scripts/seed_case.py --sizes 16384 --dtype float64 \
            --free 24GiB $peer --peers "" --json "$OUT/seed.jsonl"
    done
    LIMIT=90 run python3 docs/scripts/int8_lt_probe.py --sizes 32768 --candidates 8 \
        --json "$OUT/int8_lt.jsonl"
    # the whole float64 product with cuBLASLt's fastest INT8 algorithm (session 15's
    # SUMMA_INT8_GEMM=cublaslt) against gemmEx's, same call
    LIMIT=90 run python3 docs/scripts/ozaki_probe.py --sizes 32768 --moduli auto --repeat 2 \
        --variants "SUMMA_INT8_GEMM=cublaslt" --json "$OUT/ozaki_lt.jsonl"
