# STAGE=s13f docs/scripts/gpu_session.sh
# session 13: the product written into the output file's map by the copy threads
# (page faults, in parallel) against pwrite of its rows (one file's lock, in turn)
    for writes in pwrite map; do
        LIMIT=150 MPIEXEC="$MPI" SUMMA_FILE_WRITES=$writes run python3 docs/scripts/files_case.py \
            --size 24576 --dir /tmp/summa-files --ranks 1 --only "default,in memory" \
            --json "$OUT/files_$writes.jsonl"
    done
    rm -rf /tmp/summa-files
