#!/usr/bin/env bash
# The GPU checks and measurements the open issues need, in stages that each fit one device
# call. From the repo root on the GPU machine:
#   STAGE=NAME docs/scripts/gpu_session.sh
# runs docs/scripts/stages/NAME.sh after the set-up below (its first lines say what it runs;
# `head -3 docs/scripts/stages/*.sh` lists them all).
# Logs and JSON lines go to $OUT (or ./out).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site
fi
if ls .whl/cublasmp/*.whl >/dev/null 2>&1; then  # cuBLASMp's own nvmath-python, kept apart
    python3 -m pip install -q --no-index --no-deps --target /tmp/site-mp .whl/cublasmp/*.whl
    export SUMMA_NVMATH_PATH=/tmp/site-mp
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
MPI=${MPIEXEC:-mpirun --oversubscribe --bind-to none}  # Open MPI binds np <= 2 to one core each
# Each command gets at most LIMIT seconds (default 240), so one hang cannot eat the session.
run() { echo "+ $*" | tee -a "$OUT/session.log"
        timeout "${LIMIT:-240}" "$@" < /dev/null 2>&1 | tee -a "$OUT/session.log"
        local rc=${PIPESTATUS[0]}  # say so when the limit killed it: it prints nothing else
        [ "$rc" = 124 ] && echo "TIMED OUT after ${LIMIT:-240} s: $1 ... ${*: -3}" \
            | tee -a "$OUT/session.log"
        return "$rc"; }
# Issue 5's N = 100,000 cases on 2 GPUs: float64 in device memory, float32 host-resident
# under a 16 GiB device cap (its host data generation and locking need the longer limit).
hundred_k_f64() {  # 99.5 TFLOP/s with nb 4096 (goal 100): does a wider panel close it?
    for nb in 4096 8192; do
        LIMIT=120 run $MPI -np 2 python3 -m summa bench --backend cupy --size 100000 \
            --dtype float64 --nb $nb --check --repeat 1 --warmup 1 --no-ideal --timeout 60 \
            --json "$OUT/ooc.jsonl"
    done
}
hundred_k_f32() {
    LIMIT=300 run $MPI -np 2 python3 -m summa bench --backend cupy --size 100000 \
        --dtype float32 --device-memory 16GiB --check --repeat 1 --warmup 1 --no-ideal \
        --timeout 60 --json "$OUT/ooc.jsonl"
}
hundred_k() { hundred_k_f64; hundred_k_f32; }
# The MPI tests on CuPy, one pytest run per file: a failure aborts its whole run
# under Open MPI, and must not hide the files after it. TEST_FILES picks files;
# the logs come back as one archive (the device returns at most 8 files).
mpi_tests() {  # ranks
    mkdir -p "$OUT/logs"
    for f in ${TEST_FILES:-$(grep -l 'mark.mpi' tests/test_*.py)}; do
        log="$OUT/logs/mpi_tests_$1_$(basename "$f" .py).log"
        SUMMA_TEST_BACKEND=cupy LIMIT=${FILE_LIMIT:-150} run $MPI -np "$1" python3 -m pytest -q \
            -p no:cacheprovider --with-mpi -m mpi "$f" > "$log"
        echo "$f on $1: $(grep -a -E -o '[0-9]+ (passed|failed)[^=]*' "$log" | tail -1)"
        grep -a -E '^(E  |FAILED)' "$log" | head -5
    done
    tar -czf "$OUT/mpi_logs_$1.tgz" -C "$OUT" logs && rm -r "$OUT/logs"
}
# One row per `bench --json` record of FILE, the given fields in columns (grid as PRxPC,
# TFLOP/s and efficiency as numbers, nan where a record has none).
bench_table() {  # FILE FIELD...
    python3 - "$@" <<'PY'
import json, sys
path, fields = sys.argv[1], sys.argv[2:]
def cell(r, f):
    v = r.get(f)
    if f == "grid":
        return "x".join(map(str, v))
    if f in ("tflops", "efficiency"):
        return f"{v if v is not None else float('nan'):.{1 if f == 'tflops' else 3}f}"
    return str(v)
print(" ".join(f"{f:>10}" for f in fields))
for line in open(path):
    r = json.loads(line)
    print(" ".join(f"{cell(r, f):>10}" for f in fields))
PY
}
STAGES=$PWD/docs/scripts/stages
stage=${STAGE:-tests}
if [ ! -f "$STAGES/$stage.sh" ]; then
    echo "unknown STAGE $stage (the stages: ls docs/scripts/stages)" >&2
    exit 2
fi
# shellcheck source=/dev/null
source "$STAGES/$stage.sh"
