# STAGE=geo docs/scripts/gpu_session.sh
# issue 5: host-resident float64 on 2 GPUs idled ~14 ms before its first GEMM and
# ~10 ms after its last. Session 9 compared (as module switches, since removed) a first
# head piece of 256 columns doubling after it and tail strips that shrink (40 % of the
# rows left each) against 4 equal pieces / 8 equal strips: 105.6 / 104.9 against 103.0 /
# 103.2. Now the default; this times it in float64 and float32.
    LIMIT=75 run $MPI -np 2 python3 -m summa bench --backend cupy --size 32768 --dtype float64 \
        --out-of-core --repeat 3 --timeout 60 --json "$OUT/geo-f64.jsonl" \
        | grep -a -E "x 32768|row-major"
    LIMIT=75 run $MPI -np 2 python3 -m summa bench --backend cupy --size 32768 --dtype float32 \
        --out-of-core --check --repeat 3 --timeout 60 --json "$OUT/geo-f32.jsonl" \
        | grep -a -E "x 32768|row-major|check"
    python3 - "$OUT"/geo-*.jsonl <<'PY'
import json, sys
print(f"{'variant':>14} {'TFLOP/s':>8} {'eff(row-major)':>15} {'head ms':>8} {'tail ms':>8}")
for path in sys.argv[1:]:
    for line in open(path):
        r = json.loads(line)
        d = r["ranks_detail"]
        print(f"{path.split('geo-')[1][:-6]:>14} {r['tflops']:8.1f} "
              f"{r['tflops'] / r.get('ideal_row_major_tflops', float('nan')):15.3f} "
              f"{max(x['head_seconds'] for x in d) * 1e3:8.1f} "
              f"{max(x['tail_seconds'] for x in d) * 1e3:8.1f}")
PY
