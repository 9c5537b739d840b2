# STAGE=s27b docs/scripts/gpu_session.sh
# issue 27, second call: the same call under mpirun -np P (unbound), arrays on rank 0 read
# in place, node-shared, on rank 0 copied into node-shared memory (SUMMA_IN_PLACE=0), and
# the pool again with copies: within 5 % of each other?
    P=$(python3 -c "import cupy; print(cupy.cuda.runtime.getDeviceCount())")
    for arrays in root shared; do
        LIMIT=150 run $MPI -np $P python3 docs/scripts/seed_mpi.py --size ${SIZE:-65536} \
            --arrays $arrays --json "$OUT/seed.jsonl"
    done
    LIMIT=150 SUMMA_IN_PLACE=0 run $MPI -np $P -x SUMMA_IN_PLACE python3 \
        docs/scripts/seed_mpi.py --size ${SIZE:-65536} --arrays root --json "$OUT/seed_copies.jsonl"
    LIMIT=150 SUMMA_IN_PLACE=0 run python3 docs/scripts/seed_case.py --sizes ${SIZE:-65536} \
        --dtype float64 --free 24GiB --peers "" --json "$OUT/seed_copies.jsonl"
