# STAGE=grids docs/scripts/gpu_session.sh
# issues 3, 8: why16 found float64 at N = 16384 109.8 TFLOP/s on a 1x2 grid against
# 100.3 on the default 2x1 (the per-rank GEMM's shape): both grids, every dtype, both sizes
    for size in 16384 32768; do
        for args in "float64" "float32" "float32 --precision tf32" "float16"; do
            for g in 2x1 1x2; do
                LIMIT=60 run $MPI -np 2 python3 -m summa bench --backend cupy --size $size \
                    --grid $g --dtype $args --repeat 4 --timeout 30 --json "$OUT/grids.jsonl" \
                    | grep -a -E " x $size"
            done
        done
    done
    bench_table "$OUT/grids.jsonl" m dtype precision grid comm tflops efficiency
