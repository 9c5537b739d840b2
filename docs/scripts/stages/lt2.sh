# STAGE=lt2 docs/scripts/gpu_session.sh
# issues 3, 8: TF32 and float16 trail JAX by 1.5 / 0.2 %; JAX calls cuBLASLt, whose
# TF32 GEMM timed 344 against gemmEx's 324 TFLOP/s (evening session): the library per dtype?
    for args in "--dtype float32 --precision tf32" "--dtype float16"; do
        for lib in cublas cublaslt; do
            echo "SUMMA_GEMM=$lib $args"
            LIMIT=50 run $MPI -x SUMMA_GEMM=$lib -np 2 python3 -m summa bench --backend cupy \
                --size 32768 $args --check --repeat 3 --timeout 60 --json "$OUT/lt2.jsonl" \
                | grep -a -E "x 32768|rank   [01]|efficiency"
        done
        LIMIT=70 run env SUMMA_GEMM=cublaslt python3 docs/scripts/compare_peers.py \
            --size 32768 $args --gpus 2 --repeat 3 --rounds 2 --peers summa,jax \
            --json "$OUT/peers.jsonl"
    done
