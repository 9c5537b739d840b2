# STAGE=model docs/scripts/gpu_session.sh
# issue 7: calibrate on 1 and 2 GPUs; strong (3 sizes) and weak runs; model vs measured
# One broadcaster per call, so that trouble with one (ipc) cannot cost the others;
# NCCL last, whose per-step overhead (fitted on its own runs) the profile keeps.
    for comm in mpi ipc; do
        LIMIT=90 run $MPI -np 2 python3 -m summa calibrate -o "$OUT/profile.json" --append \
            --dtypes float64 --comm $comm --sizes 4096 --widths 1024
    done
    for p in 1 2; do
        LIMIT=120 run $MPI -np $p python3 -m summa calibrate -o "$OUT/profile.json" --append \
            --dtypes float64 --comm nccl
    done
    # --comm nccl: the runs the NCCL terms are checked on (auto takes ipc, checked below)
    for p in 1 2; do for n in 8192 16384 32768; do
        LIMIT=60 run $MPI -np $p python3 -m summa bench --backend cupy --size $n --repeat 2 \
            --comm nccl --json "$OUT/strong.jsonl"
    done; done
    # weak scaling: the same work per GPU, N = 16384 x P^(1/3)
    LIMIT=60 run $MPI -np 1 python3 -m summa bench --backend cupy --size 16384 --repeat 2 \
        --comm nccl --json "$OUT/weak.jsonl"
    LIMIT=60 run $MPI -np 2 python3 -m summa bench --backend cupy --size 20643 --repeat 2 \
        --comm nccl --json "$OUT/weak.jsonl"
    run python3 docs/scripts/validate_model.py --profile "$OUT/profile.json" \
        --results "$OUT/strong.jsonl" "$OUT/weak.jsonl"
    # auto on one node: direct copies (ipc), modelled since the late session
    for n in 16384 32768; do
        LIMIT=60 run $MPI -np 2 python3 -m summa bench --backend cupy --size $n --repeat 2 \
            --json "$OUT/auto.jsonl"
    done
    run python3 docs/scripts/validate_model.py --profile "$OUT/profile.json" \
        --results "$OUT/auto.jsonl"
    run python3 -m summa model --profile "$OUT/profile.json" --size 32768 --sweep
    run python3 -m summa plot "$OUT/strong.jsonl" --weak "$OUT/weak.jsonl" \
        --profile "$OUT/profile.json" -o "$OUT/scaling.png"
