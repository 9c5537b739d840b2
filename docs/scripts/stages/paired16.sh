# STAGE=paired16 docs/scripts/gpu_session.sh
# issue 8: TF32 at N = 16384 trails JAX (638 / 651): NCCL's kernels slow its 11 ms
# of GEMMs 8 %, and direct copies (ipc) open the peer's 512 MiB block per call (10-20 ms).
# ipc's paired broadcasts (staging buffers opened once per grid, copy engines, no SMs)
# need neither: forced here by refusing the export. Against nccl and direct, per dtype.
    for size in 16384 8192; do
    for dtype in "float32 --precision tf32" "float16" "float32" "float64"; do
        for mode in nccl direct paired; do
            comm=ipc; [ $mode = nccl ] && comm=nccl
            noexport=""; [ $mode = paired ] && noexport="import summa.ipc as i; \
i.IpcBroadcaster.export = lambda self, block: False; "
            echo "== $size $dtype $mode"
            LIMIT=60 run $MPI -np 2 python3 -c "import sys; ${noexport}\
from summa.__main__ import main; sys.exit(main())" bench --backend cupy --size $size \
                --dtype $dtype --comm $comm --repeat 5 --timeout 30 --check \
                --json "$OUT/paired16-$mode.jsonl" | grep -a -E "x $size|rank   [01]"
        done
    done
    done
    python3 - "$OUT"/paired16-*.jsonl <<'PY'
import json, sys
rows = {}
for path in sys.argv[1:]:
    mode = path.split("paired16-")[1][:-6]
    for line in open(path):
        r = json.loads(line)
        key = (r["m"], r["dtype"] + ("/tf32" if r["precision"] == "tf32" else ""))
        rows.setdefault(key, {})[mode] = (r["tflops"], r.get("efficiency") or float("nan"))
print(f"{'N':>6} {'dtype':>13} " + " ".join(f"{m:>15}" for m in ("nccl", "direct", "paired")))
for (n, d), modes in sorted(rows.items()):
    cells = [f"{modes[m][0]:8.1f} ({modes[m][1]:.3f})" if m in modes else f"{'-':>15}"
             for m in ("nccl", "direct", "paired")]
    print(f"{n:>6} {d:>13} " + " ".join(cells))
PY
