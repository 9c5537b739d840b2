# STAGE=transpose2 docs/scripts/gpu_session.sh
# one GPU with A's panels transposed; the peers in every dtype (TF32 and float16
# keep A row-major: layout_probe.py measured a column-major A slower there)
    for d in float64 float32; do
        LIMIT=60 run python3 -m summa bench --backend cupy --size 32768 --dtype $d --check \
            --repeat 3 --json "$OUT/transpose.jsonl" | grep -a -E "x 32768|rank   0|efficiency"
    done
    LIMIT=130 run python3 docs/scripts/compare_peers.py --size 32768 --dtype float32 --gpus 2 \
        --repeat 3 --rounds 2 --peers summa,nvmath,jax --json "$OUT/peers.jsonl"
    for args in "--dtype float32 --precision tf32" "--dtype float16"; do
        LIMIT=70 run python3 docs/scripts/compare_peers.py --size 32768 $args --gpus 2 \
            --repeat 3 --rounds 2 --peers summa,jax --json "$OUT/peers.jsonl"
    done
