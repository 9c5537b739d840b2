# STAGE=s12c docs/scripts/gpu_session.sh
# issues 22-25, last of session 12: the new GPU tests, fp64-int8 at 32768 and out of
# core, the files case with the host's memory stated, the user's case at 40960
    LIMIT=150 SUMMA_TEST_BACKEND=cupy run python3 -m pytest -q -p no:cacheprovider --with-mpi \
        tests/test_gpu.py tests/test_pool.py tests/test_staging.py \
        -k "int8 or fp64 or stager or multiply_command or ring"
    LIMIT=120 run python3 docs/scripts/ozaki_probe.py --sizes 32768 --moduli auto,14 \
        --json "$OUT/ozaki.jsonl"
    for args in "--out-of-core --device-memory 64GiB --nb 16384" "--out-of-core --device-memory 24GiB"; do
        LIMIT=90 run python3 -m summa bench --backend cupy --size 32768 --dtype float64 \
            --precision fp64-int8 $args --check --repeat 2 --no-ideal --json "$OUT/bench.jsonl"
    done
    run bash -c "free -g; cat /sys/fs/cgroup/memory.max 2>/dev/null; df -h /tmp | tail -1"
    LIMIT=200 MPIEXEC="$MPI" run python3 docs/scripts/files_case.py --size 24576 \
        --dir /tmp/summa-files --ranks 1 --device-memory 8GiB --json "$OUT/files.jsonl"
    rm -rf /tmp/summa-files
    LIMIT=150 run python3 docs/scripts/seed_case.py --sizes 40960 --dtype float64 --free 24GiB \
        --peers cublasxt --json "$OUT/seed.jsonl"
