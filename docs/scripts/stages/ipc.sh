# STAGE=ipc docs/scripts/gpu_session.sh
# issue 3: copy-engine panels read straight from the roots' blocks, against NCCL
    for n in 1 2; do
        LIMIT=120 run $MPI -np $n python3 -m pytest -q -x --with-mpi tests/test_gpu.py \
            tests/test_comm.py -k "ipc or reference"
    done
    for args in "--dtype float32" "--dtype float32 --precision tf32" "--dtype float64" \
                "--dtype float16"; do
        for comm in nccl ipc; do
            run $MPI -np 2 python3 -m summa bench --backend cupy --size 32768 $args \
                --comm $comm --check --repeat 3 --timeout 90 --json "$OUT/ipc.jsonl"
        done
    done
    python3 -c "import json,sys; [print(r['comm'], r['dtype'], r['precision'], r['nb'], round(r['tflops'],1), round(r['efficiency'],3), [(d.get('connect_seconds'), d.get('release_seconds'), round(d['wait'],4)) for d in r['ranks_detail']]) for r in map(json.loads, open(sys.argv[1]))]" "$OUT/ipc.jsonl"
