# STAGE=s27 docs/scripts/gpu_session.sh
# issue 27 on every GPU of a multi-GPU kind, first call: the user's case from a plain
# process (summa's pool, reading the caller's arrays in place) against cuBLASXt on all
# GPUs and P x one GPU's in-memory cupy.matmul. Then STAGE=s27b, STAGE=s27c.
    LIMIT=450 run python3 docs/scripts/seed_case.py --sizes ${SIZES:-65536} --dtype float64 \
        --free 24GiB --peers cublasxt --json "$OUT/seed.jsonl"
