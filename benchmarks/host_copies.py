"""Host-GPU copy rates from pageable memory, by the ways summa could take,
on T host threads each:

* memcpy: ``np.copyto`` from pageable rows into a page-locked buffer (does
  NumPy's copy scale with threads?);
* staged: :class:`summa.device.staging.Stager` uploads, and downloads into a fresh
  array (first touch included) and into a touched one;
* register: ``cudaHostRegister`` of row chunks, of touched memory and of a
  fresh array; then direct copies chunk by chunk (a copy must not span two
  registrations); ``cudaHostUnregister``.

    python3 benchmarks/host_copies.py --gib 8 --threads 1,4,8,16
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gib", type=float, default=8)
    p.add_argument("--threads", default="1,4,8,16")
    p.add_argument("--chunk-mib", type=int, default=256, help="registration chunk")
    args = p.parse_args()
    import cupy as cp
    from summa.device.staging import Stager
    cols = 8192
    n = int(args.gib * 2**30 / 8 / cols)
    host = np.empty((n, cols))
    host[...] = 1.0  # touched: resident, like the user's arrays
    dev = cp.empty(host.shape)
    gb = host.nbytes / 1e9
    rt = cp.cuda.runtime

    failed = []

    def timed(label, fn):
        cp.cuda.Device().synchronize()
        t0 = time.perf_counter()
        try:
            fn()
            cp.cuda.Device().synchronize()
        except Exception as exc:  # noqa: BLE001 -- a way that fails is reported; the rest run
            print(f"{label:<52} failed: {type(exc).__name__}: {exc}", flush=True)
            failed.append(label)
            return
        s = time.perf_counter() - t0
        print(f"{label:<52} {s:7.3f} s {gb / s:7.1f} GB/s", flush=True)

    timed("pageable cupy set (one copy)", lambda: dev.set(host))
    step_rows = max(1, args.chunk_mib * 2**20 // (cols * 8))
    cuts = [(r, min(r + step_rows, n)) for r in range(0, n, step_rows)]
    pinned = cp.cuda.alloc_pinned_memory(16 << 20)
    for t in (int(x) for x in args.threads.split(",")):
        with ThreadPoolExecutor(t) as pool:
            stages = [np.frombuffer(cp.cuda.alloc_pinned_memory(16 << 20), np.float64)
                      .reshape(-1, cols) for _ in range(t)]
            rows16 = stages[0].shape[0]
            pieces = [(r, min(r + rows16, n)) for r in range(0, n, rows16)]

            def copy(i):
                r0, r1 = pieces[i]
                np.copyto(stages[i % t][: r1 - r0], host[r0:r1])
            timed(f"[{t:2d} thr] memcpy pageable -> page-locked (16 MiB)",
                  lambda: list(pool.map(copy, range(len(pieces)))))
            stager = Stager(0, t)
            timed(f"[{t:2d} thr] staged upload (ring made here)",
                  lambda: stager.upload(dev, host).wait())
            timed(f"[{t:2d} thr] staged upload", lambda: stager.upload(dev, host).wait())
            fresh = np.empty_like(host)
            timed(f"[{t:2d} thr] staged download into a fresh array",
                  lambda: stager.download(fresh, dev).wait())
            timed(f"[{t:2d} thr] staged download into a touched array",
                  lambda: stager.download(fresh, dev).wait())
            stager.close()


            for label, target in (("touched", host), ("fresh", None)):
                arr = host if target is not None else np.empty_like(host)

                def lock(c, arr=arr):
                    rt.hostRegister(arr[c[0]:c[1]].ctypes.data, arr[c[0]:c[1]].nbytes, 0)

                def unlock(c, arr=arr):
                    rt.hostUnregister(arr[c[0]:c[1]].ctypes.data)

                def direct(kind, arr=arr):  # one copy per registration: none spans two
                    s = cp.cuda.Stream(non_blocking=True)
                    for r0, r1 in cuts:
                        ends = (dev[r0:r1].data.ptr, arr[r0:r1].ctypes.data)
                        dst, src = ends if kind == 1 else ends[::-1]
                        rt.memcpyAsync(dst, src, arr[r0:r1].nbytes, kind, s.ptr)
                    s.synchronize()
                timed(f"[{t:2d} thr] register {label} memory, "
                      f"{args.chunk_mib} MiB chunks", lambda: list(pool.map(lock, cuts)))
                timed(f"[{t:2d} thr]   direct upload per chunk", lambda: direct(1))
                timed(f"[{t:2d} thr]   direct download per chunk", lambda: direct(2))
                timed(f"[{t:2d} thr]   unregister", lambda: list(pool.map(unlock, cuts)))
                del arr
    del pinned
    return 1 if failed else 0  # a way that failed is a figure missing


def profile_matmul(n: int) -> None:
    """Where one summa.matmul of n x n float64 spends its host time."""
    import cProfile
    import pstats
    import cupy as cp
    import summa
    a = np.random.default_rng(1).random((n, n))
    b = np.random.default_rng(2).random((n, n))
    x = cp.ones((64, 64))
    (x @ x).get()
    for call in ("first", "second"):
        prof = cProfile.Profile()
        t0 = time.perf_counter()
        prof.enable()
        summa.matmul(a, b)
        prof.disable()
        print(f"--- summa.matmul {n} {call} call: {time.perf_counter() - t0:.3f} s")
        pstats.Stats(prof).sort_stats("cumulative").print_stats(22)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--profile":
        profile_matmul(int(sys.argv[2]))
        sys.exit(0)
    sys.exit(main())
