# STAGE=s14e docs/scripts/gpu_session.sh
# session 14: float64 on INT8 with the kernels rewritten (rows on the grid's y, no 64-bit
# division per element, four residues a store, the first fold starting the sums and the
# last one ending the product): the GPU tests of the kernels, the bare product against
# native and cuBLAS's emulation (and what 15 moduli lose against the default 16), through
# SUMMA in memory and out of core (64 GiB, 16384; 24 GiB, the new default 8192)
    LIMIT=120 SUMMA_TEST_BACKEND=cupy run python3 -m pytest -q -p no:cacheprovider --with-mpi \
        tests/test_gpu.py -k "int8 or ozaki or fp64 or probe"
    LIMIT=80 run python3 docs/scripts/ozaki_probe.py --sizes 32768 --moduli auto,15 --repeat 2 \
        --json "$OUT/ozaki.jsonl"
    for args in "--device-memory 64GiB --nb 16384" "--device-memory 24GiB" ""; do
        LIMIT=70 run python3 -m summa bench --backend cupy --size 32768 --dtype float64 \
            --precision fp64-int8 $([ -n "$args" ] && echo --out-of-core) $args --check \
            --repeat 2 --no-ideal --json "$OUT/bench.jsonl"
    done
    bench_table "$OUT/bench.jsonl" out_of_core nb tflops check_residual
