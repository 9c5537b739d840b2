# STAGE=s17i docs/scripts/gpu_session.sh
# ozaki_gpu's three raw kernels from one RawModule (one compilation; measured 7.50 s, within the
# 6.1-8.1 s of the code without it: not kept): fp64-int8 GPU tests and first_product_probe.py
    export SUMMA_CACHE_DIR=$OUT/cache
    LIMIT=100 run python3 docs/scripts/first_product_probe.py --json "$OUT/first.jsonl"
    LIMIT=120 SUMMA_TEST_BACKEND=cupy run python3 -m pytest -q -p no:cacheprovider --with-mpi \
        tests/test_gpu.py -k "fp64 or int8 or ozaki"
