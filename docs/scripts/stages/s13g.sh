# STAGE=s13g docs/scripts/gpu_session.sh
# session 13, last call: GPU tests of this session's code, the pool's seconds on the
# workers' side, cuBLAS's emulation checked (eager, its bits), the files case with
# the GPU's idle time in the streamed multiply
    LIMIT=150 SUMMA_TEST_BACKEND=cupy run python3 -m pytest -q -p no:cacheprovider --with-mpi \
        tests/test_gpu.py tests/test_staging.py tests/test_multiply.py tests/test_io.py \
        tests/test_pool.py tests/test_grid.py -x
    LIMIT=80 run python3 docs/scripts/seed_case.py --sizes 16384 --dtype float64 \
        --free 24GiB --pool --peers "" --json "$OUT/seed.jsonl"
    LIMIT=90 run python3 docs/scripts/ozaki_probe.py --sizes 32768 --moduli auto --repeat 2 \
        --json "$OUT/ozaki.jsonl"
    LIMIT=150 MPIEXEC="$MPI" run python3 docs/scripts/files_case.py --size 24576 \
        --dir /tmp/summa-files --ranks 1 --device-memory 8GiB --json "$OUT/files.jsonl"
    rm -rf /tmp/summa-files
