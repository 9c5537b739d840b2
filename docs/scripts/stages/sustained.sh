# STAGE=sustained docs/scripts/gpu_session.sh
# issues 3, 5, 8 (one GPU): GEMM rate against the data and under sustained load
    export XLA_PYTHON_CLIENT_PREALLOCATE=false
    why=clocks_event_reasons.active  # the older drivers' name for it: clocks_throttle_reasons
    nvidia-smi --query-gpu=$why --format=csv >/dev/null 2>&1 || why=clocks_throttle_reasons.active
    nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,$why \
        --format=csv,noheader -lms 250 > "$OUT/smi.csv" 2>&1 &
    smi=$!
    LIMIT=300 run python3 docs/scripts/sustained_probe.py --seconds ${SECONDS_PER:-8}
    kill $smi
    python3 - "$OUT/smi.csv" <<'PY'
import sys, datetime
rows = [l.split(", ") for l in open(sys.argv[1]) if l.count(",") >= 4]
def t(s): return datetime.datetime.strptime(s.split(".")[0], "%Y/%m/%d %H:%M:%S").timestamp()
print("nvidia-smi, per 2 s: time, SM MHz (min-max), W (max), degC, reasons")
for i in range(0, len(rows), 8):
    chunk = rows[i:i + 8]
    try:
        mhz = [int(r[1].split()[0]) for r in chunk]; w = [float(r[2].split()[0]) for r in chunk]
        print(chunk[0][0], min(mhz), max(mhz), round(max(w)), chunk[-1][3], chunk[-1][4].strip())
    except (ValueError, IndexError):
        print(chunk[0])
PY
