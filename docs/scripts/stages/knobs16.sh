# STAGE=knobs16 docs/scripts/gpu_session.sh
# issue 8: at N = 16384 summa trailed JAX in float64 (0.9 %) and TF32 (2 %, auto
# took NCCL there) and cuBLASMp in float32 (3 %): broadcaster and panel width per dtype
    for args in "float32 --precision tf32 --comm nccl --nb 8192" \
                "float32 --precision tf32 --comm ipc --nb 8192" \
                "float32 --precision tf32 --comm ipc --nb 4096" \
                "float32 --precision tf32 --comm nccl --nb 4096" \
                "float32 --comm ipc --nb 8192" "float32 --comm ipc --nb 4096" \
                "float32 --comm nccl --nb 4096" "float64 --comm ipc --nb 4096" \
                "float64 --comm ipc --nb 8192" "float64 --comm nccl --nb 4096"; do
        LIMIT=60 run $MPI -np 2 python3 -m summa bench --backend cupy --size 16384 --dtype $args \
            --repeat 5 --timeout 30 --json "$OUT/knobs16.jsonl" | grep -a -E "x 16384"
    done
    bench_table "$OUT/knobs16.jsonl" dtype precision comm nb tflops efficiency
