# STAGE=s27 docs/scripts/gpu_session.sh
# issue 27 on every GPU of a multi-GPU kind: the user's case from a plain process (the
# pool) against cuBLASXt on all GPUs, the same under mpirun (arrays on rank 0, node-shared),
# fp64-int8 on every GPU against one GPU's emulated rate
    P=$(python3 -c "import cupy; print(cupy.cuda.runtime.getDeviceCount())")
    LIMIT=400 run python3 docs/scripts/seed_case.py --sizes ${SIZES:-65536} --dtype float64 \
        --free 24GiB --peers cublasxt --json "$OUT/seed.jsonl"
    for arrays in root shared; do
        LIMIT=300 run $MPI -np $P python3 docs/scripts/seed_mpi.py --size ${SIZE:-65536} \
            --arrays $arrays --json "$OUT/seed.jsonl"
    done
    for np_ in 1 $P; do
        LIMIT=150 run $MPI -np $np_ python3 -m summa bench --backend cupy --size 65536 \
            --dtype float64 --precision fp64-int8 --check --repeat 2 --no-ideal \
            --json "$OUT/int8.jsonl"
    done
