# STAGE=s15g docs/scripts/gpu_session.sh
# session 15, fifth call: the planner's fp64-int8 cuts again without its own 0.2 s (s15f: the
# plan asked the moduli count ~1000 times, now cached), cuBLASLt's INT8 candidates 1 and 5
# taken by index (s15a: 1.29 and 1.28 POPS back to back, gemmEx 1.00; timing a quarter of the
# product picked the first, fastest in short runs, s15f), complex128 on INT8 against ZGEMM
    LIMIT=150 run python3 docs/scripts/ozaki_probe.py --sizes 32768 --moduli auto --repeat 2 \
        --variants "SUMMA_INT8_GEMM=cublaslt:1;SUMMA_INT8_GEMM=cublaslt:5" \
        --json "$OUT/ozaki.jsonl"
    for memory in 24GiB 16GiB; do
        LIMIT=70 run python3 -m summa bench --backend cupy --size 32768 --dtype float64 \
            --precision fp64-int8 --out-of-core --device-memory $memory --check --repeat 2 \
            --no-ideal --json "$OUT/bench.jsonl"
    done
    for precision in default fp64-int8; do
        LIMIT=60 run python3 -m summa bench --backend cupy --size 16384 --dtype complex128 \
            --precision $precision --check --repeat 2 --no-ideal --json "$OUT/bench.jsonl"
    done
    bench_table "$OUT/bench.jsonl" dtype out_of_core nb tile tflops check_residual
