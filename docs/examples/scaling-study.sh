#!/bin/bash
# A strong- and weak-scaling study on one node (or inside one allocation), then the plot.
#   MPIEXEC="srun" GPUS="1 2 4 8" SIZE=32768 docs/examples/scaling-study.sh
set -euo pipefail
MPIEXEC=${MPIEXEC:-mpirun}
GPUS=${GPUS:-"1 2"}
SIZE=${SIZE:-32768}
DTYPE=${DTYPE:-float64}
OUT=${OUT:-study}
mkdir -p "$OUT"
# 1. Calibrate the model on this machine (per rank count: GEMM and broadcast rates).
for p in $GPUS; do
    $MPIEXEC -n "$p" python -m summa calibrate -o "$OUT/profile.json" --append --dtypes "$DTYPE"
done
# 2. Strong scaling (fixed N) and weak scaling (N grows as P^(1/3): constant work per GPU).
for p in $GPUS; do
    $MPIEXEC -n "$p" python -m summa bench --size "$SIZE" --dtype "$DTYPE" --check \
        --json "$OUT/strong.jsonl"
    weak=$(python3 -c "print(int(round($SIZE * $p ** (1/3) / 256)) * 256)")
    $MPIEXEC -n "$p" python -m summa bench --size "$weak" --dtype "$DTYPE" --check \
        --json "$OUT/weak.jsonl"
done
# 3. Model tables up to 64 GPUs, and the plot with measured points and model curves.
python -m summa model --profile "$OUT/profile.json" --size "$SIZE" --dtype "$DTYPE" --sweep \
    --ranks-list 1,2,4,8,16,32,64 | tee "$OUT/model.txt"
python -m summa plot "$OUT/strong.jsonl" --weak "$OUT/weak.jsonl" --profile "$OUT/profile.json" \
    -o "$OUT/scaling.png"
