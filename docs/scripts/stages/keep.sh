# STAGE=keep docs/scripts/gpu_session.sh
# issue 8: peers' blocks kept open between multiplies (auto: opened by the first
# multiply, free from the second; on branch history-auto NCCL first, opened by the
# second): the GPU tests it touches on 2 ranks, then bench's auto at N = 16384 and 8192
# in every dtype (session 10: TF32 712.5 against NCCL's 646.0)
    TEST_FILES="tests/test_gpu.py tests/test_algorithm.py tests/test_strips.py" mpi_tests 2
    for size in 16384 8192; do
    for dtype in "float32 --precision tf32" "float16" "float32" "float64"; do
        echo "== $size $dtype auto"
        LIMIT=60 run $MPI -np 2 python3 -m summa bench --backend cupy --size $size \
            --dtype $dtype --repeat 5 --timeout 30 --check --json "$OUT/keep.jsonl" \
            | grep -a -E "x $size|rank   [01]"
    done
    done
    bench_table "$OUT/keep.jsonl" m dtype precision grid comm tflops efficiency
