"""The first user's case, end to end: two NumPy arrays in ordinary host memory,
one GPU of which only ``--free`` stays free, ``C = A @ B`` back in host memory.

Each size runs in a fresh process (so "first call" is the first multiply of
the process, after CUDA and cuBLAS are up, which is timed on its own):

* ceiling: ``cupy.matmul`` on device-resident data of the largest size up to
  N that fits the free memory (its GEMM rate: the GPU's speed limit), times
  the GPUs used (``--gpus``, default every visible one, each left with
  ``--free``; summa then runs on its pool of one rank per GPU, cuBLASXt on
  all of them);
* summa: ``summa.matmul(a, b)`` with no options, first call and second;
* loop: the hand-written CuPy loop the user had in mind (2 x 2 blocks,
  ``cp.asarray`` / ``@`` / ``cp.asnumpy``), or ``cp.asnumpy(cp.asarray(a) @
  cp.asarray(b))`` where that fits;
* cublasxt: ``cublasXt<t>gemm`` on the same pageable arrays;
* jax: ``device_put`` / ``matmul`` / ``np.asarray`` where it fits.

Usage (on the GPU machine)::

    python3 benchmarks/user_case.py --sizes 16384,40960 --dtype float64 --free 24GiB

Prints one table (seconds end to end, TFLOP/s, ratio to the ceiling, summa's
own phases) and appends JSON lines to ``--json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

# Shared with the guard and the matrix (and imported from here by fp64_int8_user_case.py).
import calls  # JSON lines stamped with machine, date, command
from calls import ROOT, fresh, hold_all_but, matmul_seconds, release  # noqa: F401


def _bytes(text: str) -> int:
    sys.path.insert(0, ROOT)
    from summa.planning.memory import parse_bytes
    return parse_bytes(text)


def _check(c, a, b) -> float:
    """Freivalds' scaled residual of ``c`` against ``a @ b`` on the host."""
    import numpy as np
    x = np.random.default_rng().uniform(-1, 1, c.shape[1])
    ref = a.astype(np.float64, copy=False) @ (b.astype(np.float64, copy=False) @ x)
    got = c.astype(np.float64, copy=False) @ x
    gauge = np.abs(a) @ (np.abs(b) @ np.abs(x))
    k = a.shape[1]
    eps = np.finfo(c.dtype).eps
    return float(np.max(np.abs(got - ref) / ((k + c.shape[1]) * eps * gauge)))


def _cublasxt(dtype, gpus: int = 1):
    """``run(a, b, c)``: row-major ``c = a @ b`` through cuBLASXt on the first
    `gpus` GPUs."""
    import ctypes
    import numpy as np
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from peers import _libcublas
    letter, scalar = {"float64": ("D", ctypes.c_double), "float32": ("S", ctypes.c_float)}[dtype]
    lib = _libcublas()
    handle = ctypes.c_void_p()
    if lib.cublasXtCreate(ctypes.byref(handle)) != 0:
        raise RuntimeError("cublasXtCreate failed")
    lib.cublasXtDeviceSelect(handle, gpus, (ctypes.c_int * gpus)(*range(gpus)))
    lib.cublasXtSetBlockDim(handle, 8192)
    gemm = getattr(lib, f"cublasXt{letter}gemm")
    size, ptr, op = ctypes.c_size_t, ctypes.c_void_p, ctypes.c_int
    gemm.argtypes = [ptr, op, op, size, size, size, ctypes.POINTER(scalar), ptr, size, ptr, size,
                     ctypes.POINTER(scalar), ptr, size]
    one, zero = scalar(1.0), scalar(0.0)

    def run(a, b):
        m, k = a.shape
        n = b.shape[1]
        c = np.empty((m, n), dtype=a.dtype)
        # Row-major C = A B is column-major C^T = B^T A^T.
        status = gemm(handle, 0, 0, n, m, k, ctypes.byref(one), b.ctypes.data, n, a.ctypes.data,
                      k, ctypes.byref(zero), c.ctypes.data, n)
        if status != 0:
            raise RuntimeError(f"cublasXt{letter}gemm returned {status}")
        return c
    return run


