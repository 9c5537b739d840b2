# STAGE=s17b docs/scripts/gpu_session.sh   (on branch panel-sums)
# fp64-int8's panel sums (SUMMA_FP64_INT8_SUMS=1: exponents over all of K, C folded once) on
# two ranks: the GPU tests, then bench against the per-panel folds, same call. On one GPU both
# ranks share it (the ratio counts, not the rates); on x2 and larger, every GPU
    export SUMMA_CACHE_DIR=$OUT/cache
    LIMIT=200 SUMMA_TEST_BACKEND=cupy run $MPI -np 2 python3 -m pytest -q -p no:cacheprovider \
        --with-mpi tests/test_gpu.py -k "panel_sums or fp64 or int8 or ozaki"
    P=$(python3 -c "import cupy; print(max(2, cupy.cuda.runtime.getDeviceCount()))")
    for sums in 0 1 0 1; do
        LIMIT=120 SUMMA_FP64_INT8_SUMS=$sums run $MPI -np $P python3 -m summa bench \
            --backend cupy --size 32768 --dtype float64 --precision fp64-int8 --check \
            --repeat 2 --no-ideal --json "$OUT/bench.jsonl"
    done
    bench_table "$OUT/bench.jsonl" ranks grid tflops check_residual
