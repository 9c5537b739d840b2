# STAGE=sweep docs/scripts/gpu_session.sh
# issue 21: the randomized sweep and schedule x broadcaster x lookahead tests on
# 1, 2, 3 ranks (sharing the GPUs where there are fewer), then the commands
    for n in ${RANKS:-1 2 3}; do
        SUMMA_TEST_BACKEND=cupy SUMMA_SWEEP_CASES=${CASES:-300} SUMMA_SWEEP_RECORD=$OUT/sweep.jsonl \
            LIMIT=${SWEEP_LIMIT:-240} run $MPI -np $n python3 -m pytest -q --with-mpi -m mpi \
            -p no:cacheprovider tests/test_sweep.py tests/test_gpu.py tests/test_strips.py \
            -k "sweep or schedule_broadcaster or strips"
    done
    LIMIT=60 run $MPI -np 3 python3 -m summa bench --backend cupy --size 2000 --schedule strips --check
    LIMIT=60 run $MPI -np 3 python3 -m summa bench --backend cupy --m 29 --n 105 --k 14 \
        --schedule strips --nb 175 --check
    cat "$OUT/sweep.jsonl"
