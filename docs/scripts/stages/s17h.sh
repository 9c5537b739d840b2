# STAGE=s17h docs/scripts/gpu_session.sh
# s17g's two-rank run again without the one test that aborted it (ipc's choice between two ranks
# sharing one GPU: auto picked mpi there; on two GPUs it had passed), so the rest of them run
    export SUMMA_CACHE_DIR=$OUT/cache
    LIMIT=260 SUMMA_TEST_BACKEND=cupy run $MPI -np 2 python3 -m pytest -q -p no:cacheprovider \
        --with-mpi tests/test_gpu.py \
        --deselect tests/test_gpu.py::test_auto_keeps_small_blocks_open_between_multiplies
