# STAGE=ownfirst docs/scripts/gpu_session.sh
# issues 3, 8: own panels first under NCCL (small N) against ipc (~6 min)
    for args in "--size 16384 --dtype float32 --precision tf32" "--size 16384 --dtype float32" \
                "--size 16384 --dtype float64" "--size 8192 --dtype float64" \
                "--size 32768 --dtype float32 --nb 16384"; do
        for comm in nccl ipc; do
            LIMIT=60 run $MPI -np 2 python3 -m summa bench --backend cupy $args --comm $comm \
                --check --repeat 3 --timeout 60 --json "$OUT/ownfirst.jsonl"
        done
    done
    # the common order (lookahead 0: no overlap at all) as the floor
    LIMIT=60 run $MPI -np 2 python3 -m summa bench --backend cupy --size 16384 --dtype float32 \
        --precision tf32 --comm nccl --lookahead 0 --repeat 3 --json "$OUT/ownfirst.jsonl"
    export XLA_PYTHON_CLIENT_PREALLOCATE=false
    LIMIT=150 run python3 docs/scripts/compare_peers.py --size 16384 --dtype float32 \
        --precision tf32 --gpus 2 --repeat 2 --rounds 2 --peers summa,cupy,jax \
        --json "$OUT/peers.jsonl"
