# STAGE=s17d docs/scripts/gpu_session.sh   (on branch panel-sums, after the fix of s17b's crash)
# fp64-int8 panel sums in memory on a grid of two ranks (one GPU shared: the ratio counts, not
# the rate): the two-rank GPU test, then bench SUMS=0 against SUMS=1 with panels of 16384 and 4096
    export SUMMA_CACHE_DIR=$OUT/cache
    LIMIT=150 SUMMA_TEST_BACKEND=cupy run $MPI -np 2 python3 -m pytest -q -p no:cacheprovider \
        --with-mpi tests/test_gpu.py -k "panel_sums"
    for nb in 16384 4096; do
        for sums in 0 1; do
            LIMIT=100 SUMMA_FP64_INT8_SUMS=$sums run $MPI -np 2 python3 -m summa bench \
                --backend cupy --size 32768 --dtype float64 --precision fp64-int8 --nb $nb --check \
                --repeat 2 --no-ideal --json "$OUT/bench.jsonl"
        done
    done
    bench_table "$OUT/bench.jsonl" ranks nb tflops check_residual
