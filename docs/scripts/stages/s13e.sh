# STAGE=s13e docs/scripts/gpu_session.sh
# session 13: the files case with the read-ahead faulting the pages in
# (MADV_POPULATE_READ): do the streamed copies then run at memory speed?
    LIMIT=200 MPIEXEC="$MPI" run python3 docs/scripts/files_case.py --size 24576 \
        --dir /tmp/summa-files --ranks 1 --device-memory 8GiB --json "$OUT/files.jsonl"
    rm -rf /tmp/summa-files
