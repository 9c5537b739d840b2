# STAGE=oocipc docs/scripts/gpu_session.sh
# issue 5: host-resident panels passed on by copy engines (ipc) against NCCL; issue 8 rule
    for args in "--dtype float64 --comm ipc" "--dtype float32 --comm ipc" \
                "--dtype float32 --comm ipc --nb 8192"; do
        LIMIT=100 run $MPI -np 2 python3 -m summa bench --backend cupy --size 32768 $args \
            --out-of-core --check --repeat 2 --timeout 60 --json "$OUT/oocipc.jsonl"
    done
    for args in "--dtype float16" "--dtype float32 --precision tf32"; do  # auto's choice at 16384
        LIMIT=60 run $MPI -np 2 python3 -m summa bench --backend cupy --size 16384 $args \
            --check --repeat 3 --timeout 60 --json "$OUT/oocipc.jsonl"
    done
