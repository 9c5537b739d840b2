"""The same multiply through summa and its peers, on the same GPUs, in one run.

Every entry runs in its own process, so each has the GPUs to itself:

* summa      ``MPIEXEC -np GPUS python3 -m summa bench`` (its defaults: ``--comm auto``, the
             default grid; with --placement host: out of core)
* cupy       ``cupy.matmul`` on one GPU: the per-GPU ceiling; ideal = GPUS x this rate
* nvmathlt   nvmath-python's cuBLASLt matmul on one GPU, autotuned (another per-GPU figure)
* jax        ``jnp.matmul`` under ``jit`` on a 1-D mesh of the GPUs, rows of A and columns of
             B sharded (precision HIGHEST for float32, DEFAULT for tf32 and float16)
* cublasxt   ``cublasXt<t>gemm`` through ctypes on pinned host arrays (host data only)
* dask       dask.array with CuPy chunks on a dask-cuda LocalCUDACluster, if installed
* nvmath     nvmath-python's distributed matmul (cuBLASMp), if installed

Every peer multiplies the same kind of data (--data; summa's own is ``uniform``,
values in [-1, 1)): a GPU's clocks, and so a GEMM's speed, depend on the values
it multiplies (fewer toggling bits draw less power), so peers are only compared
on like data. Peers that are not installed, or that do not apply to the
placement, are listed with the reason. TFLOP/s count 2 N^3 (8 N^3 complex) over the best of --repeat.
A peer that ran and failed (an error, a non-zero exit, no answer in --peer-timeout) is
listed as failed, and the script then exits 1.

The MPI launcher (--mpirun) is $SUMMA_MPIEXEC (what ./run exports), else $MPIEXEC,
else the mpiexec beside this Python (./run's venv), else mpiexec or mpirun on PATH.

    python3 benchmarks/peers.py --size 32768 --dtype float64 --gpus 2
    python3 benchmarks/peers.py --size 32768 --dtype float32 --precision tf32
    python3 benchmarks/peers.py --size 32768 --dtype float64 --placement host
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

import calls  # JSON lines stamped with machine, date, command

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PEERS = ("summa", "cupy", "nvmathlt", "jax", "cublasxt", "dask", "nvmath")


def default_launcher(environ=None) -> str:
    """The MPI launcher peers start under: ``SUMMA_MPIEXEC`` (./run exports
    it, with its MPIEXEC_ARGS), else ``MPIEXEC``, else the ``mpiexec`` beside
    this Python (the venv's MPICH), else ``mpiexec`` or ``mpirun`` on PATH.
    No options are added: Open MPI's ``--oversubscribe`` is refused by MPICH's
    mpiexec, so a launcher that needs one says so in the variable."""
    environ = os.environ if environ is None else environ
    for name in ("SUMMA_MPIEXEC", "MPIEXEC"):
        if environ.get(name, "").strip():
            return environ[name].strip()
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.access(here, os.X_OK):
        return here
    return shutil.which("mpiexec") or shutil.which("mpirun") or "mpiexec"


def _timed(run, repeat):
    run()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - t0)
    return best


def _cupy_draw(args, seed: int):
    """A function of a shape giving CuPy values as --data says."""
    import cupy
    rng = cupy.random.default_rng(seed)
    return {"uniform": lambda shape: rng.uniform(-1, 1, shape),
            "uniform01": lambda shape: rng.random(shape),
            "normal": lambda shape: rng.standard_normal(shape)}[args.data]


def _cupy_operands(args):
    """A and B for the one-GPU peers, values as --data says."""
    draw, shape = _cupy_draw(args, 1), (args.size, args.size)
    return draw(shape).astype(args.dtype), draw(shape).astype(args.dtype)


def peer_cupy(args):
    import cupy
    n, dt = args.size, args.dtype
    a, b = _cupy_operands(args)
    c = cupy.empty((n, n), dtype=dt)
    if args.precision == "tf32":
        os.environ["CUPY_TF32"] = "1"

    def run():
        cupy.matmul(a, b, out=c)
        cupy.cuda.Device().synchronize()
    return {"seconds": _timed(run, args.repeat), "gpus": 1}


def peer_jax(args):
    if args.placement == "host":
        raise RuntimeError("skipped: JAX computes on device-resident arrays only")
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    if args.dtype in ("float64", "complex128"):
        jax.config.update("jax_enable_x64", True)
    devices = jax.devices()[:args.gpus]
    mesh = Mesh(np.array(devices), ("x",))
    rows, cols = NamedSharding(mesh, P("x", None)), NamedSharding(mesh, P(None, "x"))
    key1, key2 = jax.random.split(jax.random.PRNGKey(0))
    shape = (args.size, args.size)
    draw = {"uniform": lambda k: jax.random.uniform(k, shape, args.dtype, -1.0, 1.0),
            "uniform01": lambda k: jax.random.uniform(k, shape, args.dtype),
            "normal": lambda k: jax.random.normal(k, shape, args.dtype)}[args.data]
    a = jax.jit(draw, out_shardings=rows)(key1)
    b = jax.jit(draw, out_shardings=cols)(key2)
    precision = (jax.lax.Precision.DEFAULT if args.precision == "tf32"
                 or args.dtype == "float16" else jax.lax.Precision.HIGHEST)
    f = jax.jit(lambda a, b: jnp.matmul(a, b, precision=precision), out_shardings=rows)
    return {"seconds": _timed(lambda: f(a, b).block_until_ready(), args.repeat),
            "gpus": len(devices), "precision": str(precision)}


def _libcublas():
    import ctypes
    import ctypes.util
    candidates = []
    try:
        import nvidia.cublas as wheel
        lib = os.path.join(list(wheel.__path__)[0], "lib")
        candidates += sorted(os.path.join(lib, f) for f in os.listdir(lib)
                             if f.startswith("libcublas.so"))
    except (ImportError, OSError):
        pass
    found = ctypes.util.find_library("cublas")
    candidates += [found] if found else []
    candidates += ["libcublas.so.13", "libcublas.so.12", "libcublas.so"]
    for path in candidates:
        try:
            return ctypes.CDLL(path)
        except OSError:
            continue
    raise RuntimeError("skipped: no libcublas found")


def peer_cublasxt(args):
    import ctypes
    import cupyx
    import numpy as np
    kinds = {"float64": ("D", ctypes.c_double), "float32": ("S", ctypes.c_float)}
    if args.dtype not in kinds or args.precision == "tf32":
        raise RuntimeError("skipped: cublasXt is timed for float64 and float32 here")
    letter, scalar = kinds[args.dtype]
    lib = _libcublas()
    handle = ctypes.c_void_p()
    if lib.cublasXtCreate(ctypes.byref(handle)) != 0:
        raise RuntimeError("cublasXtCreate failed")
    devices = (ctypes.c_int * args.gpus)(*range(args.gpus))
    lib.cublasXtDeviceSelect(handle, args.gpus, devices)
    lib.cublasXtSetBlockDim(handle, 8192)
    n = args.size
    rng = np.random.default_rng(1)
    arrays = []
    for _ in range(3):
        x = cupyx.empty_pinned((n, n), dtype=args.dtype)
        if args.data == "normal":  # in place: no n x n temporary
            rng.standard_normal(out=x, dtype=x.dtype)
        else:
            rng.random(out=x, dtype=x.dtype)
            if args.data == "uniform":
                x *= 2
                x -= 1
        arrays.append(x)
    a, b, c = arrays
    gemm = getattr(lib, f"cublasXt{letter}gemm")
    # Sizes and leading dimensions are size_t: without argtypes ctypes would pass ints.
    size, ptr, op = ctypes.c_size_t, ctypes.c_void_p, ctypes.c_int
    gemm.argtypes = [ptr, op, op, size, size, size, ctypes.POINTER(scalar), ptr, size, ptr, size,
                     ctypes.POINTER(scalar), ptr, size]
    one, zero = scalar(1.0), scalar(0.0)

    def run():
        status = gemm(handle, 0, 0, n, n, n, ctypes.byref(one), a.ctypes.data_as(ctypes.c_void_p),
                      n, b.ctypes.data_as(ctypes.c_void_p), n, ctypes.byref(zero),
                      c.ctypes.data_as(ctypes.c_void_p), n)
        if status != 0:
            raise RuntimeError(f"cublasXt{letter}gemm returned {status}")
    seconds = _timed(run, args.repeat)
    lib.cublasXtDestroy(handle)
    return {"seconds": seconds, "gpus": args.gpus, "placement": "host (pinned)"}


def peer_dask(args):
    try:
        import dask.array as da
        from dask_cuda import LocalCUDACluster
        from distributed import Client, wait
    except ImportError as exc:
        raise RuntimeError(f"skipped: {exc.name} is not installed") from None
    import cupy
    chunk = args.size // args.gpus
    if args.precision == "tf32":
        os.environ["CUPY_TF32"] = "1"  # before the workers start: they inherit it

    def _synchronize():  # runs on each worker (pickled by value)
        import cupy
        cupy.cuda.Device().synchronize()

    with LocalCUDACluster(n_workers=args.gpus) as cluster, Client(cluster) as client:
        rs = da.random.RandomState(RandomState=cupy.random.RandomState)
        shape = (args.size, args.size)
        draw = {"uniform": lambda: rs.uniform(-1, 1, shape, chunks=chunk),
                "uniform01": lambda: rs.random_sample(shape, chunks=chunk),
                "normal": lambda: rs.standard_normal(shape, chunks=chunk)}[args.data]
        a = draw().astype(args.dtype).persist()
        b = draw().astype(args.dtype).persist()
        wait([a, b])
        best = float("inf")
        for i in range(args.repeat + 1):
            # b + i: new keys each time (dask would hand back the cached product);
            # the addition costs one pass over B, under 1 % of the GEMM
            t0 = time.perf_counter()
            c = (a @ (b + i)).persist()
            wait(c)
            # a task ends when its GEMM is queued on the GPU, not when it is done
            client.run(_synchronize)
            if i:
                best = min(best, time.perf_counter() - t0)
    return {"seconds": best, "gpus": args.gpus}


def _nvidia_library_dirs(roots) -> list[str]:
    """The lib folders of the NVIDIA wheels under `roots` (nvidia/*/lib, nvidia/*/cu*/lib):
    cuBLASMp and NVSHMEM are found only through LD_LIBRARY_PATH."""
    import glob
    found = []
    for root in roots:
        for pattern in ("nvidia/*/lib", "nvidia/*/cu*/lib"):
            found += sorted(glob.glob(os.path.join(root or ".", pattern)))
    return list(dict.fromkeys(os.path.abspath(d) for d in found))


def _mpirun_version(mpirun: str) -> str:
    """What `mpirun --version` says (empty if it says nothing)."""
    try:
        return subprocess.run(shlex.split(mpirun) + ["--version"], capture_output=True,
                              text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def peer_nvmath(args):
    """nvmath-python's distributed matmul (cuBLASMp): one rank per GPU under MPI,
    A in row slabs, B in column slabs, C in row slabs (as the JAX peer)."""
    if args.placement == "host":
        raise RuntimeError("skipped: timed here on device-resident arrays only")
    # Its own folders first: the nvmath-python and cuda-core releases that match this
    # machine's NCCL may differ from those the other peers use.
    roots = [p for p in args.nvmath_path.split(os.pathsep) if p] + [p for p in sys.path if p]
    libs = os.pathsep.join(_nvidia_library_dirs(roots) + [os.environ.get("LD_LIBRARY_PATH", "")])
    env = dict(os.environ, LD_LIBRARY_PATH=libs, PYTHONPATH=os.pathsep.join(roots))
    # Open MPI's mpirun passes these on only when told (-x); MPICH's passes everything.
    forward = ["-x", "LD_LIBRARY_PATH", "-x", "PYTHONPATH"] \
        if "Open MPI" in _mpirun_version(args.mpirun) else []
    cmd = shlex.split(args.mpirun) + forward + [
        "-np", str(args.gpus), sys.executable, __file__, "--peer", "nvmath_rank", "--size",
        str(args.size), "--dtype", args.dtype, "--precision", args.precision, "--gpus",
        str(args.gpus), "--repeat", str(args.repeat), "--data", args.data]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"exit status {proc.returncode}: {tail}")
    return json.loads(lines[-1])


def peer_nvmath_rank(args):
    """One rank of the cuBLASMp run (started by peer_nvmath through MPI)."""
    import cupy
    from mpi4py import MPI
    try:
        import nvmath.distributed
        from nvmath.distributed.distribution import Slab
        from nvmath.distributed.linalg.advanced import Matmul, MatmulComputeType, MatmulOptions
    except Exception as exc:
        raise RuntimeError(f"skipped: nvmath-python's distributed matmul (cuBLASMp) is not "
                           f"usable here ({type(exc).__name__}: {exc})") from None
    comm = MPI.COMM_WORLD
    rank, n = comm.Get_rank(), args.size
    device = rank % cupy.cuda.runtime.getDeviceCount()
    cupy.cuda.Device(device).use()
    nvmath.distributed.initialize(device, comm, backends=["nvshmem", "nccl"])
    draw = _cupy_draw(args, 1 + rank)
    a = cupy.asfortranarray(draw(Slab.X.shape(rank, (n, n))).astype(args.dtype))
    b = cupy.asfortranarray(draw(Slab.Y.shape(rank, (n, n))).astype(args.dtype))
    options = None
    if args.precision == "tf32":
        options = MatmulOptions(compute_type=MatmulComputeType.COMPUTE_32F_FAST_TF32)
    with Matmul(a, b, distributions=[Slab.X, Slab.Y, Slab.X], options=options) as mm:
        mm.plan()

        def run():
            comm.Barrier()
            t0 = time.perf_counter()
            mm.execute()
            cupy.cuda.Device().synchronize()
            return comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
        run()
        seconds = min(run() for _ in range(args.repeat))
    nvmath.distributed.finalize()
    if rank != 0:
        raise SystemExit(0)
    return {"seconds": seconds, "gpus": comm.Get_size(), "library": "cuBLASMp (nvmath)"}


def peer_nvmathlt(args):
    """One GPU through nvmath-python's cuBLASLt matmul, autotuned: is the per-GPU
    GEMM faster than cupy.matmul's (as XLA's seems to be)?"""
    try:
        import nvmath
        from nvmath.linalg.advanced import Matmul, MatmulOptions
    except Exception:
        raise RuntimeError("skipped: nvmath-python is not installed") from None
    import cupy
    a, b = _cupy_operands(args)
    options = None
    if args.precision == "tf32":
        options = MatmulOptions(compute_type=nvmath.linalg.ComputeType.COMPUTE_32F_FAST_TF32)
    with Matmul(a, b, options=options) as mm:
        mm.plan()
        mm.autotune(iterations=1)  # each candidate once: a 32768^3 GEMM takes over a second

        def run():
            mm.execute()
            cupy.cuda.Device().synchronize()
        seconds = _timed(run, args.repeat)
    return {"seconds": seconds, "gpus": 1, "gemm": "cuBLASLt, autotuned"}


def peer_summa(args):
    if args.data != "uniform":
        raise RuntimeError("skipped: summa bench multiplies its own uniform(-1, 1) data")
    with tempfile.TemporaryDirectory() as tmp:
        record = os.path.join(tmp, "r.jsonl")
        cmd = shlex.split(args.mpirun) + ["-np", str(args.gpus), sys.executable, "-m", "summa",
                                          "bench", "--backend", "cupy", "--size",
                                          str(args.size), "--dtype", args.dtype, "--repeat",
                                          str(args.repeat), "--no-ideal", "--json", record]
        if args.precision == "tf32":
            cmd += ["--precision", "tf32"]
        if args.placement == "host":
            cmd += ["--out-of-core"]
        cmd += shlex.split(args.summa_args)
        env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL,
                       timeout=args.peer_timeout)
        r = json.loads(open(record).read().splitlines()[-1])
    return {"seconds": r["seconds"], "gpus": args.gpus, "comm": r["comm"], "nb": r["nb"],
            "grid": "x".join(map(str, r["grid"])),
            **({"schedule": r["schedule"]} if r.get("schedule", "panels") != "panels" else {})}


def _run_peer(peer, args) -> dict:
    """One peer's result (``seconds`` and notes), ``{"skipped": why}`` where
    it does not apply here, or ``{"failed": why}`` where it ran and failed."""
    if peer == "summa":
        try:
            return peer_summa(args)
        except RuntimeError as exc:  # only "skipped: ..." is raised as such
            return {"skipped": str(exc).removeprefix("skipped: ")}
        except (subprocess.CalledProcessError, OSError, ValueError, LookupError) as exc:
            return {"failed": str(exc)}
        except subprocess.TimeoutExpired:
            return {"failed": f"did not finish in {args.peer_timeout:g} s"}
    child = [sys.executable, __file__, "--peer", peer, "--size", str(args.size),
             "--dtype", args.dtype, "--precision", args.precision, "--placement",
             args.placement, "--gpus", str(args.gpus), "--repeat", str(args.repeat),
             "--data", args.data, "--mpirun", args.mpirun, "--nvmath-path",
             args.nvmath_path]
    try:
        proc = subprocess.run(child, capture_output=True, text=True, timeout=args.peer_timeout)
    except subprocess.TimeoutExpired:
        return {"failed": f"did not finish in {args.peer_timeout:g} s"}
    lines = [x for x in proc.stdout.splitlines() if x.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"failed": f"exit status {proc.returncode}: {tail}"}
    return json.loads(lines[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=32768)
    parser.add_argument("--dtype", default="float64",
                        choices=("float64", "float32", "float16", "complex128", "complex64"))
    parser.add_argument("--precision", choices=("default", "tf32"), default="default")
    parser.add_argument("--placement", choices=("device", "host"), default="device")
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--data", choices=("uniform", "uniform01", "normal"), default="uniform",
                        help="values of A and B: uniform in [-1, 1) (summa's), in [0, 1), or "
                             "standard normal")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=1,
                        help="run the peers this many times, in alternating order, and keep "
                             "each one's fastest (a warm GPU at its power cap is slower)")
    parser.add_argument("--peers", default=",".join(PEERS))
    parser.add_argument("--mpirun", default=default_launcher(),
                        help="the MPI launcher and its options (default: $SUMMA_MPIEXEC, "
                             "else $MPIEXEC, else the mpiexec beside this Python or on PATH; "
                             "now %(default)s)")
    parser.add_argument("--summa-args", default="",
                        help="more options for summa's bench, e.g. \"--schedule strips\"")
    parser.add_argument("--json", default=None, help="append the table as JSON lines here")
    parser.add_argument("--nvmath-path", default=os.environ.get("SUMMA_NVMATH_PATH", ""),
                        metavar="DIRS", help="folders with nvmath-python and cuBLASMp for the "
                                             "nvmath peer, searched first (default "
                                             "$SUMMA_NVMATH_PATH)")
    parser.add_argument("--peer-timeout", type=float, default=600, metavar="SECONDS",
                        help="give up on a peer after this long (its row says so)")
    parser.add_argument("--peer", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.peer:  # child process: run one peer, print one JSON line
        try:
            result = globals()[f"peer_{args.peer}"](args)
        except RuntimeError as exc:  # "skipped: why" where it does not apply; else it failed
            text = str(exc)
            result = {"skipped": text.removeprefix("skipped: ")} \
                if text.startswith("skipped:") else {"failed": text}
        print(json.dumps(result))
        return 0
    flops = (8 if args.dtype.startswith("complex") else 2) * args.size ** 3
    peers = args.peers.split(",")
    results = {peer: None for peer in peers}
    rounds = {peer: [] for peer in peers}  # each round's seconds: the spread is recorded
    # GPUs at their power cap run slower when warm: each round takes the peers in
    # the other order, and each peer keeps its fastest round.
    failures = {}  # a round that failed fails the run, whatever the other rounds did
    for turn in range(args.rounds):
        for peer in peers if turn % 2 == 0 else peers[::-1]:
            result = _run_peer(peer, args)
            if "failed" in result:
                failures.setdefault(peer, result["failed"])
            if "seconds" in result:
                rounds[peer].append(result["seconds"])
            best = results[peer]
            if best is None or result.get("seconds", float("inf")) < \
                    best.get("seconds", float("inf")):
                results[peer] = result
    for peer, r in results.items():
        if args.rounds > 1 and "seconds" in r:
            r["rounds"] = args.rounds
            slowest = flops / max(rounds[peer]) / 1e12
            r["slowest_round_tflops"] = round(slowest, 1)
        if "seconds" in r:
            r["tflops"] = flops / r["seconds"] / 1e12
    ideal = results.get("cupy", {}).get("tflops")
    ideal = ideal * args.gpus if ideal else None
    ours = results.get("summa", {}).get("tflops")
    label = args.dtype + ("/tf32" if args.precision == "tf32" else "")
    print(f"N = {args.size}, {label}, {args.data} data on {args.placement}, {args.gpus} GPUs; "
          f"ideal = "
          f"{args.gpus} x one-GPU cupy.matmul" + (f" = {ideal:.1f} TFLOP/s" if ideal else ""))
    print(f"{'peer':>9} {'TFLOP/s':>9} {'vs summa':>9} {'vs ideal':>9}  notes")
    for peer, r in results.items():
        if "tflops" not in r:
            why = f"FAILED: {r['failed']}" if "failed" in r else r.get("skipped", "")
            print(f"{peer:>9} {'-':>9} {'-':>9} {'-':>9}  {why}")
            continue
        vs_summa = f"{r['tflops'] / ours:.3f}" if ours else "-"
        vs_ideal = f"{r['tflops'] / ideal:.3f}" if ideal and r.get("gpus") == args.gpus else "-"
        notes = ", ".join(f"{k}={v}" for k, v in r.items() if k not in ("seconds", "tflops"))
        print(f"{peer:>9} {r['tflops']:>9.1f} {vs_summa:>9} {vs_ideal:>9}  {notes}")
    for peer, r in results.items():
        row = dict(peer=peer, size=args.size, dtype=args.dtype, precision=args.precision,
                   placement=args.placement, gpus=args.gpus, data=args.data)
        calls.append_json(args.json, {**row, **r})
    if failures:
        print("failed: " + "; ".join(f"{peer}: {why}" for peer, why in failures.items()),
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
