# STAGE=s14c docs/scripts/gpu_session.sh
# session 14: float64 on INT8 out of core with its first panel whole and its strips at
# least 2048 rows (s14b: 40 products of 16384 x 32768 blocks, K from 256, strips of 256 rows),
# panel widths 4096 (the default), 8192 and 16384 under the user's 24 GiB, and 64 GiB
    LIMIT=300 run python3 docs/scripts/ozaki_ooc_probe.py --size 32768 --device-memory 64GiB \
        --device-memory 24GiB --device-memory 24GiB --device-memory 24GiB \
        --nb 16384,,8192,16384 --json "$OUT/ozaki_ooc.jsonl"
