#!/usr/bin/env bash
# The GPU checks and measurements the open issues need, in stages that each fit one device
# call (< 9 minutes on nvidia-h200-x2). From the repo root on the GPU machine:
#   STAGE=tests  docs/scripts/gpu_session.sh     # suite on the CuPy backend, 1 and 2 ranks
#   STAGE=inmem  docs/scripts/gpu_session.sh     # issue 3: 32768 fp64/fp32/tf32 on 2 GPUs
#   STAGE=lt     docs/scripts/gpu_session.sh     # issue 3: SUMMA_GEMM=cublaslt against gemmEx
#   STAGE=fixes  docs/scripts/gpu_session.sh     # issues 3, 5: newest GPU tests, priority stream
#   STAGE=data   docs/scripts/gpu_session.sh     # issues 3, 8: GEMM rate against input values
#   STAGE=ooc1   docs/scripts/gpu_session.sh     # issue 5: one GPU, host-resident, 32768
#   STAGE=big32  docs/scripts/gpu_session.sh     # issue 5: 100k float32 host-resident
#   STAGE=ipc    docs/scripts/gpu_session.sh     # issue 3: copy-engine broadcasts against NCCL
#   STAGE=ooc    docs/scripts/gpu_session.sh     # issue 5: host-resident runs, cuBLASXt, 100k
#   STAGE=headline docs/scripts/gpu_session.sh   # issues 5, 8: 100k runs, cuBLASXt, JAX
#   STAGE=files  docs/scripts/gpu_session.sh     # issue 4: 32768^2 float64 .npy files end to end
#   STAGE=model  docs/scripts/gpu_session.sh     # issue 7: calibrate, validate, plot
#   STAGE=probe  docs/scripts/gpu_session.sh     # issues 3, 8: cuBLAS versions, XLA's GEMM
#   STAGE=widths docs/scripts/gpu_session.sh     # issue 3: panel GEMMs against one GEMM, fp32 nb
#   STAGE=peers  docs/scripts/gpu_session.sh     # issue 8: compare_peers for fp64/fp32/tf32/fp16
#   STAGE=direct docs/scripts/gpu_session.sh     # issues 3, 8: ipc direct copies, JAX alongside
#   STAGE=ipcopen docs/scripts/gpu_session.sh    # issue 3: cudaIpcOpenMemHandle cost by size
#   STAGE=sustained docs/scripts/gpu_session.sh  # one GPU: GEMM rate against data, over time
#   STAGE=x2check docs/scripts/gpu_session.sh    # 2 GPUs: MPI tests, ipc open, host-resident
#   STAGE=layout docs/scripts/gpu_session.sh     # GEMM rate by operand layout; XLA's layouts
#   STAGE=suite2 docs/scripts/gpu_session.sh     # the MPI tests on 2 GPUs, file by file
#   STAGE=ownfirst docs/scripts/gpu_session.sh   # own panels first under NCCL against ipc
#   STAGE=ctas   docs/scripts/gpu_session.sh     # NCCL_MAX_CTAS against NCCL's SM share
#   STAGE=hostgrid docs/scripts/gpu_session.sh   # host-resident head/tail, 1x2 vs 2x1, warm-up
#   STAGE=peers2 docs/scripts/gpu_session.sh     # JAX / cuBLASMp where summa was behind
#   STAGE=strips docs/scripts/gpu_session.sh     # column strips against K panels (~9 min)
#   STAGE=transpose docs/scripts/gpu_session.sh  # A's panels transposed: tests, probes, fp64/32
#   STAGE=transpose2 docs/scripts/gpu_session.sh # one GPU transposed; peers in every dtype
#   STAGE=ooct   docs/scripts/gpu_session.sh     # host-resident, A's parts transposed or not
#   STAGE=oocvar docs/scripts/gpu_session.sh   # host-resident float64: CTAs, ipc, lookahead, nb
#   STAGE=oocauto docs/scripts/gpu_session.sh  # host-resident: auto (ipc) against NCCL, tests
#   STAGE=big32auto docs/scripts/gpu_session.sh # 100k float32 host-resident, auto
#   STAGE=final8 docs/scripts/gpu_session.sh   # host peers (cuBLASXt); TF32/fp16 against JAX
#   STAGE=peers16 docs/scripts/gpu_session.sh  # N = 16384 against JAX, cuBLASMp (~8 min)
#   STAGE=report1 docs/scripts/gpu_session.sh  # the report table, N = 16384 (report2: 32768)
#   STAGE=geo    docs/scripts/gpu_session.sh     # host-resident: doubling head, shrinking tail
#   STAGE=paired16 docs/scripts/gpu_session.sh   # N = 16384: ipc paired broadcasts vs nccl/direct
#   STAGE=f32lt16 docs/scripts/gpu_session.sh    # float32 N = 16384: cuBLASLt's GEMM against gemmEx
#   STAGE=keep   docs/scripts/gpu_session.sh     # blocks kept open: GPU tests, auto at 16384/8192
#   STAGE=peers32 docs/scripts/gpu_session.sh    # N = 32768 against JAX, every dtype (~5 min)
#   STAGE=loops  docs/scripts/gpu_session.sh     # same B against a new B per call; ipc tests
#   STAGE=hostpeers docs/scripts/gpu_session.sh # host data: summa against cuBLASXt, 1 and 2 GPUs
#   STAGE=lt2    docs/scripts/gpu_session.sh     # TF32/float16: cuBLASLt against gemmEx, JAX
#   STAGE=big7   docs/scripts/gpu_session.sh     # 100k float64 transposed; 1-GPU ooc; watchdog
#   STAGE=sweep  docs/scripts/gpu_session.sh     # issue 21: randomized sweep, ranks sharing GPUs
#   STAGE=seed   docs/scripts/gpu_session.sh     # issue 22: the user's arrays end to end (~6 min)
#   STAGE=files23 docs/scripts/gpu_session.sh    # issue 23: multiply from files against the disk
#   STAGE=s12    docs/scripts/gpu_session.sh     # issues 22-25: GPU tests of host/pool/int8,
#                                                # seed tuning, INT8 rates, then files23
#   STAGE=s12b   docs/scripts/gpu_session.sh     # issue 25: fp64-int8 tests, rates, SUMMA
#   STAGE=s12c   docs/scripts/gpu_session.sh     # issues 22-25: the session's last checks
#   STAGE=s27    docs/scripts/gpu_session.sh     # issue 27: every GPU of an x2/x4/x8 kind
#   STAGE=next   docs/scripts/gpu_session.sh     # the next one-GPU session's first call
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
MPI=${MPIEXEC:-mpirun --oversubscribe}
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
case "${STAGE:-tests}" in
tests)
    ranks=${TEST_RANKS:-1 2}  # "1" on a one-GPU machine
    SUMMA_TEST_BACKEND=cupy TEST_RANKS="$ranks" SUMMA_PYTHON=python3 MPIEXEC="$MPI" ./run test \
        > "$OUT/tests.log" 2>&1; echo "tests rc=$?"; grep -a -E "passed|failed" "$OUT/tests.log"
    run $MPI -np "${ranks##* }" python3 -m summa bench --backend cupy --check \
        --json "$OUT/bench.jsonl"
    ;;
