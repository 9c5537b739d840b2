# STAGE=s16a docs/scripts/gpu_session.sh
# next session's first one-GPU call (issue 25's last goal): cuBLASLt's INT8 products, whose
# timed choice ran the in-memory product at 77.2 TFLOP/s against gemmEx's 61.6 but lost on
# out-of-core tiles (55.9 against 59.5, s15i). The GPU tests (a 32768 x 32768 output through
# it, bit for bit), then it against gemmEx on the bare product and through SUMMA in memory and
# out of core, same call, its candidates timed in 200 ms bursts (SUMMA_INT8_LT_BURST_MS: the
# short timings misranked them under the power cap); the cache of choices comes back
    export SUMMA_CACHE_DIR=$OUT/cache
    LIMIT=120 SUMMA_TEST_BACKEND=cupy run python3 -m pytest -q -p no:cacheprovider --with-mpi \
        tests/test_gpu.py -k "cublaslt or int8 or ozaki or fp64"
    LIMIT=120 run python3 docs/scripts/ozaki_probe.py --sizes 32768 --moduli auto --repeat 2 \
        --variants "SUMMA_INT8_GEMM=cublaslt;SUMMA_INT8_GEMM=cublaslt,SUMMA_INT8_LT_BURST_MS=200" \
        --json "$OUT/ozaki.jsonl"
    for args in "" "--out-of-core --device-memory 24GiB"; do
        for burst in "" 200; do  # "": gemmEx
            LIMIT=90 SUMMA_INT8_GEMM=${burst:+cublaslt} SUMMA_INT8_LT_BURST_MS=$burst \
                run python3 -m summa bench --backend cupy \
                --size 32768 --dtype float64 --precision fp64-int8 $args --check --repeat 2 \
                --no-ideal --json "$OUT/bench.jsonl"
        done
    done
    bench_table "$OUT/bench.jsonl" out_of_core tile tflops check_residual
    cat "$OUT/cache/cublaslt-int8.json"
