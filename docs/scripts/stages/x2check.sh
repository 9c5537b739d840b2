# STAGE=x2check docs/scripts/gpu_session.sh
# 2 GPUs: the MPI tests on CuPy, ipc's open cost, host-resident runs against cuBLASXt
    mpi_tests 2
    LIMIT=60 run $MPI -np 2 python3 docs/scripts/ipc_open_probe.py
    for d in float64 float32; do
        LIMIT=100 run $MPI -np 2 python3 -m summa bench --backend cupy --size 32768 \
            --dtype $d --out-of-core --check --repeat 2 --timeout 60 --json "$OUT/ooc.jsonl"
        LIMIT=60 run python3 docs/scripts/compare_peers.py --size 32768 --dtype $d --gpus 2 \
            --placement host --peers cublasxt --repeat 2 --json "$OUT/peers.jsonl"
    done
