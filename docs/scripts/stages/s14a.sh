# STAGE=s14a docs/scripts/gpu_session.sh
# session 14: the rest of the GPU tests of test_multiply (a warning line broke one), the
# pool in place against the same call in the process (issue 24), a cold in-memory multiply
# of files with its read-aheads stopped at the read phase (issue 23), and where float64 on
# INT8 loses its rate out of core: the bare product on the shapes of the tiles' panels
    LIMIT=120 SUMMA_TEST_BACKEND=cupy run python3 -m pytest -q -p no:cacheprovider --with-mpi \
        tests/test_multiply.py
    LIMIT=80 run python3 docs/scripts/seed_case.py --sizes 16384 --dtype float64 \
        --free 24GiB --peers "" --json "$OUT/seed.jsonl"
    LIMIT=80 run python3 docs/scripts/seed_case.py --sizes 16384 --dtype float64 \
        --free 24GiB --pool --peers "" --json "$OUT/seed.jsonl"
    LIMIT=100 MPIEXEC="$MPI" run python3 docs/scripts/files_case.py --size 24576 \
        --dir /tmp/summa-files --ranks 1 --only "in memory" --json "$OUT/files.jsonl"
    rm -rf /tmp/summa-files
    LIMIT=150 run python3 docs/scripts/ozaki_probe.py --sizes 32768 --moduli auto,15,14 \
        --repeat 2 --shapes 16384x32768x16384,10923x32768x4096,10923x32768x8192,8192x8192x32768 \
        --json "$OUT/ozaki.jsonl"
