# STAGE=s17g docs/scripts/gpu_session.sh
# Every GPU test after session 17's merges (algorithm's pipeline now takes a product hook): one
# rank, then two ranks sharing the GPU
    export SUMMA_CACHE_DIR=$OUT/cache
    for np_ in 1 2; do
        LIMIT=240 SUMMA_TEST_BACKEND=cupy run $MPI -np $np_ python3 -m pytest -q -p no:cacheprovider \
            --with-mpi tests/test_gpu.py
    done
