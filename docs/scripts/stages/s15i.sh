# STAGE=s15i docs/scripts/gpu_session.sh
# session 15, last call: SUMMA_INT8_GEMM=cublaslt choosing by timing each of cuBLASLt's first
# six INT8 candidates on the product's whole shape (remembered in SUMMA_CACHE_DIR), against
# gemmEx, in memory and out of core under 24 GiB, same call
    export SUMMA_CACHE_DIR=$OUT/cache
    for args in "" "--out-of-core --device-memory 24GiB"; do
        for int8 in "" cublaslt; do
            LIMIT=70 SUMMA_INT8_GEMM=$int8 run python3 -m summa bench --backend cupy \
                --size 32768 --dtype float64 --precision fp64-int8 $args --check --repeat 2 \
                --no-ideal --json "$OUT/bench.jsonl"
        done
    done
    bench_table "$OUT/bench.jsonl" out_of_core tile tflops check_residual
    cat "$OUT/cache/cublaslt-int8.json"