inmem)
    for args in "--dtype float64" "--dtype float32" "--dtype float32 --precision tf32"; do
        run $MPI -np 2 python3 -m summa bench --backend cupy --size 32768 $args --check \
            --repeat 3 --timeout 90 --json "$OUT/inmem.jsonl"
    done
    ;;
lt)  # issue 3: cuBLASLt's timed algorithm choice against gemmEx, 2 GPUs, N = 32768
    for n in 1 2; do
        LIMIT=120 run $MPI -np $n python3 -m pytest -q -x --with-mpi tests/test_gpu.py \
            -k "cublaslt or out_of_core or priority"
    done
    LIMIT=60 run $MPI -np 2 python3 -m summa bench --backend cupy --size 32768 --dtype float16 \
        --nb 4096 --repeat 3 --timeout 60 --json "$OUT/lt.jsonl"  # the old float16 default
    for args in "--dtype float64" "--dtype float32 --precision tf32"; do  # one GPU's GEMM
        LIMIT=90 run python3 docs/scripts/compare_peers.py --size 32768 $args --gpus 1 \
            --repeat 2 --peers cupy,nvmathlt --json "$OUT/peers.jsonl"
    done
    for la in 1 2; do  # GEMMs first on the SMs, NCCL in the gaps: does it beat sharing?
        LIMIT=60 SUMMA_COMPUTE_PRIORITY=high run $MPI -np 2 python3 -m summa bench \
            --backend cupy --size 32768 --dtype float32 --lookahead $la --repeat 3 \
            --timeout 60 --json "$OUT/lt.jsonl"
    done
    for args in "--dtype float64" "--dtype float32 --precision tf32" "--dtype float16"; do
        for lib in cublas cublaslt; do
            LIMIT=60 SUMMA_GEMM=$lib run $MPI -np 2 python3 -m summa bench --backend cupy \
                --size 32768 $args --check --repeat 3 --timeout 60 --json "$OUT/lt.jsonl"
        done
    done
    ;;
fixes)  # issue 3/5: GPU tests of the newest code; the high-priority GEMM stream in one run
    for n in 1 2; do
        LIMIT=90 run $MPI -np $n python3 -m pytest -q --with-mpi tests/test_gpu.py \
            -k "cublaslt or out_of_core or priority or partly"
    done
    for prio in default high; do
        LIMIT=60 SUMMA_COMPUTE_PRIORITY=$prio run $MPI -np 2 python3 -m summa bench \
            --backend cupy --size 32768 --dtype float32 --repeat 3 --timeout 60 \
            --json "$OUT/fixes.jsonl"
    done
    ;;
data)  # issue 3/8: does the GEMM rate depend on the values multiplied (power, clocks)?
    for data in uniform uniform01 normal; do
        LIMIT=60 run python3 docs/scripts/compare_peers.py --size 32768 --dtype float64 \
            --gpus 1 --repeat 2 --peers cupy --data $data --json "$OUT/data.jsonl"
    done
    for data in uniform uniform01; do
        LIMIT=90 run python3 docs/scripts/compare_peers.py --size 32768 --dtype float64 \
            --gpus 2 --repeat 2 --peers jax --data $data --json "$OUT/data.jsonl"
    done
    ;;
big32)  # issue 5: N = 100,000 float32, host-resident, 16 GiB device cap, 2 GPUs
    hundred_k_f32
    ;;
ooc1)  # issue 5: one GPU, host-resident, N = 32768
    for d in float64 float32; do
        LIMIT=150 run $MPI -np 1 python3 -m summa bench --backend cupy --size 32768 \
            --dtype $d --out-of-core --check --repeat 2 --timeout 60 --json "$OUT/ooc.jsonl"
    done
    ;;
ipc)  # issue 3: copy-engine panels read straight from the roots' blocks, against NCCL
    for n in 1 2; do
        LIMIT=120 run $MPI -np $n python3 -m pytest -q -x --with-mpi tests/test_gpu.py \
            tests/test_comm.py -k "ipc or reference"
    done
    for args in "--dtype float32" "--dtype float32 --precision tf32" "--dtype float64" \
                "--dtype float16"; do
        for comm in nccl ipc; do
            run $MPI -np 2 python3 -m summa bench --backend cupy --size 32768 $args \
                --comm $comm --check --repeat 3 --timeout 90 --json "$OUT/ipc.jsonl"
        done
    done
    python3 -c "import json,sys; [print(r['comm'], r['dtype'], r['precision'], r['nb'], round(r['tflops'],1), round(r['efficiency'],3), [(d.get('connect_seconds'), d.get('release_seconds'), round(d['wait'],4)) for d in r['ranks_detail']]) for r in map(json.loads, open(sys.argv[1]))]" "$OUT/ipc.jsonl"
    ;;
widths)  # issue 3: panel GEMMs against one big GEMM, and wider panels on both broadcasters
    for d in float32 float16 float64; do
        LIMIT=90 run python3 docs/scripts/panel_gemm_probe.py 32768 $d 4096 8192 16384
    done
    for comm in nccl ipc; do for nb in 8192 16384; do
        LIMIT=60 run $MPI -np 2 python3 -m summa bench --backend cupy --size 32768 \
            --dtype float32 --nb $nb --comm $comm --repeat 3 --timeout 60 --json "$OUT/widths.jsonl"
    done; done
    ;;
direct)  # issues 3, 8: auto = ipc direct copies; GPU tests, fp32 widths, the peers' tables
    LIMIT=200 run $MPI -np 2 python3 -m pytest -q -x --with-mpi tests/test_gpu.py tests/test_comm.py
    for nb in ${FP32_WIDTHS:-8192 16384}; do
        LIMIT=60 run $MPI -np 2 python3 -m summa bench --backend cupy --size 32768 \
            --dtype float32 --nb $nb --check --repeat 3 --timeout 60 --json "$OUT/direct.jsonl"
    done
    for size in ${SIZES:-16384 32768}; do
        for args in "--dtype float64" "--dtype float32 --precision tf32" "--dtype float16" \
                    "--dtype float32"; do
            LIMIT=${PEER_LIMIT:-150} run python3 docs/scripts/compare_peers.py --size $size \
                $args --gpus 2 --repeat 2 --peers summa,cupy,jax --peer-timeout 90 \
                --json "$OUT/peers.jsonl"
        done
    done
    ;;
sustained)  # issues 3, 5, 8 (one GPU): GEMM rate against the data and under sustained load
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
    ;;
x2check)  # 2 GPUs: the MPI tests on CuPy, ipc's open cost, host-resident runs against cuBLASXt
    mpi_tests 2
    LIMIT=60 run $MPI -np 2 python3 docs/scripts/ipc_open_probe.py
    for d in float64 float32; do
        LIMIT=100 run $MPI -np 2 python3 -m summa bench --backend cupy --size 32768 \
            --dtype $d --out-of-core --check --repeat 2 --timeout 60 --json "$OUT/ooc.jsonl"
        LIMIT=60 run python3 docs/scripts/compare_peers.py --size 32768 --dtype $d --gpus 2 \
            --placement host --peers cublasxt --repeat 2 --json "$OUT/peers.jsonl"
    done
    ;;
