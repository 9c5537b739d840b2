# STAGE=s15b docs/scripts/gpu_session.sh
# session 15 (built without a GPU): Cauchy-Schwarz scaling (each row keeps the bits its
# 2-norm allows) and the default moduli 15 at K = 32768 (CPU accuracy at K = 32768: as
# accurate as 16 on normal data, more than a CPU's float64 on uniform, normal, 1e±8). The GPU
# tests of the kernels (a new norm reduction), the bare product (default 15, and 16) against
# native and cuBLAS's emulation, through SUMMA in memory and out of core (64 GiB, 24 GiB)
    LIMIT=120 SUMMA_TEST_BACKEND=cupy run python3 -m pytest -q -p no:cacheprovider --with-mpi \
        tests/test_gpu.py -k "int8 or ozaki or fp64 or probe"
    LIMIT=90 run python3 docs/scripts/ozaki_probe.py --sizes 32768 --moduli auto,16 --repeat 2 \
        --json "$OUT/ozaki.jsonl"
    for args in "--device-memory 64GiB --nb 16384" "--device-memory 24GiB" ""; do
        LIMIT=70 run python3 -m summa bench --backend cupy --size 32768 --dtype float64 \
            --precision fp64-int8 $([ -n "$args" ] && echo --out-of-core) $args --check \
            --repeat 2 --no-ideal --json "$OUT/bench.jsonl"
    done
    bench_table "$OUT/bench.jsonl" out_of_core nb tflops check_residual
