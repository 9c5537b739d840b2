# STAGE=s15d docs/scripts/gpu_session.sh
# session 15 (built without a GPU): float64 on INT8 out of core under the user's 24 GiB
# (0.87 of the bare product with 4 x 1 tiles of 8192 rows and 8192-wide panels: 16 products,
# each paying a fold over its tile, B uploaded 4 times). Squarer tiles leave room for
# 16384-wide panels (half the folds): 3 x 2 tiles (12 products), and with each fold group's
# residues made as it comes (SUMMA_FP64_INT8_LEAN) 2 x 2 (8 products, A and B uploaded twice);
# the lean residues' own cost on the default cut. Against the default, same call.
    ooc() {  # "VAR=VALUE ..." [bench options]
        local vars=$1; shift
        LIMIT=70 run env $vars python3 -m summa bench --backend cupy --size 32768 \
            --dtype float64 --precision fp64-int8 --out-of-core --device-memory 24GiB \
            --check --repeat 2 --no-ideal --json "$OUT/bench.jsonl" "$@"; }
    ooc "SUMMA_OOC_TILES="
    ooc "SUMMA_OOC_TILES=3x2" --nb 16384
    ooc "SUMMA_FP64_INT8_LEAN=1 SUMMA_OOC_TILES=2x2" --nb 16384
    ooc "SUMMA_FP64_INT8_LEAN=1 SUMMA_OOC_TILES="
    bench_table "$OUT/bench.jsonl" nb tile tflops check_residual
