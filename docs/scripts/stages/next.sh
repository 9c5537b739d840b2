# STAGE=next docs/scripts/gpu_session.sh
# the next one-GPU session's first call: the new GPU tests (fp64-int8 overlap, files
# straight to the GPU), the files case with its read parts, the pool's own cost with one
# GPU (issue 24), fp64-int8 variants (overlapped folds, planes)
    LIMIT=150 SUMMA_TEST_BACKEND=cupy run python3 -m pytest -q -p no:cacheprovider --with-mpi \
        tests/test_gpu.py tests/test_staging.py tests/test_multiply.py -k \
        "int8 or fp64 or stager or npy or ring or mapped or streams"
    # a page cache smaller than the machine (a container's memory limit) would explain warm
    # reads at disk speed in session 12: what limits it?
    run bash -c "cat /sys/fs/cgroup/memory.max /sys/fs/cgroup/memory/memory.limit_in_bytes \
        /proc/meminfo 2>/dev/null | head -8"
    LIMIT=200 MPIEXEC="$MPI" run python3 docs/scripts/files_case.py --size 24576 \
        --dir /tmp/summa-files --ranks 1 --device-memory 8GiB --json "$OUT/files.jsonl"
    rm -rf /tmp/summa-files
    LIMIT=100 run python3 docs/scripts/seed_case.py --sizes 16384 --dtype float64 \
        --free 24GiB --pool --peers "" --json "$OUT/seed.jsonl"
    LIMIT=120 run python3 docs/scripts/ozaki_probe.py --sizes 32768 --moduli auto \
        --variants "SUMMA_FP64_INT8_OVERLAP=1;SUMMA_FP64_INT8_PLANES=8" \
        --json "$OUT/ozaki.jsonl"
