# STAGE=s14h docs/scripts/gpu_session.sh
# session 14: INT8 "TN" GEMMs through cuBLASLt's algorithms against gemmEx (issue 25's open
# probe), alone and 16 back to back as one float64 product makes them
    LIMIT=90 run python3 docs/scripts/int8_lt_probe.py --sizes 32768 --candidates 8 \
        --json "$OUT/int8_lt.jsonl"
