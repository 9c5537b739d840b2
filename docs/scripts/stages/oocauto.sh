# STAGE=oocauto docs/scripts/gpu_session.sh
# issue 5: auto now takes copy engines (ipc) out of core within a node (oocvar:
# 102.9 against NCCL's 98.6 in float64): GPU tests, then auto against --comm nccl
    SUMMA_TEST_BACKEND=cupy LIMIT=120 run $MPI -np 2 python3 -m pytest -q -p no:cacheprovider \
        --with-mpi tests/test_gpu.py -k "out_of_core" | tail -1
    for d in float64 float32; do for c in auto nccl; do
        echo "== $d --comm $c"
        LIMIT=75 run $MPI -np 2 python3 -m summa bench --backend cupy --size 32768 --dtype $d \
            --out-of-core --comm $c --check --repeat 2 --timeout 60 --json "$OUT/oocauto.jsonl" \
            | grep -a -E "x 32768|summa bench|efficiency|row-major|memory plan|rank   [01]"
    done; done
    echo "== float64 --grid 1x2"
    LIMIT=75 run $MPI -np 2 python3 -m summa bench --backend cupy --size 32768 --grid 1x2 \
        --out-of-core --check --repeat 2 --timeout 60 --no-ideal --json "$OUT/oocauto.jsonl" \
        | grep -a -E "x 32768|summa bench|rank   [01]"
