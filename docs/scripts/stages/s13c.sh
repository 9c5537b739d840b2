# STAGE=s13c docs/scripts/gpu_session.sh
# session 13: the NaN/Inf probe on the GPU, the files case again (ranks unbound,
# read ahead, scans by cuBLAS), the pool with one GPU unbound, and the user's
# first call on a fresh machine (an empty CuPy kernel cache)
    LIMIT=120 SUMMA_TEST_BACKEND=cupy run python3 -m pytest -q -p no:cacheprovider --with-mpi \
        tests/test_gpu.py tests/test_multiply.py -k "finite or nan or npy or streams or overflow"
    LIMIT=200 MPIEXEC="$MPI" run python3 docs/scripts/files_case.py --size 24576 \
        --dir /tmp/summa-files --ranks 1 --device-memory 8GiB --json "$OUT/files.jsonl"
    rm -rf /tmp/summa-files
    LIMIT=100 run python3 docs/scripts/seed_case.py --sizes 16384 --dtype float64 \
        --free 24GiB --pool --peers "" --json "$OUT/seed.jsonl"
    LIMIT=100 CUPY_CACHE_DIR=$(mktemp -d) run python3 docs/scripts/seed_case.py --sizes 16384 \
        --dtype float64 --free 24GiB --peers "" --json "$OUT/seed_fresh.jsonl"
