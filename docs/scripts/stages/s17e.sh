# STAGE=s17e docs/scripts/gpu_session.sh
# After merging fused-exponents and panel sums (in memory on a grid, the default): the fp64-int8
# GPU tests on one and two ranks, then bench on two ranks (one GPU shared: the ratio counts)
# with a fold a panel (SUMMA_FP64_INT8_SUMS=0) against the default, panels of 16384 and 4096
    export SUMMA_CACHE_DIR=$OUT/cache
    for np_ in 1 2; do
        LIMIT=150 SUMMA_TEST_BACKEND=cupy run $MPI -np $np_ python3 -m pytest -q -p no:cacheprovider \
            --with-mpi tests/test_gpu.py -k "fp64 or int8 or ozaki or grid"
    done
    for nb in 4096 16384; do
        for sums in 0 1; do
            LIMIT=100 SUMMA_FP64_INT8_SUMS=$sums run $MPI -np 2 python3 -m summa bench \
                --backend cupy --size 32768 --dtype float64 --precision fp64-int8 --nb $nb --check \
                --repeat 2 --no-ideal --json "$OUT/bench.jsonl"
        done
    done
    bench_table "$OUT/bench.jsonl" ranks nb tflops check_residual
    LIMIT=120 run python3 docs/scripts/panel_sums_probe.py --m 16384 --n 16384 --w 4096 --repeat 2 --json "$OUT/probe.jsonl"
