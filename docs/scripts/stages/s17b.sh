# STAGE=s17b docs/scripts/gpu_session.sh   (on branch panel-sums)
# (its out-of-core panel sums measured slower here and were not merged; in memory on a grid they are the default since s17d)
# fp64-int8's panel sums (SUMMA_FP64_INT8_SUMS=1: the panels' INT8 products summed in int32,
# C folded once): the GPU tests (one rank: out of core, with a tile redone; two ranks: in memory,
# exponents over all of K), then bench out of core on one GPU under 110, 64 and 24 GiB and in
# memory on two ranks, each against per-panel folds in the same call (two ranks on one GPU share
# it: the ratio counts, not the rate)
    export SUMMA_CACHE_DIR=$OUT/cache
    LIMIT=200 SUMMA_TEST_BACKEND=cupy run python3 -m pytest -q -p no:cacheprovider --with-mpi \
        tests/test_gpu.py -k "panel_sums or fp64 or int8 or ozaki"
    LIMIT=200 SUMMA_TEST_BACKEND=cupy run $MPI -np 2 python3 -m pytest -q -p no:cacheprovider \
        --with-mpi tests/test_gpu.py -k "panel_sums"
    for mem in 110GiB 64GiB 24GiB; do
        for sums in 0 1; do
            LIMIT=90 SUMMA_FP64_INT8_SUMS=$sums run python3 -m summa bench --backend cupy \
                --size 32768 --dtype float64 --precision fp64-int8 --out-of-core \
                --device-memory $mem --check --repeat 2 --no-ideal --json "$OUT/bench.jsonl"
        done
    done
    P=$(python3 -c "import cupy; print(max(2, cupy.cuda.runtime.getDeviceCount()))")
    for sums in 0 1; do
        LIMIT=120 SUMMA_FP64_INT8_SUMS=$sums run $MPI -np $P python3 -m summa bench \
            --backend cupy --size 32768 --dtype float64 --precision fp64-int8 --check \
            --repeat 2 --no-ideal --json "$OUT/bench.jsonl"
    done
    bench_table "$OUT/bench.jsonl" ranks out_of_core tile tflops check_residual
