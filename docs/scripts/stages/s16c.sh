# STAGE=s16c docs/scripts/gpu_session.sh
# Issue 25 with cuBLASLt's INT8 products by default: the user's own call end to end
# (int8_first_call.py: summa.matmul(a, b, precision="fp64-int8") on pageable arrays, first and
# second call, empty cache of choices and kept, against float64 and the user's CuPy loop), on
# the whole GPU and with 24 GiB free; SUMMA out of core under 64 GiB (2 x 1 tiles, products
# over 2**42) and under 24 GiB with every tile product through cuBLASLt (cublaslt), in memory again
    LIMIT=200 run python3 docs/scripts/int8_first_call.py --size 32768 --json "$OUT/first.jsonl"
    LIMIT=200 run python3 docs/scripts/int8_first_call.py --size 32768 --free 24GiB \
        --json "$OUT/first.jsonl"
    export SUMMA_CACHE_DIR=$OUT/cache
    for args in "--out-of-core --device-memory 64GiB" "--out-of-core --device-memory 24GiB" ""; do
        for lib in auto ${args:+cublaslt}; do
            LIMIT=90 SUMMA_INT8_GEMM=$lib run python3 -m summa bench --backend cupy \
                --size 32768 --dtype float64 --precision fp64-int8 $args --check --repeat 2 \
                --no-ideal --json "$OUT/bench.jsonl"
        done
    done
    bench_table "$OUT/bench.jsonl" out_of_core tile tflops check_residual
    cat "$OUT/cache/cublaslt-int8.json"
