# STAGE=tests docs/scripts/gpu_session.sh
# suite on the CuPy backend, 1 and 2 ranks
    ranks=${TEST_RANKS:-1 2}  # "1" on a one-GPU machine
    SUMMA_TEST_BACKEND=cupy TEST_RANKS="$ranks" SUMMA_PYTHON=python3 MPIEXEC="$MPI" ./run test \
        > "$OUT/tests.log" 2>&1; echo "tests rc=$?"; grep -a -E "passed|failed" "$OUT/tests.log"
    run $MPI -np "${ranks##* }" python3 -m summa bench --backend cupy --check \
        --json "$OUT/bench.jsonl"
