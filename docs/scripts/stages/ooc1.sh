# STAGE=ooc1 docs/scripts/gpu_session.sh
# issue 5: one GPU, host-resident, N = 32768
    for d in float64 float32; do
        LIMIT=150 run $MPI -np 1 python3 -m summa bench --backend cupy --size 32768 \
            --dtype $d --out-of-core --check --repeat 2 --timeout 60 --json "$OUT/ooc.jsonl"
    done
