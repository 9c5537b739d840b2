# STAGE=why16 docs/scripts/gpu_session.sh
# issue 8: where the time goes at N = 16384 (knobs16: float32 ipc nb 8192 0.954 of
# the ideal, float64 0.921, TF32 NCCL 0.80): the rank lines, other schedules and grids
    for args in "float32" "float32 --schedule strips" "float32 --grid 1x2" \
                "float32 --lookahead 2" "float64" "float64 --schedule strips" \
                "float64 --grid 1x2" "float32 --precision tf32" \
                "float32 --precision tf32 --schedule strips" "float32 --precision tf32 --grid 1x2" \
                "float32 --precision tf32 --lookahead 0" "float16"; do
        echo "== $args"
        LIMIT=60 run $MPI -np 2 python3 -m summa bench --backend cupy --size 16384 --dtype $args \
            --repeat 5 --timeout 30 --json "$OUT/why16.jsonl" \
            | grep -a -E "x 16384|efficiency|row-major|rank   [01]"
    done
