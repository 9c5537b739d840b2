# STAGE=s14f docs/scripts/gpu_session.sh
# session 14: variants of the fp64-int8 folds (two columns a thread, the constants in
# registers), swapped into the bare product at N = 32768 in turns, bits checked
    LIMIT=150 run python3 docs/scripts/fold_probe.py --size 32768 --rounds 2 \
        --json "$OUT/fold.jsonl"
