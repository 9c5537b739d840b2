# STAGE=data docs/scripts/gpu_session.sh
# issue 3/8: does the GEMM rate depend on the values multiplied (power, clocks)?
    for data in uniform uniform01 normal; do
        LIMIT=60 run python3 docs/scripts/compare_peers.py --size 32768 --dtype float64 \
            --gpus 1 --repeat 2 --peers cupy --data $data --json "$OUT/data.jsonl"
    done
    for data in uniform uniform01; do
        LIMIT=90 run python3 docs/scripts/compare_peers.py --size 32768 --dtype float64 \
            --gpus 2 --repeat 2 --peers jax --data $data --json "$OUT/data.jsonl"
    done