oocipc)  # issue 5: host-resident panels passed on by copy engines (ipc) against NCCL; issue 8 rule
    for args in "--dtype float64 --comm ipc" "--dtype float32 --comm ipc" \
                "--dtype float32 --comm ipc --nb 8192"; do
        LIMIT=100 run $MPI -np 2 python3 -m summa bench --backend cupy --size 32768 $args \
            --out-of-core --check --repeat 2 --timeout 60 --json "$OUT/oocipc.jsonl"
    done
    for args in "--dtype float16" "--dtype float32 --precision tf32"; do  # auto's choice at 16384
        LIMIT=60 run $MPI -np 2 python3 -m summa bench --backend cupy --size 16384 $args \
            --check --repeat 3 --timeout 60 --json "$OUT/oocipc.jsonl"
    done
    ;;
oocfix)  # the ipc push broadcasts' refill race out of core: GPU tests and the float64 run
    LIMIT=150 run $MPI -np 2 python3 -m pytest -q -p no:cacheprovider --with-mpi tests/test_gpu.py \
        -k "out_of_core or every_comm"
    LIMIT=100 run $MPI -np 2 python3 -m summa bench --backend cupy --size 32768 --dtype float64 \
        --comm ipc --out-of-core --check --repeat 2 --timeout 60 --json "$OUT/oocipc.jsonl"
    ;;
suite2)  # the MPI tests on 2 GPUs, file by file (~3 min)
    mpi_tests 2
    ;;
ownfirst)  # issues 3, 8: own panels first under NCCL (small N) against ipc (~6 min)
    for args in "--size 16384 --dtype float32 --precision tf32" "--size 16384 --dtype float32" \
                "--size 16384 --dtype float64" "--size 8192 --dtype float64" \
                "--size 32768 --dtype float32 --nb 16384"; do
        for comm in nccl ipc; do
            LIMIT=60 run $MPI -np 2 python3 -m summa bench --backend cupy $args --comm $comm \
                --check --repeat 3 --timeout 60 --json "$OUT/ownfirst.jsonl"
        done
    done
    # the common order (lookahead 0: no overlap at all) as the floor
    LIMIT=60 run $MPI -np 2 python3 -m summa bench --backend cupy --size 16384 --dtype float32 \
        --precision tf32 --comm nccl --lookahead 0 --repeat 3 --json "$OUT/ownfirst.jsonl"
    export XLA_PYTHON_CLIENT_PREALLOCATE=false
    LIMIT=150 run python3 docs/scripts/compare_peers.py --size 16384 --dtype float32 \
        --precision tf32 --gpus 2 --repeat 2 --rounds 2 --peers summa,cupy,jax \
        --json "$OUT/peers.jsonl"
    ;;
hostgrid)  # issue 5: host-resident with uploads a step ahead (head/tail idle); issues 3, 8:
    # the block's orientation (the model prefers 1x2), and short runs' warm-up (TF32 N = 16384:
    # bench 489 against 635 inside compare_peers: clocks still ramping?)
    SUMMA_TEST_BACKEND=cupy LIMIT=60 run $MPI -np 2 python3 -m pytest -q -p no:cacheprovider \
        --with-mpi tests/test_gpu.py -k "partly or check_of_host" | tail -2
    for d in float64 float32; do
        LIMIT=100 run $MPI -np 2 python3 -m summa bench --backend cupy --size 32768 \
            --dtype $d --out-of-core --check --repeat 2 --timeout 60 --json "$OUT/ooc.jsonl"
    done
    for args in "--dtype float64 --grid 2x1" "--dtype float64 --grid 1x2" \
                "--dtype float32 --grid 2x1" "--dtype float32 --grid 1x2"; do
        LIMIT=60 run $MPI -np 2 python3 -m summa bench --backend cupy --size 32768 $args \
            --repeat 3 --json "$OUT/layout.jsonl"
    done
    for reps in "--warmup 1 --repeat 3" "--warmup 30 --repeat 10" "--warmup 1 --repeat 3"; do
        LIMIT=60 run $MPI -np 2 python3 -m summa bench --backend cupy --size 16384 \
            --dtype float32 --precision tf32 --comm nccl $reps --json "$OUT/warm.jsonl"
    done
    ;;
peers2)  # issues 3, 8: the same-run tables where summa was behind (JAX float64 and TF32,
    # cuBLASMp float32), each peer's best of two rounds in alternating order
    SUMMA_TEST_BACKEND=cupy LIMIT=60 run $MPI -np 2 python3 -m pytest -q -p no:cacheprovider \
        --with-mpi tests/test_gpu.py -k "partly or check_of_host" | tail -2
    export XLA_PYTHON_CLIENT_PREALLOCATE=false
    for args in "--size 32768 --dtype float64 --peers summa,jax,nvmath" \
                "--size 32768 --dtype float32 --peers summa,jax,nvmath" \
                "--size 16384 --dtype float32 --precision tf32 --peers summa,jax"; do
        LIMIT=150 run python3 docs/scripts/compare_peers.py $args --gpus 2 --repeat 3 \
            --rounds 2 --json "$OUT/peers.jsonl"
    done
    ;;
strips)  # issues 3, 8: column strips (every GEMM over all of K) against K panels, 2 GPUs
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
    ;;
transpose)  # issues 3, 8: A's panels copied transposed (cuBLAS reads a column-major A
    # faster: float64 56.6 against 52.1, float32 54.4 against 53.4 one GPU; JAX's layout)
    SUMMA_TEST_BACKEND=cupy LIMIT=90 run $MPI -np 2 python3 -m pytest -q -p no:cacheprovider \
        --with-mpi tests/test_gpu.py tests/test_transpose.py \
        -k "column_major or transposed" | tail -2
    LIMIT=60 run python3 docs/scripts/layout_probe.py float16 float32 tf32
    LIMIT=70 run python3 docs/scripts/split_probe.py float32 at
    for args in "--dtype float64" "--dtype float32" "--dtype float32 --schedule strips"; do
        for setting in auto no; do
            echo "SUMMA_TRANSPOSE_A=$setting $args"
            LIMIT=60 run $MPI -x SUMMA_TRANSPOSE_A=$setting -np 2 python3 -m summa bench \
                --backend cupy --size 32768 $args --check --repeat 3 --timeout 60 \
                --json "$OUT/transpose.jsonl" | grep -a -E "x 32768|rank   [01]|efficiency"
            [ "$args" = "--dtype float32 --schedule strips" ] && break  # strips keep A
        done
    done
    LIMIT=100 run python3 docs/scripts/compare_peers.py --size 32768 --dtype float64 --gpus 2 \
        --repeat 3 --rounds 2 --peers summa,jax --json "$OUT/peers.jsonl"
    ;;
