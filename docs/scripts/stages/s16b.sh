# STAGE=s16b docs/scripts/gpu_session.sh
# cuBLASLt's INT8 products by default (SUMMA_INT8_GEMM=auto: from 2**42 multiply-adds, timed in
# 200 ms bursts, remembered) and fp64-int8's short sums (K < 32) in native float64: the GPU
# tests; the bare product at N = 32768 by default, through gemmEx and through cuBLASLt on
# every size against cuBLAS's emulation, plus panel and tile shapes between 2**41 and 2**44
# (where auto's threshold lies); SUMMA in memory and out of core under 24 GiB, default and
# gemmEx, the first call of each with an empty cache of choices (bench's warm-up times them)
    export SUMMA_CACHE_DIR=$OUT/cache
    LIMIT=150 SUMMA_TEST_BACKEND=cupy run python3 -m pytest -q -p no:cacheprovider --with-mpi \
        tests/test_gpu.py -k "cublaslt or int8 or ozaki or fp64"
    LIMIT=200 run python3 docs/scripts/ozaki_probe.py --sizes 32768 --moduli auto --repeat 2 \
        --variants "SUMMA_INT8_GEMM=gemmex;SUMMA_INT8_GEMM=cublaslt" \
        --shapes "16384x16384x16384,32768x32768x4096,32768x32768x8192,10923x16384x16384" \
        --json "$OUT/ozaki.jsonl"
    for args in "" "--out-of-core --device-memory 24GiB"; do
        for lib in auto gemmex; do
            LIMIT=90 SUMMA_INT8_GEMM=$lib run python3 -m summa bench --backend cupy \
                --size 32768 --dtype float64 --precision fp64-int8 $args --check --repeat 2 \
                --no-ideal --json "$OUT/bench.jsonl"
        done
    done
    LIMIT=90 run python3 -m summa bench --backend cupy --size 16384 --dtype complex128 \
        --precision fp64-int8 --check --repeat 2 --no-ideal --json "$OUT/bench.jsonl"
    bench_table "$OUT/bench.jsonl" dtype out_of_core tile tflops check_residual
    cat "$OUT/cache/cublaslt-int8.json"
