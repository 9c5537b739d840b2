# STAGE=s15c docs/scripts/gpu_session.sh
# session 15 (built without a GPU): complex128 on INT8 (four real products; never yet run on
# a GPU) against native ZGEMM, then the H200 profile's fp64-int8 samples measured again with
# the default 15 moduli (its samples were 16 moduli's), for summa/profiles/h200.json
    for precision in default fp64-int8; do
        LIMIT=60 run python3 -m summa bench --backend cupy --size 16384 --dtype complex128 \
            --precision $precision --check --repeat 2 --no-ideal --json "$OUT/bench.jsonl"
    done
    bench_table "$OUT/bench.jsonl" dtype precision tflops check_residual
    python3 - "$OUT/h200-int8.json" <<'PY'
import json, sys
profile = json.load(open("summa/profiles/h200.json"))
profile["gemm"] = [g for g in profile["gemm"] if g.get("precision") != "fp64-int8"]
json.dump(profile, open(sys.argv[1], "w"), indent=1)
PY
    LIMIT=150 run python3 -m summa calibrate --backend cupy --precision fp64-int8 --append \
        -o "$OUT/h200-int8.json" --comm mpi --repeat 2
    run python3 -m summa model --profile "$OUT/h200-int8.json" --size 32768 --grid 1x1 \
        --precision fp64-int8