transpose2)  # one GPU with A's panels transposed; the peers in every dtype (TF32 and float16
    # keep A row-major: layout_probe.py measured a column-major A slower there)
    for d in float64 float32; do
        LIMIT=60 run python3 -m summa bench --backend cupy --size 32768 --dtype $d --check \
            --repeat 3 --json "$OUT/transpose.jsonl" | grep -a -E "x 32768|rank   0|efficiency"
    done
    LIMIT=130 run python3 docs/scripts/compare_peers.py --size 32768 --dtype float32 --gpus 2 \
        --repeat 3 --rounds 2 --peers summa,nvmath,jax --json "$OUT/peers.jsonl"
    for args in "--dtype float32 --precision tf32" "--dtype float16"; do
        LIMIT=70 run python3 docs/scripts/compare_peers.py --size 32768 $args --gpus 2 \
            --repeat 3 --rounds 2 --peers summa,jax --json "$OUT/peers.jsonl"
    done
    ;;
ooct)  # issue 5: host-resident with A's parts transposed on the device, against without
    SUMMA_TEST_BACKEND=cupy LIMIT=70 run $MPI -np 2 python3 -m pytest -q -p no:cacheprovider \
        --with-mpi tests/test_gpu.py -k "out_of_core" | tail -1
    for d in float64 float32; do for setting in auto no; do
        echo "SUMMA_TRANSPOSE_A=$setting $d"
        LIMIT=75 run $MPI -x SUMMA_TRANSPOSE_A=$setting -np 2 python3 -m summa bench \
            --backend cupy --size 32768 --dtype $d --out-of-core --check --repeat 2 \
            --timeout 60 --json "$OUT/ooct.jsonl" | grep -a -E "x 32768|rank   [01]|efficiency|row-major"
    done; done
    ;;
big7)  # issue 5: N = 100,000 float64 in GPU memory with A's panels transposed (98.7-99.5
    # TFLOP/s before; goal 100); one GPU host-resident float32 (0.915 before); the watchdog
    # tests on 2 GPUs (never finished inside a shared call)
    LIMIT=150 run $MPI -np 2 python3 -m summa bench --backend cupy --size 100000 \
        --dtype float64 --check --repeat 1 --warmup 1 --no-ideal --timeout 60 \
        --json "$OUT/big7.jsonl" | grep -a -E "x 100000|rank   [01]"
    LIMIT=60 run python3 -m summa bench --backend cupy --size 32768 --dtype float32 \
        --out-of-core --check --repeat 2 --json "$OUT/big7.jsonl" \
        | grep -a -E "x 32768|efficiency|row-major|rank   0"
    TEST_FILES=tests/test_watchdog.py FILE_LIMIT=280 mpi_tests 2
    ;;
oocvar)  # issue 5: float64 host-resident on 2 GPUs at 0.905-0.925 of 2 x cupy.matmul (goal
    # 0.93); its GEMMs run 6-10 % slower than in memory beside NCCL and the PCIe copies. Which
    # knob closes it: NCCL's CTAs, copy engines (ipc), a deeper lookahead, wider panels?
    bench64() {  # label, then extra bench/mpirun arguments
        local label=$1; shift
        echo "== $label"
        LIMIT=75 run $MPI "${pre[@]}" -np 2 python3 -m summa bench --backend cupy --size 32768 \
            --dtype ${DTYPE:-float64} --out-of-core --check --repeat 2 --timeout 60 "$@" \
            --json "$OUT/oocvar.jsonl" | grep -a -E "x 32768|efficiency|row-major|rank   [01]"
    }
    pre=(); bench64 default
    pre=(-x NCCL_MAX_CTAS=4); bench64 ctas4 --no-ideal
    pre=(-x NCCL_MAX_CTAS=8); bench64 ctas8 --no-ideal
    pre=(); bench64 ipc --comm ipc --no-ideal
    pre=(); bench64 lookahead2 --lookahead 2 --no-ideal
    pre=(); bench64 nb8192 --nb 8192 --no-ideal
    pre=(); bench64 default-again
    pre=(); DTYPE=float32 bench64 float32
    ;;
oocauto)  # issue 5: auto now takes copy engines (ipc) out of core within a node (oocvar:
    # 102.9 against NCCL's 98.6 in float64): GPU tests, then auto against --comm nccl
    SUMMA_TEST_BACKEND=cupy LIMIT=120 run $MPI -np 2 python3 -m pytest -q -p no:cacheprovider \
        --with-mpi tests/test_gpu.py -k "out_of_core" | tail -1
    for d in float64 float32; do for c in auto nccl; do
        echo "== $d --comm $c"
        LIMIT=75 run $MPI -np 2 python3 -m summa bench --backend cupy --size 32768 --dtype $d \
            --out-of-core --comm $c --check --repeat 2 --timeout 60 --json "$OUT/oocauto.jsonl" \
            | grep -a -E "x 32768|summa bench|efficiency|row-major|memory plan|rank   [01]"
    done; done
    echo "== float64 --grid 1x2"
    LIMIT=75 run $MPI -np 2 python3 -m summa bench --backend cupy --size 32768 --grid 1x2 \
        --out-of-core --check --repeat 2 --timeout 60 --no-ideal --json "$OUT/oocauto.jsonl" \
        | grep -a -E "x 32768|summa bench|rank   [01]"
    ;;
big32auto)  # issue 5: N = 100,000 float32 host-resident under a 16 GiB cap with auto (ipc)
    hundred_k_f32 | grep -a -E "x 100000|summa bench|tiles|memory plan|rank   [01]"
    ;;
final8)  # issues 5, 8: host-resident summa (auto: ipc) against cuBLASXt on the same pinned
    # arrays; TF32 and float16 against JAX in three alternating rounds (1-3 % apart by call)
    for d in float64 float32; do
        LIMIT=120 run python3 docs/scripts/compare_peers.py --size 32768 --dtype $d --gpus 2 \
            --placement host --peers summa,cublasxt --repeat 2 --rounds 2 --json "$OUT/peers.jsonl"
    done
    for args in "--dtype float32 --precision tf32" "--dtype float16"; do
        LIMIT=110 run python3 docs/scripts/compare_peers.py --size 32768 $args --gpus 2 \
            --repeat 3 --rounds 3 --peers summa,jax --json "$OUT/peers.jsonl"
    done
    ;;
peers16)  # issue 8: N = 16384 against JAX and cuBLASMp, last measured before A's panels were
    # transposed (float32 96.9 against JAX's 99.7); alternating rounds, every dtype (~8 min)
    for args in "--dtype float64" "--dtype float32" "--dtype float32 --precision tf32" \
                "--dtype float16"; do
        peers=summa,jax; case "$args" in *tf32*|*float16*) ;; *) peers=summa,jax,nvmath ;; esac
        LIMIT=120 run python3 docs/scripts/compare_peers.py --size 16384 $args --gpus 2 \
            --repeat 3 --rounds 3 --peers $peers --peer-timeout 60 --json "$OUT/peers16.jsonl"
    done
    ;;
report1 | report2)  # issue 3's report table with today's code: report1 the N = 16384 lines of
    # docs/scripts/report_runs.txt, report2 the N = 32768 ones (each under 10 min)
    size=16384; [ "$STAGE" = report2 ] && size=32768
    grep -- "--size $size" docs/scripts/report_runs.txt | while read -r line; do
        set -- $line
        LIMIT=90 run $MPI -np "$1" python3 -m summa bench --backend cupy "${@:2}" --timeout 60 \
            --json "$OUT/report.jsonl" | grep -a -E "x $size|efficiency"
    done
    ;;
