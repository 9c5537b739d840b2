# STAGE=headline docs/scripts/gpu_session.sh
# issue 5's large cases, cuBLASXt on host data, JAX on device data
    hundred_k
    for d in float64 float32; do
        LIMIT=150 run $MPI -np 1 python3 -m summa bench --backend cupy --size 32768 \
            --dtype $d --out-of-core --check --repeat 2 --timeout 60 --json "$OUT/ooc.jsonl"
        for p in 1 2; do
            LIMIT=40 run python3 docs/scripts/compare_peers.py --size 32768 --dtype $d \
                --gpus $p --placement host --peers cublasxt --repeat 2 --json "$OUT/peers.jsonl"
        done
    done
    for args in "--dtype float64" "--dtype float32" "--dtype float32 --precision tf32" \
                "--dtype float16"; do
        LIMIT=45 run python3 docs/scripts/compare_peers.py --size 32768 $args --gpus 2 \
            --repeat 2 --peers cupy,jax --json "$OUT/peers.jsonl"
    done
