# STAGE=peers16 docs/scripts/gpu_session.sh
# issue 8: N = 16384 against JAX and cuBLASMp, last measured before A's panels were
# transposed (float32 96.9 against JAX's 99.7); alternating rounds, every dtype (~8 min)
    for args in "--dtype float64" "--dtype float32" "--dtype float32 --precision tf32" \
                "--dtype float16"; do
        peers=summa,jax; case "$args" in *tf32*|*float16*) ;; *) peers=summa,jax,nvmath ;; esac
        LIMIT=120 run python3 docs/scripts/compare_peers.py --size 16384 $args --gpus 2 \
            --repeat 3 --rounds 3 --peers $peers --peer-timeout 60 --json "$OUT/peers16.jsonl"
    done
