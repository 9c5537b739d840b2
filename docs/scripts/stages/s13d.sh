# STAGE=s13d docs/scripts/gpu_session.sh
# session 13: the files case with rows in the page cache copied through the map
# (one GIL-free copy instead of a preadv per row), the pool with one GPU (shared
# arrays read by preadv, written through the map)
    LIMIT=200 MPIEXEC="$MPI" run python3 docs/scripts/files_case.py --size 24576 \
        --dir /tmp/summa-files --ranks 1 --device-memory 8GiB --json "$OUT/files.jsonl"
    rm -rf /tmp/summa-files
    LIMIT=100 run python3 docs/scripts/seed_case.py --sizes 16384 --dtype float64 \
        --free 24GiB --pool --peers "" --json "$OUT/seed.jsonl"
