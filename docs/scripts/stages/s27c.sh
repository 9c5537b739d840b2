# STAGE=s27c docs/scripts/gpu_session.sh
# issue 27, third call: fp64-int8 on every GPU against one GPU's emulated rate (the bare
# product at N = 32768, ozaki_probe, and summa on one GPU at N = 65536, out of core there)
    LIMIT=90 run python3 docs/scripts/ozaki_probe.py --sizes 32768 --moduli auto --repeat 2 \
        --json "$OUT/ozaki.jsonl"
    P=$(python3 -c "import cupy; print(cupy.cuda.runtime.getDeviceCount())")
    for np_ in 1 $P; do
        LIMIT=200 run $MPI -np $np_ python3 -m summa bench --backend cupy --size 65536 \
            --dtype float64 --precision fp64-int8 --check --repeat 2 --no-ideal \
            --json "$OUT/int8.jsonl"
    done
    # the model (session 15) recommends one row of P for it, with copy-engine broadcasts
    LIMIT=200 run $MPI -np $P python3 -m summa bench --backend cupy --size 65536 \
        --dtype float64 --precision fp64-int8 --grid 1x$P --comm ipc --check --repeat 2 \
        --no-ideal --json "$OUT/int8.jsonl"
    # panel sums (the default on a grid where they fit: per-rank records say panel_sums) against
    # a fold a panel
    LIMIT=200 SUMMA_FP64_INT8_SUMS=0 run $MPI -np $P python3 -m summa bench --backend cupy \
        --size 65536 --dtype float64 --precision fp64-int8 --check --repeat 2 --no-ideal \
        --json "$OUT/int8.jsonl"
    bench_table "$OUT/int8.jsonl" ranks grid comm tflops check_residual
