# STAGE=s13h docs/scripts/gpu_session.sh
# session 13: the streamed default with read-aheads one file after the other
    LIMIT=120 MPIEXEC="$MPI" run python3 docs/scripts/files_case.py --size 24576 \
        --dir /tmp/summa-files --ranks 1 --only default --json "$OUT/files.jsonl"
    rm -rf /tmp/summa-files
