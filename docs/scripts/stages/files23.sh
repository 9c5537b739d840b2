# STAGE=files23 docs/scripts/gpu_session.sh
# issue 23: multiply from .npy files, in memory and streamed out of core, cold and
# warm, against the same disk's parallel read and write rates
    LIMIT=${FILES_LIMIT:-420} MPIEXEC="$MPI" run python3 docs/scripts/files_case.py \
        --size ${SIZE:-24576} --dir ${FILES_DIR:-/tmp/summa-files} --ranks ${RANKS:-1} \
        --device-memory ${CAP:-8GiB} --json "$OUT/files.jsonl"
    rm -rf "${FILES_DIR:-/tmp/summa-files}"
