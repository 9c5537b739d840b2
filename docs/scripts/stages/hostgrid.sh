# STAGE=hostgrid docs/scripts/gpu_session.sh
# issue 5: host-resident with uploads a step ahead (head/tail idle); issues 3, 8:
# the block's orientation (the model prefers 1x2), and short runs' warm-up (TF32 N = 16384:
# bench 489 against 635 inside compare_peers: clocks still ramping?)
    SUMMA_TEST_BACKEND=cupy LIMIT=60 run $MPI -np 2 python3 -m pytest -q -p no:cacheprovider \
        --with-mpi tests/test_gpu.py -k "partly or check_of_host" | tail -2
    for d in float64 float32; do
        LIMIT=100 run $MPI -np 2 python3 -m summa bench --backend cupy --size 32768 \
            --dtype $d --out-of-core --check --repeat 2 --timeout 60 --json "$OUT/ooc.jsonl"
    done
    for args in "--dtype float64 --grid 2x1" "--dtype float64 --grid 1x2" \
                "--dtype float32 --grid 2x1" "--dtype float32 --grid 1x2"; do
        LIMIT=60 run $MPI -np 2 python3 -m summa bench --backend cupy --size 32768 $args \
            --repeat 3 --json "$OUT/layout.jsonl"
    done
    for reps in "--warmup 1 --repeat 3" "--warmup 30 --repeat 10" "--warmup 1 --repeat 3"; do
        LIMIT=60 run $MPI -np 2 python3 -m summa bench --backend cupy --size 16384 \
            --dtype float32 --precision tf32 --comm nccl $reps --json "$OUT/warm.jsonl"
    done
