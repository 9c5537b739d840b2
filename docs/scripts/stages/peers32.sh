# STAGE=peers32 docs/scripts/gpu_session.sh
# issue 8: N = 32768 against JAX after blocks stay open (1 GiB float32, 2 GiB
# float64: within 1/64 of an H200), two alternating rounds per dtype (~5 min)
    for args in "--dtype float32 --precision tf32" "--dtype float16" "--dtype float32" \
                "--dtype float64"; do
        LIMIT=120 run python3 docs/scripts/compare_peers.py --size 32768 $args --gpus 2 \
            --repeat 2 --rounds 2 --peers summa,jax --peer-timeout 60 --json "$OUT/peers32.jsonl"
    done
