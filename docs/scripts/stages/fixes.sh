# STAGE=fixes docs/scripts/gpu_session.sh
# issue 3/5: GPU tests of the newest code; the high-priority GEMM stream in one run
    for n in 1 2; do
        LIMIT=90 run $MPI -np $n python3 -m pytest -q --with-mpi tests/test_gpu.py \
            -k "cublaslt or out_of_core or priority or partly"
    done
    for prio in default high; do
        LIMIT=60 SUMMA_COMPUTE_PRIORITY=$prio run $MPI -np 2 python3 -m summa bench \
            --backend cupy --size 32768 --dtype float32 --repeat 3 --timeout 60 \
            --json "$OUT/fixes.jsonl"
    done
