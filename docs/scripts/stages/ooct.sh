# STAGE=ooct docs/scripts/gpu_session.sh
# issue 5: host-resident with A's parts transposed on the device, against without
    SUMMA_TEST_BACKEND=cupy LIMIT=70 run $MPI -np 2 python3 -m pytest -q -p no:cacheprovider \
        --with-mpi tests/test_gpu.py -k "out_of_core" | tail -1
    for d in float64 float32; do for setting in auto no; do
        echo "SUMMA_TRANSPOSE_A=$setting $d"
        LIMIT=75 run $MPI -x SUMMA_TRANSPOSE_A=$setting -np 2 python3 -m summa bench \
            --backend cupy --size 32768 --dtype $d --out-of-core --check --repeat 2 \
            --timeout 60 --json "$OUT/ooct.jsonl" | grep -a -E "x 32768|rank   [01]|efficiency|row-major"
    done; done
