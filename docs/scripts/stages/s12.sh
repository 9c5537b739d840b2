# STAGE=s12 docs/scripts/gpu_session.sh
# issues 22-25: the GPU tests of node-shared arrays, the pool and INT8 products;
# where the user's N = 16384 call spends its time; INT8 rates; then files23
    LIMIT=120 SUMMA_TEST_BACKEND=cupy run python3 -m pytest -q -p no:cacheprovider --with-mpi \
        tests/test_gpu.py tests/test_host.py tests/test_pool.py tests/test_staging.py \
        tests/test_ozaki.py -k "int8 or host or pool or stag or ozaki or peer"
    SUMMA_TEST_BACKEND=cupy LIMIT=120 run $MPI -np 2 python3 -m pytest -q --with-mpi -m mpi \
        -p no:cacheprovider tests/test_host.py tests/test_multiply.py tests/test_gpu.py \
        -k "host or numpy_arrays or shared or own or int8"
    LIMIT=150 run python3 docs/scripts/seed_tuning.py --size ${SIZE:-16384} --json "$OUT/tuning.jsonl"
    LIMIT=90 run python3 docs/scripts/ozaki_probe.py --sizes 16384,32768 --json "$OUT/ozaki.jsonl"
    [ -n "${FILES:-1}" ] && LIMIT=${FILES_LIMIT:-300} MPIEXEC="$MPI" run python3 \
        docs/scripts/files_case.py --size 24576 --dir /tmp/summa-files --ranks 1 \
        --device-memory 8GiB --json "$OUT/files.jsonl"
    rm -rf /tmp/summa-files
