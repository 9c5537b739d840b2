# STAGE=s15f docs/scripts/gpu_session.sh
# session 15, fourth call: the INT8 products through cuBLASLt timed on a quarter of the
# product (s15a: 2048-column slices picked nothing faster than gemmEx, whose rate its second
# algorithm beat by 29 %): the GPU tests with it, the bare product with and without it; then
# the planner's new fp64-int8 cuts (both ways, 16384-wide panels) under 24 and 16 GiB against
# 8192-wide panels, and in memory with cuBLASLt's INT8
    LIMIT=90 SUMMA_INT8_GEMM=cublaslt SUMMA_TEST_BACKEND=cupy run python3 -m pytest -q \
        -p no:cacheprovider --with-mpi tests/test_gpu.py -k "int8 or ozaki or fp64"
    LIMIT=110 run python3 docs/scripts/ozaki_probe.py --sizes 32768 --moduli auto --repeat 2 \
        --variants "SUMMA_INT8_GEMM=cublaslt" --json "$OUT/ozaki.jsonl"
    ooc() {  # "VAR=VALUE ..." [bench options]
        local vars=$1; shift
        LIMIT=70 run env $vars python3 -m summa bench --backend cupy --size 32768 \
            --dtype float64 --precision fp64-int8 --check --repeat 2 --no-ideal \
            --json "$OUT/bench.jsonl" "$@"; }
    ooc "SUMMA_OOC_TILES=" --out-of-core --device-memory 24GiB
    ooc "SUMMA_OOC_TILES=" --out-of-core --device-memory 16GiB
    ooc "SUMMA_OOC_TILES=" --out-of-core --device-memory 16GiB --nb 8192
    ooc "SUMMA_INT8_GEMM=cublaslt"
    ooc "SUMMA_INT8_GEMM=cublaslt" --out-of-core --device-memory 24GiB
    bench_table "$OUT/bench.jsonl" out_of_core nb tile tflops check_residual
