# STAGE=oocvar docs/scripts/gpu_session.sh
# issue 5: float64 host-resident on 2 GPUs at 0.905-0.925 of 2 x cupy.matmul (goal
# 0.93); its GEMMs run 6-10 % slower than in memory beside NCCL and the PCIe copies. Which
# knob closes it: NCCL's CTAs, copy engines (ipc), a deeper lookahead, wider panels?
    bench64() {  # label, then extra bench/mpirun arguments
        local label=$1; shift
        echo "== $label"
        LIMIT=75 run $MPI "${pre[@]}" -np 2 python3 -m summa bench --backend cupy --size 32768 \
            --dtype ${DTYPE:-float64} --out-of-core --check --repeat 2 --timeout 60 "$@" \
            --json "$OUT/oocvar.jsonl" | grep -a -E "x 32768|efficiency|row-major|rank   [01]"
    }
    pre=(); bench64 default
    pre=(-x NCCL_MAX_CTAS=4); bench64 ctas4 --no-ideal
    pre=(-x NCCL_MAX_CTAS=8); bench64 ctas8 --no-ideal
    pre=(); bench64 ipc --comm ipc --no-ideal
    pre=(); bench64 lookahead2 --lookahead 2 --no-ideal
    pre=(); bench64 nb8192 --nb 8192 --no-ideal
    pre=(); bench64 default-again
    pre=(); DTYPE=float32 bench64 float32
