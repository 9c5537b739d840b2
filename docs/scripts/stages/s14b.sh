# STAGE=s14b docs/scripts/gpu_session.sh
# session 14: the user's call in the process on this host against the code of 614e314
# (before session 13's in-place reads; a checkout under s14old/, when there is one), by
# turns; then where float64 on INT8 loses its rate out of core (every product of the sweep
# timed on the GPU)
    for turn in 1 2; do
        LIMIT=60 run python3 docs/scripts/seed_case.py --sizes 16384 --dtype float64 \
            --free 24GiB --peers "" --json "$OUT/seed.jsonl"
        [ -d s14old ] && (cd s14old && LIMIT=60 PYTHONPATH=$PWD:${PYTHONPATH#*:} run python3 \
            docs/scripts/seed_case.py --sizes 16384 --dtype float64 --free 24GiB --peers "" \
            --json "$OUT/seed_old.jsonl")
    done
    LIMIT=200 run python3 docs/scripts/ozaki_ooc_probe.py --size 32768 --device-memory 64GiB \
        --device-memory 24GiB --nb 16384, --json "$OUT/ozaki_ooc.jsonl"