def _loop(a, b, free: int):
    """The user's own loop: blocks of A and B to the GPU, multiply, C blocks back."""
    import cupy as cp
    import numpy as np
    n = a.shape[0]
    if 3 * a.nbytes <= 0.8 * free:
        return cp.asnumpy(cp.asarray(a) @ cp.asarray(b))
    parts = 2
    while 4 * (a.nbytes / parts**2) > 0.8 * free:
        parts += 1
    cuts = [n * i // parts for i in range(parts + 1)]
    c = np.empty((a.shape[0], b.shape[1]), dtype=a.dtype)
    for i0, i1 in zip(cuts, cuts[1:]):
        for j0, j1 in zip(cuts, cuts[1:]):
            acc = None
            for k0, k1 in zip(cuts, cuts[1:]):
                prod = cp.asarray(a[i0:i1, k0:k1]) @ cp.asarray(b[k0:k1, j0:j1])
                acc = prod if acc is None else acc + prod
            c[i0:i1, j0:j1] = cp.asnumpy(acc)
            del acc, prod
    return c


def _jax(a, b):
    import jax
    import jax.numpy as jnp
    import numpy as np
    f = jax.jit(lambda x, y: jnp.matmul(x, y, precision=jax.lax.Precision.HIGHEST))
    return np.asarray(f(jax.device_put(a), jax.device_put(b)))


def one_size(args) -> list[dict]:
    """Every peer on one size, in this (fresh) process."""
    t0 = time.perf_counter()
    import numpy as np
    import cupy as cp
    sys.path.insert(0, ROOT)
    import summa
    imported = time.perf_counter() - t0
    t0 = time.perf_counter()
    x = cp.ones((64, 64), dtype=args.dtype)
    (x @ x).get()
    cuda_init = time.perf_counter() - t0
    gpus = args.gpus or cp.cuda.runtime.getDeviceCount()
    holds = hold_all_but(_bytes(args.free), gpus)  # on every GPU, outside CuPy's pool
    free = cp.cuda.runtime.memGetInfo()[0]
    n, dtype = args.size, np.dtype(args.dtype)
    flops = 2.0 * n**3
    rows = []

    def row(peer, call, seconds, **extra):
        r = {"peer": peer, "call": call, "n": n, "dtype": dtype.name, "seconds": seconds,
             "tflops": flops / seconds / 1e12, "free": free, "gpus": gpus, **extra}
        rows.append(r)
        print(json.dumps(r), flush=True)

    # The ceiling: the GPU's GEMM rate on device data, the largest size up to N that fits.
    side = n
    while 3 * side * side * dtype.itemsize > 0.9 * free:
        side -= 1024
    ceiling = gpus * gemm_rate(side, dtype)  # P x one GPU's rate
    print(json.dumps({"peer": "ceiling", "n": side, "tflops": ceiling, "import_seconds": imported,
                      "cuda_init_seconds": cuda_init, "dtype": dtype.name}), flush=True)

    t0 = time.perf_counter()
    a, b = fresh((n, n), dtype, 1), fresh((n, n), dtype, 2)
    made = time.perf_counter() - t0
    for call in ("first", "second"):
        stats = summa.SummaStats()
        s = time.perf_counter()
        if args.pool:  # summa's pool even for one GPU: the pool's own cost
            from summa import pool
            c = pool.matmul(a, b, gpus, stats=stats)
        else:
            c = summa.matmul(a, b, stats=stats, gpus=gpus)
        seconds = time.perf_counter() - s
        ex = stats.extra
        row("summa/pool" if args.pool else "summa", call, seconds, ceiling=ceiling,
            residual=_check(c, a, b),
            host_copies=os.environ.get("SUMMA_HOST_COPIES", "stage"),
            gemm_seconds=stats.compute, head_seconds=ex.get("head_seconds"),
            between_seconds=ex.get("between_seconds"), tail_seconds=ex.get("tail_seconds"),
            sweep_seconds=stats.seconds, setup_seconds=ex.get("setup_seconds"),
            tiles=ex.get("tiles"), make_seconds=made,
            pool_copy_seconds=ex.get("pool_copy_seconds"),
            pool_start_wait_seconds=ex.get("pool_start_wait_seconds"),
            **{k: ex.get(k) for k in ("pool_run_seconds", "pool_reads_caller",
                                      "worker_attach_seconds",
                                      "worker_matmul_seconds", "worker_after_seconds")})
        del c
    cp.get_default_memory_pool().free_all_blocks()
    peers = {"loop": lambda: _loop(a, b, free), "cublasxt": None, "jax": lambda: _jax(a, b)}
    for peer in args.peers:
        if peer == "jax" and 3 * a.nbytes > 0.8 * free:
            continue
        try:
            fn = peers[peer]
            if peer == "cublasxt":
                run = _cublasxt(dtype.name, gpus)
                fn = lambda: run(a, b)  # noqa: E731
            for call in ("first", "second")[:args.ref_calls]:
                s = time.perf_counter()
                c = fn()
                row(peer, call, time.perf_counter() - s, ceiling=ceiling)
                del c
        except Exception as exc:  # noqa: BLE001 -- a peer that cannot run is reported
            print(json.dumps({"peer": peer, "n": n, "skipped": f"{type(exc).__name__}: {exc}"}),
                  flush=True)
        cp.get_default_memory_pool().free_all_blocks()
    release(holds)
    return rows


def gemm_rate(side: int, dtype) -> float:
    """TFLOP/s of ``cupy.matmul`` on side x side device data (:func:`matmul_seconds`)."""
    return 2.0 * side**3 / matmul_seconds(side, side, side, dtype) / 1e12


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="16384,40960")
    p.add_argument("--size", type=int, help=argparse.SUPPRESS)  # one size, in this process
    p.add_argument("--dtype", default="float64")
    p.add_argument("--free", default="24GiB", help="memory left free on each GPU (default 24GiB)")
    p.add_argument("--pool", action="store_true",
                   help="run summa on its pool of worker ranks even for one GPU (the pool's "
                        "own cost against the in-process call)")
    p.add_argument("--gpus", type=int, default=0,
                   help="GPUs (default every visible one: summa.matmul's pool, cuBLASXt on all; "
                        "the ceiling is one GPU's rate, times the GPUs in the table)")
    p.add_argument("--peers", default="loop,cublasxt,jax")
    p.add_argument("--ref-calls", type=int, default=1, help="calls of each reference (1 or 2)")
    p.add_argument("--modes", default="stage",
                   help="SUMMA_HOST_COPIES values to time summa with, each in its own process "
                        "(the references run with the first)")
    p.add_argument("--json")
    args = p.parse_args(argv)
    args.peers = [x for x in args.peers.split(",") if x]
    if args.size:
        rows = one_size(args)
        for r in rows:
            calls.append_json(args.json, r)
        return 0
    lines, failed = [], []
    for n in (int(x) for x in args.sizes.split(",")):
        for i, mode in enumerate(args.modes.split(",")):
            cmd = [sys.executable, os.path.abspath(__file__), "--size", str(n), "--dtype",
                   args.dtype, "--free", args.free, "--gpus", str(args.gpus)] + \
                (["--pool"] if args.pool else []) + ["--peers",
                   ",".join(args.peers) if i == 0 else "", "--ref-calls", str(args.ref_calls)] \
                + (["--json", args.json] if args.json else [])
            env = dict(os.environ, SUMMA_HOST_COPIES=mode)
            out = subprocess.run(cmd, capture_output=True, text=True, env=env)
            sys.stderr.write(out.stderr[-3000:])
            if out.returncode != 0:  # summa's call (or the ceiling) raised: not measured
                failed.append(f"N = {n} with SUMMA_HOST_COPIES={mode}: exit status "
                              f"{out.returncode}")
            for x in out.stdout.splitlines():
                if x.startswith("{"):
                    r = json.loads(x)
                    if r["peer"] == "summa":
                        r["peer"] = f"summa/{mode}"
                    lines.append(r)
    print(f"\n{'N':>6} {'dtype':>8} {'peer':>12} {'call':>6} {'seconds':>8} {'TFLOP/s':>8} "
          f"{'/ceiling':>8}  notes")
    ceiling = {}
    for r in lines:
        if r["peer"] == "ceiling":
            ceiling = r
            print(f"{r['n']:>6} {'':>8} {'ceiling':>12} {'':>6} {'':>8} {r['tflops']:8.2f} "
                  f"{1:8.3f}  cupy.matmul in GPU memory; import {r['import_seconds']:.2f} s, "
                  f"CUDA init {r['cuda_init_seconds']:.2f} s")
        elif "skipped" in r:
            print(f"{r['n']:>6} {'':>8} {r['peer']:>12}  {r['skipped'][:90]}")
        else:
            note = ""
            if r["peer"].startswith("summa"):
                note = (f"residual {r['residual']:.2e}, GEMMs {r['gemm_seconds']:.3f} s, GPU "
                        f"idle {r['head_seconds'] or 0:.3f} s before, "
                        f"{r.get('between_seconds') or 0:.3f} between, "
                        f"{r['tail_seconds'] or 0:.3f} after; set-up "
                        f"{r.get('setup_seconds') or 0:.3f} s, sweep "
                        f"{r.get('sweep_seconds') or 0:.3f} s; tiles {r['tiles']}")
                if r.get("pool_copy_seconds") is not None:
                    how = "reads the caller's arrays" if r.get("pool_reads_caller") else \
                        "copies into shared memory"
                    note += (f"; pool: {how} {r['pool_copy_seconds']:.3f} s, "
                             f"then waited {r['pool_start_wait_seconds']:.3f} s for its start, "
                             f"ran {r['pool_run_seconds']:.3f} s (workers: attach "
                             f"{r['worker_attach_seconds']:.3f}, matmul "
                             f"{r['worker_matmul_seconds']:.3f}, after "
                             f"{r['worker_after_seconds']:.3f})")
            print(f"{r['n']:>6} {r['dtype']:>8} {r['peer']:>12} {r['call']:>6} "
                  f"{r['seconds']:8.3f} {r['tflops']:8.2f} {r['tflops'] / ceiling['tflops']:8.3f}"
                  f"  {note}")
    if failed:
        print("failed: " + "; ".join(failed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
