# STAGE=s16d docs/scripts/gpu_session.sh
# fp64-int8 out of core with whole-K panels (--nb 32768: one product per tile, its folds and
# residues once, the product at the bare rate's shape) against the planner's 16384-wide ones,
# under 110, 64 and 24 GiB; the user's call end to end with 24 GiB free
    export SUMMA_CACHE_DIR=$OUT/cache
    ooc() {  # TILES MEMORY NB
        LIMIT=90 SUMMA_OOC_TILES=$1 run python3 -m summa bench --backend cupy --size 32768 \
            --dtype float64 --precision fp64-int8 --out-of-core --device-memory $2 ${3:+--nb $3} \
            --check --repeat 2 --no-ideal --json "$OUT/bench.jsonl"
    }
    ooc "" 110GiB
    ooc "" 110GiB 32768
    ooc 4x1 110GiB 32768
    ooc "" 64GiB 32768
    ooc 4x1 64GiB 32768
    ooc "" 24GiB 32768
    LIMIT=200 run python3 docs/scripts/int8_first_call.py --size 32768 --free 24GiB \
        --json "$OUT/first.jsonl"
    bench_table "$OUT/bench.jsonl" nb tile tflops check_residual
