# STAGE=peers docs/scripts/gpu_session.sh
# issue 8: one table per dtype, every peer on the same GPUs and the same data
    for args in "--dtype float64" "--dtype float32 --precision tf32" "--dtype float16" \
                "--dtype float32"; do
        LIMIT=${PEER_LIMIT:-150} run python3 docs/scripts/compare_peers.py --size ${SIZE:-32768} \
            $args --gpus 2 --repeat 2 --peers summa,cupy,jax,dask,nvmath --peer-timeout ${PEER_TIMEOUT:-90} \
            --json "$OUT/peers.jsonl"
    done
