# STAGE=s17a docs/scripts/gpu_session.sh
# After session 16's changes (cuBLASLt INT8 by default, K < 32 native, fp64-int8's C never one
# tile): every GPU test of tests/test_gpu.py; what a fresh
# process's first fp64-int8 product costs (first_product_probe.py: CuPy's compilation with an
# empty kernel cache and with it kept); bench in memory and out of core as the check of the
# default's rate
    export SUMMA_CACHE_DIR=$OUT/cache
    LIMIT=300 SUMMA_TEST_BACKEND=cupy run python3 -m pytest -q -p no:cacheprovider --with-mpi \
        tests/test_gpu.py
    LIMIT=120 run python3 docs/scripts/first_product_probe.py --json "$OUT/first.jsonl"
    for args in "" "--out-of-core --device-memory 24GiB"; do
        LIMIT=90 run python3 -m summa bench --backend cupy --size 32768 --dtype float64 \
            --precision fp64-int8 $args --check --repeat 2 --no-ideal --json "$OUT/bench.jsonl"
    done
    bench_table "$OUT/bench.jsonl" out_of_core tile tflops check_residual
