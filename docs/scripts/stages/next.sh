# STAGE=next docs/scripts/gpu_session.sh
# the next one-GPU session's first call (built in session 13, not yet run on a GPU):
# the pool's workers reading and writing the caller's arrays in place (summa.remote)
# on a GPU, the read-aheads one file after the other (a cold streamed multiply's
# first GEMM waited 6.3 s), the test that failed on the 16-core machine
    LIMIT=150 SUMMA_TEST_BACKEND=cupy run python3 -m pytest -q -p no:cacheprovider --with-mpi \
        tests/test_pool.py tests/test_remote.py tests/test_io.py tests/test_gpu.py \
        tests/test_multiply.py -x
    LIMIT=100 run python3 docs/scripts/seed_case.py --sizes 16384 --dtype float64 \
        --free 24GiB --pool --peers "" --json "$OUT/seed.jsonl"
    LIMIT=100 SUMMA_IN_PLACE=0 run python3 docs/scripts/seed_case.py --sizes 16384 \
        --dtype float64 --free 24GiB --pool --peers "" --json "$OUT/seed_copies.jsonl"
    LIMIT=200 MPIEXEC="$MPI" run python3 docs/scripts/files_case.py --size 24576 \
        --dir /tmp/summa-files --ranks 1 --device-memory 8GiB --json "$OUT/files.jsonl"
    rm -rf /tmp/summa-files
