# STAGE=s14h docs/scripts/gpu_session.sh
# session 14: INT8 "TN" GEMMs through cuBLASLt's algorithms against gemmEx (issue 25's open
# probe), alone and 16 back to back as one float64 product makes them; then the bare
# product against cuBLAS's emulation, each one's distance from the 16-moduli product
    LIMIT=90 run python3 docs/scripts/int8_lt_probe.py --sizes 32768 --candidates 8 \
        --json "$OUT/int8_lt.jsonl"
    # and how close cuBLAS's emulation comes to summa's 16-moduli product (and the default's,
    # 15 since session 15)
    LIMIT=90 run python3 docs/scripts/ozaki_probe.py --sizes 32768 --moduli auto,16 --repeat 2 \
        --json "$OUT/ozaki.jsonl"
