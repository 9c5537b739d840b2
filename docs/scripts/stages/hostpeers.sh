# STAGE=hostpeers docs/scripts/gpu_session.sh
# issues 5, 8: host-resident summa against cuBLASXt on 1 and 2 GPUs in the same
# call (1 GPU last compared before A's parts were transposed); float64 was 1.24x on 2 GPUs
    for g in 1 2; do for d in float64 float32; do  # one GPU float64: ~150 s (3 rounds)
        LIMIT=$((g == 1 ? 240 : 150)) run python3 docs/scripts/compare_peers.py --size 32768 --dtype $d --gpus $g \
            --placement host --peers summa,cublasxt --repeat 2 --rounds 3 --json "$OUT/hostpeers.jsonl"
    done; done