geo)  # issue 5: host-resident float64 on 2 GPUs idled ~14 ms before its first GEMM and
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
    ;;
s9check)  # issue 5: one GPU float64 host-resident against cuBLASXt (hostpeers' 120 s limit
    # cut it); the GPU tests of the doubling head / shrinking tail and of session 8's changes
    LIMIT=400 run python3 docs/scripts/compare_peers.py --size 32768 --dtype float64 --gpus 1 \
        --placement host --peers summa,cublasxt --repeat 2 --rounds 2 --json "$OUT/hostpeers.jsonl"
    TEST_FILES="tests/test_gpu.py tests/test_outofcore.py" mpi_tests 2
    TEST_FILES="tests/test_algorithm.py tests/test_gpu.py tests/test_outofcore.py" mpi_tests 1
    ;;
knobs16)  # issue 8: at N = 16384 summa trailed JAX in float64 (0.9 %) and TF32 (2 %, auto
    # took NCCL there) and cuBLASMp in float32 (3 %): broadcaster and panel width per dtype
    for args in "float32 --precision tf32 --comm nccl --nb 8192" \
                "float32 --precision tf32 --comm ipc --nb 8192" \
                "float32 --precision tf32 --comm ipc --nb 4096" \
                "float32 --precision tf32 --comm nccl --nb 4096" \
                "float32 --comm ipc --nb 8192" "float32 --comm ipc --nb 4096" \
                "float32 --comm nccl --nb 4096" "float64 --comm ipc --nb 4096" \
                "float64 --comm ipc --nb 8192" "float64 --comm nccl --nb 4096"; do
        LIMIT=60 run $MPI -np 2 python3 -m summa bench --backend cupy --size 16384 --dtype $args \
            --repeat 5 --timeout 30 --json "$OUT/knobs16.jsonl" | grep -a -E "x 16384"
    done
    bench_table "$OUT/knobs16.jsonl" dtype precision comm nb tflops efficiency
    ;;
why16)  # issue 8: where the time goes at N = 16384 (knobs16: float32 ipc nb 8192 0.954 of
    # the ideal, float64 0.921, TF32 NCCL 0.80): the rank lines, other schedules and grids
    for args in "float32" "float32 --schedule strips" "float32 --grid 1x2" \
                "float32 --lookahead 2" "float64" "float64 --schedule strips" \
                "float64 --grid 1x2" "float32 --precision tf32" \
                "float32 --precision tf32 --schedule strips" "float32 --precision tf32 --grid 1x2" \
                "float32 --precision tf32 --lookahead 0" "float16"; do
        echo "== $args"
        LIMIT=60 run $MPI -np 2 python3 -m summa bench --backend cupy --size 16384 --dtype $args \
            --repeat 5 --timeout 30 --json "$OUT/why16.jsonl" \
            | grep -a -E "x 16384|efficiency|row-major|rank   [01]"
    done
    ;;
grids)  # issues 3, 8: why16 found float64 at N = 16384 109.8 TFLOP/s on a 1x2 grid against
    # 100.3 on the default 2x1 (the per-rank GEMM's shape): both grids, every dtype, both sizes
    for size in 16384 32768; do
        for args in "float64" "float32" "float32 --precision tf32" "float16"; do
            for g in 2x1 1x2; do
                LIMIT=60 run $MPI -np 2 python3 -m summa bench --backend cupy --size $size \
                    --grid $g --dtype $args --repeat 4 --timeout 30 --json "$OUT/grids.jsonl" \
                    | grep -a -E " x $size"
            done
        done
    done
    bench_table "$OUT/grids.jsonl" m dtype precision grid comm tflops efficiency
    ;;
grid64)  # issues 3, 8: float64 on GPUs now defaults to blocks taller than wide (1x2 on 2
    # ranks): against JAX (and cuBLASMp) at both sizes; the GPU tests on 2 ranks
    LIMIT=120 run python3 docs/scripts/compare_peers.py --size 16384 --dtype float64 --gpus 2 \
        --repeat 3 --rounds 3 --peers summa,jax,nvmath --peer-timeout 60 --json "$OUT/grid64.jsonl"
    LIMIT=150 run python3 docs/scripts/compare_peers.py --size 32768 --dtype float64 --gpus 2 \
        --repeat 3 --rounds 2 --peers summa,jax --peer-timeout 60 --json "$OUT/grid64.jsonl"
    TEST_FILES=tests/test_gpu.py mpi_tests 2
    ;;
paired16)  # issue 8: TF32 at N = 16384 trails JAX (638 / 651): NCCL's kernels slow its 11 ms
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
    ;;
keep)  # issue 8: peers' blocks kept open between multiplies (auto: opened by the first
    # multiply, free from the second; on branch history-auto NCCL first, opened by the
    # second): the GPU tests it touches on 2 ranks, then bench's auto at N = 16384 and 8192
    # in every dtype (session 10: TF32 712.5 against NCCL's 646.0)
    TEST_FILES="tests/test_gpu.py tests/test_algorithm.py tests/test_strips.py" mpi_tests 2
    for size in 16384 8192; do
    for dtype in "float32 --precision tf32" "float16" "float32" "float64"; do
        echo "== $size $dtype auto"
        LIMIT=60 run $MPI -np 2 python3 -m summa bench --backend cupy --size $size \
            --dtype $dtype --repeat 5 --timeout 30 --check --json "$OUT/keep.jsonl" \
            | grep -a -E "x $size|rank   [01]"
    done
    done
    bench_table "$OUT/keep.jsonl" m dtype precision grid comm tflops efficiency
    ;;
peers32)  # issue 8: N = 32768 against JAX after blocks stay open (1 GiB float32, 2 GiB
    # float64: within 1/64 of an H200), two alternating rounds per dtype (~5 min)
    for args in "--dtype float32 --precision tf32" "--dtype float16" "--dtype float32" \
                "--dtype float64"; do
        LIMIT=120 run python3 docs/scripts/compare_peers.py --size 32768 $args --gpus 2 \
            --repeat 2 --rounds 2 --peers summa,jax --peer-timeout 60 --json "$OUT/peers32.jsonl"
    done
    ;;
loops)  # blocks kept open: a loop over the same B against one making a new B every call,
    # auto against nccl (docs/scripts/operand_loop_probe.py); first the GPU tests that cover
    # ipc's release and free (readers close before the barrier; free's barrier does not block)
    TEST_FILES="tests/test_gpu.py tests/test_algorithm.py" mpi_tests 2
    for args in "--size 16384 --dtype float32 --precision tf32" "--size 8192 --dtype float16" \
                "--size 8192 --dtype float64" "--size 16384 --dtype float64"; do
        LIMIT=90 run $MPI -np 2 python3 docs/scripts/operand_loop_probe.py $args --calls 8
    done
    ;;
