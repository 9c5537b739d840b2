# STAGE=big7 docs/scripts/gpu_session.sh
# issue 5: N = 100,000 float64 in GPU memory with A's panels transposed (98.7-99.5
# TFLOP/s before; goal 100); one GPU host-resident float32 (0.915 before); the watchdog
# tests on 2 GPUs (never finished inside a shared call)
    LIMIT=150 run $MPI -np 2 python3 -m summa bench --backend cupy --size 100000 \
        --dtype float64 --check --repeat 1 --warmup 1 --no-ideal --timeout 60 \
        --json "$OUT/big7.jsonl" | grep -a -E "x 100000|rank   [01]"
    LIMIT=60 run python3 -m summa bench --backend cupy --size 32768 --dtype float32 \
        --out-of-core --check --repeat 2 --json "$OUT/big7.jsonl" \
        | grep -a -E "x 32768|efficiency|row-major|rank   0"
    TEST_FILES=tests/test_watchdog.py FILE_LIMIT=280 mpi_tests 2
