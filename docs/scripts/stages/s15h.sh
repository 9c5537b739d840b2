# STAGE=s15h docs/scripts/gpu_session.sh
# session 15, last call: cuBLASLt's INT8 candidate 1 (the bare product 75.9 TFLOP/s against
# gemmEx's 57.3, s15g) on SUMMA's own shapes: in memory (16384-wide panels), out of core
# under 24 GiB (3 x 2 tiles of 10923 x 16384) and 64 GiB
    for args in "" "--out-of-core --device-memory 24GiB" "--out-of-core --device-memory 64GiB"; do
        LIMIT=70 SUMMA_INT8_GEMM=cublaslt:1 run python3 -m summa bench --backend cupy \
            --size 32768 --dtype float64 --precision fp64-int8 $args --check --repeat 2 \
            --no-ideal --json "$OUT/bench.jsonl"
    done
    bench_table "$OUT/bench.jsonl" out_of_core nb tile tflops check_residual
