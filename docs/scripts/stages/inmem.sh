# STAGE=inmem docs/scripts/gpu_session.sh
# issue 3: 32768 fp64/fp32/tf32 on 2 GPUs
    for args in "--dtype float64" "--dtype float32" "--dtype float32 --precision tf32"; do
        run $MPI -np 2 python3 -m summa bench --backend cupy --size 32768 $args --check \
            --repeat 3 --timeout 90 --json "$OUT/inmem.jsonl"
    done