f32lt16)  # issue 8: float32 at N = 16384 trails cuBLASMp by 3 % (102.1 / 105.3): summa's
    # GEMMs take 84.8 ms against 82 ms as one GEMM. Is cuBLASLt's timed float32 GEMM faster
    # at these shapes (one GPU: cupy.matmul against nvmath's autotuned cuBLASLt), and summa
    # with SUMMA_GEMM=cublaslt? Alternating, two rounds.
    LIMIT=120 run python3 docs/scripts/compare_peers.py --size 16384 --dtype float32 --gpus 1 \
        --peers cupy,nvmathlt --repeat 5 --rounds 3 --json "$OUT/f32lt16.jsonl"
    for lib in cublas cublaslt cublaslt cublas; do
        echo "SUMMA_GEMM=$lib"
        LIMIT=50 run $MPI -x SUMMA_GEMM=$lib -np 2 python3 -m summa bench --backend cupy \
            --size 16384 --dtype float32 --repeat 5 --timeout 60 --json "$OUT/f32lt16-bench.jsonl" \
            | grep -a -E "x 16384|rank   [01]|efficiency"
    done
    ;;
hostpeers)  # issues 5, 8: host-resident summa against cuBLASXt on 1 and 2 GPUs in the same
    # call (1 GPU last compared before A's parts were transposed); float64 was 1.24x on 2 GPUs
    for g in 1 2; do for d in float64 float32; do  # one GPU float64: ~150 s (3 rounds)
        LIMIT=$((g == 1 ? 240 : 150)) run python3 docs/scripts/compare_peers.py --size 32768 --dtype $d --gpus $g \
            --placement host --peers summa,cublasxt --repeat 2 --rounds 3 --json "$OUT/hostpeers.jsonl"
    done; done
    ;;
lt2)  # issues 3, 8: TF32 and float16 trail JAX by 1.5 / 0.2 %; JAX calls cuBLASLt, whose
    # TF32 GEMM timed 344 against gemmEx's 324 TFLOP/s (evening session): the library per dtype?
    for args in "--dtype float32 --precision tf32" "--dtype float16"; do
        for lib in cublas cublaslt; do
            echo "SUMMA_GEMM=$lib $args"
            LIMIT=50 run $MPI -x SUMMA_GEMM=$lib -np 2 python3 -m summa bench --backend cupy \
                --size 32768 $args --check --repeat 3 --timeout 60 --json "$OUT/lt2.jsonl" \
                | grep -a -E "x 32768|rank   [01]|efficiency"
        done
        LIMIT=70 run env SUMMA_GEMM=cublaslt python3 docs/scripts/compare_peers.py \
            --size 32768 $args --gpus 2 --repeat 3 --rounds 2 --peers summa,jax \
            --json "$OUT/peers.jsonl"
    done
    ;;
ctas)  # issues 3, 5: NCCL's kernels spin on SMs while they wait for the peer (out of core:
    # broadcasts busy 0.45 of 0.77 s, GEMMs 4-9 % slow); fewer CTAs, still hidden behind GEMMs?
    for ctas in default 2 8; do
        pass=()
        [ "$ctas" = default ] || pass=(-x NCCL_MAX_CTAS=$ctas)
        for args in "--dtype float32 --out-of-core" "--dtype float64 --out-of-core" \
                    "--dtype float32" "--dtype float32 --precision tf32"; do
            echo "NCCL_MAX_CTAS=$ctas $args"
            LIMIT=100 run $MPI "${pass[@]}" -np 2 python3 -m summa bench --backend cupy \
                --size 32768 $args --comm nccl --check --repeat 2 --timeout 60 \
                --json "$OUT/ctas-$ctas.jsonl" | grep -a -E "x 32768|rank   [01]"
        done
    done
    ;;
layout)  # issues 3, 8: GEMM rate against operand layout; the layouts XLA gives JAX's matmul
    export XLA_PYTHON_CLIENT_PREALLOCATE=false
    LIMIT=120 run python3 docs/scripts/layout_probe.py float64 float32
    for d in float32 float64; do LIMIT=90 run python3 docs/scripts/split_probe.py $d; done
    for grid in 2x1 1x2 2x1 1x2; do  # the block's orientation, as the probe's second shape
        LIMIT=60 run $MPI -np 2 python3 -m summa bench --backend cupy --size 32768 \
            --dtype float64 --grid $grid --repeat 3 --json "$OUT/layout.jsonl"
    done
    XLA_FLAGS="--xla_dump_to=$OUT/xla --xla_dump_hlo_as_text" LIMIT=90 run python3 \
        docs/scripts/compare_peers.py --size 32768 --dtype float64 --gpus 2 --repeat 1 --peers jax
    run bash -c "grep -h -E 'custom-call|all-gather|dot\\(' $OUT/xla/*after_optimizations.txt \
        | grep -v threefry | cut -c1-900 | sort -u | head -20"
    ;;
ipcopen)  # issue 3: the cost of opening a peer's memory against its size (ipc's set-up)
    LIMIT=60 run $MPI -np 2 python3 docs/scripts/ipc_open_probe.py
    ;;
ooc)
    for p in 1 2; do for d in float64 float32; do
        LIMIT=150 run $MPI -np $p python3 -m summa bench --backend cupy --size 32768 \
            --dtype $d --out-of-core --check --repeat 2 --timeout 60 --json "$OUT/ooc.jsonl"
        LIMIT=90 run python3 docs/scripts/compare_peers.py --size 32768 --dtype $d --gpus $p \
            --placement host --peers cublasxt --repeat 2 --json "$OUT/peers.jsonl"
    done; done
    hundred_k
    ;;
headline)  # issue 5's large cases, cuBLASXt on host data, JAX on device data
    hundred_k
    for d in float64 float32; do
        LIMIT=150 run $MPI -np 1 python3 -m summa bench --backend cupy --size 32768 \
            --dtype $d --out-of-core --check --repeat 2 --timeout 60 --json "$OUT/ooc.jsonl"
        for p in 1 2; do
            LIMIT=40 run python3 docs/scripts/compare_peers.py --size 32768 --dtype $d \
                --gpus $p --placement host --peers cublasxt --repeat 2 --json "$OUT/peers.jsonl"
        done
    done
    for args in "--dtype float64" "--dtype float32" "--dtype float32 --precision tf32" \
                "--dtype float16"; do
        LIMIT=45 run python3 docs/scripts/compare_peers.py --size 32768 $args --gpus 2 \
            --repeat 2 --peers cupy,jax --json "$OUT/peers.jsonl"
    done
    ;;
files)
    run python3 -c "
import numpy as np
from numpy.lib.format import open_memmap
rng = np.random.default_rng(1)
for name in ('A', 'B'):
    m = open_memmap('/tmp/' + name + '.npy', mode='w+', dtype=np.float64, shape=(32768, 32768))
    for r in range(0, 32768, 4096):
        m[r:r + 4096] = rng.uniform(-1, 1, (4096, 32768))
    m.flush()
"
    run $MPI -np 2 python3 -m summa multiply /tmp/A.npy /tmp/B.npy -o /tmp/C.npy --check \
        --quiet --json "$OUT/files.jsonl"
    ;;
