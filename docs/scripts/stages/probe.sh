# STAGE=probe docs/scripts/gpu_session.sh
# issue 3/8: which cuBLAS each library loads, and whose one-GPU GEMM is faster
    export XLA_PYTHON_CLIENT_PREALLOCATE=false
    LIMIT=150 run python3 docs/scripts/cublas_probe.py
    lt=$(grep -a '^JAX_CUBLASLT=' "$OUT/session.log" | tail -1 | cut -d= -f2)
    # summa's GEMMs on JAX's own cuBLASLt (another CUDA release): is the release the gap?
    if [ -n "$lt" ]; then
        LIMIT=60 SUMMA_GEMM=cublaslt SUMMA_CUBLASLT=$lt run $MPI -np 2 python3 -m summa bench \
            --backend cupy --size 32768 --dtype float64 --check --repeat 3 --json "$OUT/probe.jsonl"
    fi
    XLA_FLAGS="--xla_dump_to=/tmp/xla --xla_dump_hlo_as_text" LIMIT=90 run python3 \
        docs/scripts/compare_peers.py --size 32768 --dtype float64 --gpus 2 --repeat 1 --peers jax
    run bash -c "grep -h -E 'custom-call|dot\\(' /tmp/xla/*jit*matmul*after_optimizations.txt \
        /tmp/xla/*after_optimizations.txt 2>/dev/null | grep -v threefry | cut -c1-600 | sort -u | head -20"
