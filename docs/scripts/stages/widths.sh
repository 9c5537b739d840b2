# STAGE=widths docs/scripts/gpu_session.sh
# issue 3: panel GEMMs against one big GEMM, and wider panels on both broadcasters
    for d in float32 float16 float64; do
        LIMIT=90 run python3 docs/scripts/panel_gemm_probe.py 32768 $d 4096 8192 16384
    done
    for comm in nccl ipc; do for nb in 8192 16384; do
        LIMIT=60 run $MPI -np 2 python3 -m summa bench --backend cupy --size 32768 \
            --dtype float32 --nb $nb --comm $comm --repeat 3 --timeout 60 --json "$OUT/widths.jsonl"
    done; done
