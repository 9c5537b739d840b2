# STAGE=s16e docs/scripts/gpu_session.sh
# fp64-int8's C never one tile out of core (2 x 1 where all of it fits): bench under 110 GiB
# and the user's call end to end on the whole GPU (int8_first_call.py), against float64
    export SUMMA_CACHE_DIR=$OUT/cache
    LIMIT=90 run python3 -m summa bench --backend cupy --size 32768 --dtype float64 \
        --precision fp64-int8 --out-of-core --device-memory 110GiB --check --repeat 2 \
        --no-ideal --json "$OUT/bench.jsonl"
    LIMIT=200 run python3 docs/scripts/int8_first_call.py --size 32768 --json "$OUT/first.jsonl"
    bench_table "$OUT/bench.jsonl" nb tile tflops check_residual
