#!/usr/bin/env bash
# The measurements behind docs/benchmarks.md, on a GPU machine. From the repo root:
#   benchmarks/run.sh user|peers|fp64-int8|files|model|matrix ...   (several at once: in that order)
# Uses the machine's python3 as it is; JSON lines and a log go to $OUT (default ./out).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export MPIEXEC=${MPIEXEC:-mpirun --bind-to none}  # Open MPI binds np <= 2 to one core each
NGPU=$(nvidia-smi -L | wc -l)
run() { echo "+ $*" | tee -a "$OUT/run.log"; "$@" 2>&1 | tee -a "$OUT/run.log"; }
for what in "${@:-user}"; do case $what in
  user)   run python3 benchmarks/user_case.py --sizes 16384,40960 --dtype float64 --free 24GiB --json "$OUT/user_case.jsonl"
          run python3 benchmarks/user_case.py --sizes 57344 --dtype float32 --peers cublasxt --json "$OUT/user_case.jsonl"
          run python3 benchmarks/user_case.py --sizes 16384 --dtype float64 --pool --peers "" --json "$OUT/user_case.jsonl" ;;
  peers)  for dt in float64 float32; do
            run python3 benchmarks/peers.py --size 32768 --dtype $dt --gpus "$NGPU" --repeat 3 --rounds 2 --json "$OUT/peers.jsonl"
            run python3 benchmarks/peers.py --size 32768 --dtype $dt --gpus "$NGPU" --placement host --peers summa,cublasxt --json "$OUT/peers.jsonl"
          done ;;
  fp64-int8) run python3 benchmarks/fp64_int8_speed.py --sizes 32768 --moduli auto --repeat 2 --json "$OUT/fp64_int8.jsonl"
          run python3 benchmarks/fp64_int8_user_case.py --size 32768 --free 24GiB --json "$OUT/fp64_int8.jsonl"
          run python3 benchmarks/fp64_int8_first_product.py --json "$OUT/fp64_int8.jsonl" ;;
  files)  run python3 benchmarks/files.py --size 24576 --dir "${FILES_DIR:-/tmp/summa-files}" --ranks 1 --device-memory 8GiB --json "$OUT/files.jsonl" ;;
  model)  run python3 benchmarks/model_accuracy.py --ranks "$(seq -s, 1 "$NGPU")" --sizes 16384,32768 --mpiexec "$MPIEXEC" --bench-args "--backend cupy" --out "$OUT/model" ;;
  # about 8 minutes a call; run it again until the table names no cell still to run
  matrix) run python3 benchmarks/matrix.py --json "$OUT/matrix.jsonl" --resume ;;
  *) echo "unknown: $what (user, peers, fp64-int8, files, model, matrix)" >&2; exit 2 ;;
esac; done
