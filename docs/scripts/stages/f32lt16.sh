# STAGE=f32lt16 docs/scripts/gpu_session.sh
# issue 8: float32 at N = 16384 trails cuBLASMp by 3 % (102.1 / 105.3): summa's
# GEMMs take 84.8 ms against 82 ms as one GEMM. Is cuBLASLt's timed float32 GEMM faster
# at these shapes (one GPU: cupy.matmul against nvmath's autotuned cuBLASLt), and summa
# with SUMMA_GEMM=cublaslt? Alternating, two rounds.
    LIMIT=120 run python3 docs/scripts/compare_peers.py --size 16384 --dtype float32 --gpus 1 \
        --peers cupy,nvmathlt --repeat 5 --rounds 3 --json "$OUT/f32lt16.jsonl"
    for lib in cublas cublaslt cublaslt cublas; do
        echo "SUMMA_GEMM=$lib"
        LIMIT=50 run $MPI -x SUMMA_GEMM=$lib -np 2 python3 -m summa bench --backend cupy \
            --size 16384 --dtype float32 --repeat 5 --timeout 60 --json "$OUT/f32lt16-bench.jsonl" \
            | grep -a -E "x 16384|rank   [01]|efficiency"
    done
