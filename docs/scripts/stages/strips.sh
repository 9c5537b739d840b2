# STAGE=strips docs/scripts/gpu_session.sh
# issues 3, 8: column strips (every GEMM over all of K) against K panels, 2 GPUs
# (float32 over half of K ran 3 % slower; cuBLASMp's float32 106.0 against summa's 103.1;
# TF32 0.916 of the ideal, float16 2 % behind JAX: do tensor-core GEMMs lose to K cuts too?)
    SUMMA_TEST_BACKEND=cupy LIMIT=90 run $MPI -np 2 python3 -m pytest -q -p no:cacheprovider \
        --with-mpi tests/test_gpu.py tests/test_strips.py -k "strips" | tail -2
    for args in float32 "float32 tf32" float16; do  # the strips' GEMMs (strided C), one GPU
        LIMIT=60 run python3 docs/scripts/split_probe.py $args
    done
    for args in "--dtype float32" "--dtype float32 --comm nccl" "--dtype float64" \
                "--dtype float32 --precision tf32" "--dtype float16"; do
        for schedule in panels strips; do
            LIMIT=60 run $MPI -np 2 python3 -m summa bench --backend cupy --size 32768 $args \
                --schedule $schedule --check --repeat 3 --timeout 60 --json "$OUT/strips.jsonl" \
                | grep -a -E "x 32768|rank   [01]|efficiency"
        done
    done
    # last: what is left of a 10-minute call
    LIMIT=200 run python3 docs/scripts/compare_peers.py --size 32768 --dtype float32 --gpus 2 \
        --repeat 3 --rounds 2 --peers summa,nvmath --summa-args "--schedule strips" \
        --json "$OUT/peers.jsonl"
