# STAGE=ooc docs/scripts/gpu_session.sh
# issue 5: host-resident runs, cuBLASXt, 100k
    for p in 1 2; do for d in float64 float32; do
        LIMIT=150 run $MPI -np $p python3 -m summa bench --backend cupy --size 32768 \
            --dtype $d --out-of-core --check --repeat 2 --timeout 60 --json "$OUT/ooc.jsonl"
        LIMIT=90 run python3 docs/scripts/compare_peers.py --size 32768 --dtype $d --gpus $p \
            --placement host --peers cublasxt --repeat 2 --json "$OUT/peers.jsonl"
    done; done
    hundred_k