model)  # issue 7: calibrate on 1 and 2 GPUs; strong (3 sizes) and weak runs; model vs measured
    # One broadcaster per call, so that trouble with one (ipc) cannot cost the others;
    # NCCL last, whose per-step overhead (fitted on its own runs) the profile keeps.
    for comm in mpi ipc; do
        LIMIT=90 run $MPI -np 2 python3 -m summa calibrate -o "$OUT/profile.json" --append \
            --dtypes float64 --comm $comm --sizes 4096 --widths 1024
    done
    for p in 1 2; do
        LIMIT=120 run $MPI -np $p python3 -m summa calibrate -o "$OUT/profile.json" --append \
            --dtypes float64 --comm nccl
    done
    # --comm nccl: the runs the NCCL terms are checked on (auto takes ipc, checked below)
    for p in 1 2; do for n in 8192 16384 32768; do
        LIMIT=60 run $MPI -np $p python3 -m summa bench --backend cupy --size $n --repeat 2 \
            --comm nccl --json "$OUT/strong.jsonl"
    done; done
    # weak scaling: the same work per GPU, N = 16384 x P^(1/3)
    LIMIT=60 run $MPI -np 1 python3 -m summa bench --backend cupy --size 16384 --repeat 2 \
        --comm nccl --json "$OUT/weak.jsonl"
    LIMIT=60 run $MPI -np 2 python3 -m summa bench --backend cupy --size 20643 --repeat 2 \
        --comm nccl --json "$OUT/weak.jsonl"
    run python3 docs/scripts/validate_model.py --profile "$OUT/profile.json" \
        --results "$OUT/strong.jsonl" "$OUT/weak.jsonl"
    # auto on one node: direct copies (ipc), modelled since the late session
    for n in 16384 32768; do
        LIMIT=60 run $MPI -np 2 python3 -m summa bench --backend cupy --size $n --repeat 2 \
            --json "$OUT/auto.jsonl"
    done
    run python3 docs/scripts/validate_model.py --profile "$OUT/profile.json" \
        --results "$OUT/auto.jsonl"
    run python3 -m summa model --profile "$OUT/profile.json" --size 32768 --sweep
    run python3 -m summa plot "$OUT/strong.jsonl" --weak "$OUT/weak.jsonl" \
        --profile "$OUT/profile.json" -o "$OUT/scaling.png"
    ;;
probe)  # issue 3/8: which cuBLAS each library loads, and whose one-GPU GEMM is faster
    export XLA_PYTHON_CLIENT_PREALLOCATE=false
    LIMIT=150 run python3 docs/scripts/cublas_probe.py
    lt=$(grep -a '^JAX_CUBLASLT=' "$OUT/session.log" | tail -1 | cut -d= -f2)
    # summa's GEMMs on JAX's own cuBLASLt (another CUDA release): is the release the gap?
    if [ -n "$lt" ]; then
        LIMIT=60 SUMMA_GEMM=cublaslt SUMMA_CUBLASLT=$lt run $MPI -np 2 python3 -m summa bench \
            --backend cupy --size 32768 --dtype float64 --check --repeat 3 --json "$OUT/probe.jsonl"
    fi
    XLA_FLAGS="--xla_dump_to=/tmp/xla --xla_dump_hlo_as_text" LIMIT=90 run python3 \
        docs/scripts/compare_peers.py --size 32768 --dtype float64 --gpus 2 --repeat 1 --peers jax
    run bash -c "grep -h -E 'custom-call|dot\\(' /tmp/xla/*jit*matmul*after_optimizations.txt \
        /tmp/xla/*after_optimizations.txt 2>/dev/null | grep -v threefry | cut -c1-600 | sort -u | head -20"
    ;;
sweep)  # issue 21: the randomized sweep and schedule x broadcaster x lookahead tests on
        # 1, 2, 3 ranks (sharing the GPUs where there are fewer), then the issue's commands
    for n in ${RANKS:-1 2 3}; do
        SUMMA_TEST_BACKEND=cupy SUMMA_SWEEP_CASES=${CASES:-300} SUMMA_SWEEP_RECORD=$OUT/sweep.jsonl \
            LIMIT=${SWEEP_LIMIT:-240} run $MPI -np $n python3 -m pytest -q --with-mpi -m mpi \
            -p no:cacheprovider tests/test_sweep.py tests/test_gpu.py tests/test_strips.py \
            -k "sweep or schedule_broadcaster or strips"
    done
    LIMIT=60 run $MPI -np 3 python3 -m summa bench --backend cupy --size 2000 --schedule strips --check
    LIMIT=60 run $MPI -np 3 python3 -m summa bench --backend cupy --m 29 --n 105 --k 14 \
        --schedule strips --nb 175 --check
    cat "$OUT/sweep.jsonl"
    ;;
seed)  # issue 22: staged host copies tested, their rates, then the user's case end to end
    for n in ${RANKS-1 2}; do
        SUMMA_TEST_BACKEND=cupy SUMMA_SWEEP_CASES=${CASES:-100} SUMMA_SWEEP_RECORD=$OUT/sweep.jsonl \
            LIMIT=150 run $MPI -np $n python3 -m pytest -q --with-mpi -m mpi -p no:cacheprovider \
            tests/test_sweep.py tests/test_gpu.py tests/test_strips.py tests/test_multiply.py \
            -k "sweep or stream or out_of_core or strips or numpy_arrays"
    done
    LIMIT=60 run python3 -m pytest -q -p no:cacheprovider tests/test_staging.py tests/test_multiply.py
    [ -n "${PROBE:-}" ] && LIMIT=90 run python3 docs/scripts/host_copy_probe.py --gib 4 \
        --threads ${THREADS:-1,4,8,16}
    [ -n "${PROFILE:-}" ] && LIMIT=60 run python3 docs/scripts/host_copy_probe.py --profile 16384
    LIMIT=300 run python3 docs/scripts/seed_case.py --sizes ${SIZES:-16384,40960} --dtype float64 \
        --free 24GiB --modes ${MODES:-stage} --json "$OUT/seed.jsonl"
    [ -n "${F32:-57344}" ] && LIMIT=200 run python3 docs/scripts/seed_case.py --sizes ${F32:-57344} \
        --dtype float32 --free 24GiB --peers "${F32_PEERS:-cublasxt}" --json "$OUT/seed.jsonl"
    ;;
s12)  # issues 22-25: the GPU tests of node-shared arrays, the pool and INT8 products;
      # where the user's N = 16384 call spends its time; INT8 rates; then files23
    LIMIT=120 SUMMA_TEST_BACKEND=cupy run python3 -m pytest -q -p no:cacheprovider --with-mpi \
        tests/test_gpu.py tests/test_host.py tests/test_pool.py tests/test_staging.py \
        tests/test_ozaki.py -k "int8 or host or pool or stag or ozaki or peer"
    SUMMA_TEST_BACKEND=cupy LIMIT=120 run $MPI -np 2 python3 -m pytest -q --with-mpi -m mpi \
        -p no:cacheprovider tests/test_host.py tests/test_multiply.py tests/test_gpu.py \
        -k "host or numpy_arrays or shared or own or int8"
    LIMIT=150 run python3 docs/scripts/seed_tuning.py --size ${SIZE:-16384} --json "$OUT/tuning.jsonl"
    LIMIT=90 run python3 docs/scripts/ozaki_probe.py --sizes 16384,32768 --json "$OUT/ozaki.jsonl"
    [ -n "${FILES:-1}" ] && LIMIT=${FILES_LIMIT:-300} MPIEXEC="$MPI" run python3 \
        docs/scripts/files_case.py --size 24576 --dir /tmp/summa-files --ranks 1 \
        --device-memory 8GiB --json "$OUT/files.jsonl"
    rm -rf /tmp/summa-files
    ;;
