# STAGE=s17c docs/scripts/gpu_session.sh   (on branch panel-sums)
# Why panel sums made fp64-int8 out of core slower in s17b: one tile's time, on the device with no
# transfers, per-panel folds against panel sums, and the parts (panel_sums_probe.py)
    export SUMMA_CACHE_DIR=$OUT/cache
    LIMIT=150 run python3 docs/scripts/panel_sums_probe.py --w 16384 --json "$OUT/probe.jsonl"
    LIMIT=150 run python3 docs/scripts/panel_sums_probe.py --m 10923 --n 10923 --w 16384 --repeat 2 --json "$OUT/probe.jsonl"
