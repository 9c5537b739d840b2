# STAGE=ctas docs/scripts/gpu_session.sh
# issues 3, 5: NCCL's kernels spin on SMs while they wait for the peer (out of core:
# broadcasts busy 0.45 of 0.77 s, GEMMs 4-9 % slow); fewer CTAs, still hidden behind GEMMs?
    for ctas in default 2 8; do
        pass=()
        [ "$ctas" = default ] || pass=(-x NCCL_MAX_CTAS=$ctas)
        for args in "--dtype float32 --out-of-core" "--dtype float64 --out-of-core" \
                    "--dtype float32" "--dtype float32 --precision tf32"; do
            echo "NCCL_MAX_CTAS=$ctas $args"
            LIMIT=100 run $MPI "${pass[@]}" -np 2 python3 -m summa bench --backend cupy \
                --size 32768 $args --comm nccl --check --repeat 2 --timeout 60 \
                --json "$OUT/ctas-$ctas.jsonl" | grep -a -E "x 32768|rank   [01]"
        done
    done
