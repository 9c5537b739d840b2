# STAGE=lt docs/scripts/gpu_session.sh
# issue 3: cuBLASLt's timed algorithm choice against gemmEx, 2 GPUs, N = 32768
    for n in 1 2; do
        LIMIT=120 run $MPI -np $n python3 -m pytest -q -x --with-mpi tests/test_gpu.py \
            -k "cublaslt or out_of_core or priority"
    done
    LIMIT=60 run $MPI -np 2 python3 -m summa bench --backend cupy --size 32768 --dtype float16 \
        --nb 4096 --repeat 3 --timeout 60 --json "$OUT/lt.jsonl"  # the old float16 default
    for args in "--dtype float64" "--dtype float32 --precision tf32"; do  # one GPU's GEMM
        LIMIT=90 run python3 docs/scripts/compare_peers.py --size 32768 $args --gpus 1 \
            --repeat 2 --peers cupy,nvmathlt --json "$OUT/peers.jsonl"
    done
    for la in 1 2; do  # GEMMs first on the SMs, NCCL in the gaps: does it beat sharing?
        LIMIT=60 SUMMA_COMPUTE_PRIORITY=high run $MPI -np 2 python3 -m summa bench \
            --backend cupy --size 32768 --dtype float32 --lookahead $la --repeat 3 \
            --timeout 60 --json "$OUT/lt.jsonl"
    done
    for args in "--dtype float64" "--dtype float32 --precision tf32" "--dtype float16"; do
        for lib in cublas cublaslt; do
            LIMIT=60 SUMMA_GEMM=$lib run $MPI -np 2 python3 -m summa bench --backend cupy \
                --size 32768 $args --check --repeat 3 --timeout 60 --json "$OUT/lt.jsonl"
        done
    done
