# STAGE=seed docs/scripts/gpu_session.sh
# issue 22: staged host copies tested, their rates, then the user's case end to end
    for n in ${RANKS-1 2}; do
        SUMMA_TEST_BACKEND=cupy SUMMA_SWEEP_CASES=${CASES:-100} SUMMA_SWEEP_RECORD=$OUT/sweep.jsonl \
            LIMIT=150 run $MPI -np $n python3 -m pytest -q --with-mpi -m mpi -p no:cacheprovider \
            tests/test_sweep.py tests/test_gpu.py tests/test_strips.py tests/test_multiply.py \
            -k "sweep or stream or out_of_core or strips or numpy_arrays"
    done
    LIMIT=60 run python3 -m pytest -q -p no:cacheprovider tests/test_staging.py tests/test_multiply.py
    [ -n "${PROBE:-}" ] && LIMIT=90 run python3 docs/scripts/host_copy_probe.py --gib 4 \
        --threads ${THREADS:-1,4,8,16}
    [ -n "${PROFILE:-}" ] && LIMIT=60 run python3 docs/scripts/host_copy_probe.py --profile 16384
    LIMIT=300 run python3 docs/scripts/seed_case.py --sizes ${SIZES:-16384,40960} --dtype float64 \
        --free 24GiB --modes ${MODES:-stage} --json "$OUT/seed.jsonl"
    [ -n "${F32:-57344}" ] && LIMIT=200 run python3 docs/scripts/seed_case.py --sizes ${F32:-57344} \
        --dtype float32 --free 24GiB --peers "${F32_PEERS:-cublasxt}" --json "$OUT/seed.jsonl"
