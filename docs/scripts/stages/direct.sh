# STAGE=direct docs/scripts/gpu_session.sh
# issues 3, 8: auto = ipc direct copies; GPU tests, fp32 widths, the peers' tables
    LIMIT=200 run $MPI -np 2 python3 -m pytest -q -x --with-mpi tests/test_gpu.py tests/test_comm.py
    for nb in ${FP32_WIDTHS:-8192 16384}; do
        LIMIT=60 run $MPI -np 2 python3 -m summa bench --backend cupy --size 32768 \
            --dtype float32 --nb $nb --check --repeat 3 --timeout 60 --json "$OUT/direct.jsonl"
    done
    for size in ${SIZES:-16384 32768}; do
        for args in "--dtype float64" "--dtype float32 --precision tf32" "--dtype float16" \
                    "--dtype float32"; do
            LIMIT=${PEER_LIMIT:-150} run python3 docs/scripts/compare_peers.py --size $size \
                $args --gpus 2 --repeat 2 --peers summa,cupy,jax --peer-timeout 90 \
                --json "$OUT/peers.jsonl"
        done
    done