s12b)  # issue 25: the INT8 GPU tests, the fused product's rates, phases and errors
       # against native DGEMM and cuBLAS's emulation, then through SUMMA (bench)
    LIMIT=150 SUMMA_TEST_BACKEND=cupy run python3 -m pytest -q -p no:cacheprovider --with-mpi \
        tests/test_gpu.py -k "int8"
    LIMIT=240 run python3 docs/scripts/ozaki_probe.py --sizes ${SIZES:-16384,32768} \
        --json "$OUT/ozaki.jsonl"
    for args in "--precision default" "--precision fp64-int8" "--precision fp64-int8 --nb 32768" \
                "--precision fp64-int8 --out-of-core --device-memory 48GiB"; do
        LIMIT=90 run python3 -m summa bench --backend cupy --size 32768 --dtype float64 $args \
            --check --repeat 2 --no-ideal --json "$OUT/bench.jsonl"
    done
    ;;
s12c)  # issues 22-25, last of session 12: the new GPU tests, fp64-int8 at 32768 and out of
       # core, the files case with the host's memory stated, the user's case at 40960
    LIMIT=150 SUMMA_TEST_BACKEND=cupy run python3 -m pytest -q -p no:cacheprovider --with-mpi \
        tests/test_gpu.py tests/test_pool.py tests/test_staging.py \
        -k "int8 or fp64 or stager or multiply_command or ring"
    LIMIT=120 run python3 docs/scripts/ozaki_probe.py --sizes 32768 --moduli auto,14 \
        --json "$OUT/ozaki.jsonl"
    for args in "--out-of-core --device-memory 64GiB --nb 16384" "--out-of-core --device-memory 24GiB"; do
        LIMIT=90 run python3 -m summa bench --backend cupy --size 32768 --dtype float64 \
            --precision fp64-int8 $args --check --repeat 2 --no-ideal --json "$OUT/bench.jsonl"
    done
    run bash -c "free -g; cat /sys/fs/cgroup/memory.max 2>/dev/null; df -h /tmp | tail -1"
    LIMIT=200 MPIEXEC="$MPI" run python3 docs/scripts/files_case.py --size 24576 \
        --dir /tmp/summa-files --ranks 1 --device-memory 8GiB --json "$OUT/files.jsonl"
    rm -rf /tmp/summa-files
    LIMIT=150 run python3 docs/scripts/seed_case.py --sizes 40960 --dtype float64 --free 24GiB \
        --peers cublasxt --json "$OUT/seed.jsonl"
    ;;
next)  # the next one-GPU session's first call: the new GPU tests (fp64-int8 overlap, files
       # straight to the GPU), fp64-int8 variants, the files case with its read parts, the pool's
       # own cost with one GPU (issue 24), the user's case again
    LIMIT=200 SUMMA_TEST_BACKEND=cupy run python3 -m pytest -q -p no:cacheprovider --with-mpi \
        tests/test_gpu.py tests/test_staging.py tests/test_multiply.py -k \
        "int8 or fp64 or stager or npy or ring or mapped or streams"
    LIMIT=150 run python3 docs/scripts/ozaki_probe.py --sizes 32768 --moduli auto \
        --variants "SUMMA_FP64_INT8_OVERLAP=1;SUMMA_FP64_INT8_OVERLAP=1,SUMMA_FP64_INT8_PLANES=2;SUMMA_FP64_INT8_PLANES=8" \
        --json "$OUT/ozaki.jsonl"
    # a page cache smaller than the machine (a container's memory limit) would explain warm
    # reads at disk speed in session 12: what limits it?
    run bash -c "cat /sys/fs/cgroup/memory.max /sys/fs/cgroup/memory/memory.limit_in_bytes \
        /proc/meminfo 2>/dev/null | head -8"
    LIMIT=240 MPIEXEC="$MPI" run python3 docs/scripts/files_case.py --size 24576 \
        --dir /tmp/summa-files --ranks 1 --device-memory 8GiB --json "$OUT/files.jsonl"
    rm -rf /tmp/summa-files
    LIMIT=200 run python3 docs/scripts/seed_case.py --sizes 16384,40960 --dtype float64 \
        --free 24GiB --pool --peers "" --json "$OUT/seed.jsonl"
    ;;
s27)  # issue 27 on every GPU of a multi-GPU kind: the user's case from a plain process (the
      # pool) against cuBLASXt on all GPUs, the same under mpirun (arrays on rank 0, node-shared),
      # fp64-int8 on every GPU against one GPU's emulated rate
    P=$(python3 -c "import cupy; print(cupy.cuda.runtime.getDeviceCount())")
    LIMIT=400 run python3 docs/scripts/seed_case.py --sizes ${SIZES:-65536} --dtype float64 \
        --free 24GiB --peers cublasxt --json "$OUT/seed.jsonl"
    for arrays in root shared; do
        LIMIT=300 run $MPI -np $P python3 docs/scripts/seed_mpi.py --size ${SIZE:-65536} \
            --arrays $arrays --json "$OUT/seed.jsonl"
    done
    for np_ in 1 $P; do
        LIMIT=150 run $MPI -np $np_ python3 -m summa bench --backend cupy --size 65536 \
            --dtype float64 --precision fp64-int8 --check --repeat 2 --no-ideal \
            --json "$OUT/int8.jsonl"
    done
    ;;
files23)  # issue 23: multiply from .npy files, in memory and streamed out of core, cold and
          # warm, against the same disk's parallel read and write rates
    LIMIT=${FILES_LIMIT:-420} MPIEXEC="$MPI" run python3 docs/scripts/files_case.py \
        --size ${SIZE:-24576} --dir ${FILES_DIR:-/tmp/summa-files} --ranks ${RANKS:-1} \
        --device-memory ${CAP:-8GiB} --json "$OUT/files.jsonl"
    rm -rf "${FILES_DIR:-/tmp/summa-files}"
    ;;
peers)  # issue 8: one table per dtype, every peer on the same GPUs and the same data
    for args in "--dtype float64" "--dtype float32 --precision tf32" "--dtype float16" \
                "--dtype float32"; do
        LIMIT=${PEER_LIMIT:-150} run python3 docs/scripts/compare_peers.py --size ${SIZE:-32768} \
            $args --gpus 2 --repeat 2 --peers summa,cupy,jax,dask,nvmath --peer-timeout ${PEER_TIMEOUT:-90} \
            --json "$OUT/peers.jsonl"
    done
    ;;
*) echo "unknown STAGE ${STAGE}" >&2; exit 2 ;;
esac
