# STAGE=final8 docs/scripts/gpu_session.sh
# issues 5, 8: host-resident summa (auto: ipc) against cuBLASXt on the same pinned
# arrays; TF32 and float16 against JAX in three alternating rounds (1-3 % apart by call)
    for d in float64 float32; do
        LIMIT=120 run python3 docs/scripts/compare_peers.py --size 32768 --dtype $d --gpus 2 \
            --placement host --peers summa,cublasxt --repeat 2 --rounds 2 --json "$OUT/peers.jsonl"
    done
    for args in "--dtype float32 --precision tf32" "--dtype float16"; do
        LIMIT=110 run python3 docs/scripts/compare_peers.py --size 32768 $args --gpus 2 \
            --repeat 3 --rounds 3 --peers summa,jax --json "$OUT/peers.jsonl"
    done
