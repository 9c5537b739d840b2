# STAGE=oocfix docs/scripts/gpu_session.sh
# the ipc push broadcasts' refill race out of core: GPU tests and the float64 run
    LIMIT=150 run $MPI -np 2 python3 -m pytest -q -p no:cacheprovider --with-mpi tests/test_gpu.py \
        -k "out_of_core or every_comm"
    LIMIT=100 run $MPI -np 2 python3 -m summa bench --backend cupy --size 32768 --dtype float64 \
        --comm ipc --out-of-core --check --repeat 2 --timeout 60 --json "$OUT/oocipc.jsonl"
