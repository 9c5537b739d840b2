"""Host-GPU copy rates from pageable memory, by the ways summa could take:
staged through page-locked chunks (summa.staging, T threads), page-locking
the source chunk by chunk on T threads then copying directly, and the plain
pageable copy. Also the way back into a fresh array (first touch included).

    python3 docs/scripts/host_copy_probe.py --gib 8 --threads 1,4,8,16
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def main() -> int:
    import cupy as cp
    from summa.staging import Stager
    p = argparse.ArgumentParser()
    p.add_argument("--gib", type=float, default=8)
    p.add_argument("--threads", default="1,4,8,16")
    args = p.parse_args()
    n = int(args.gib * 2**30 / 8 / 8192)
    host = np.empty((n, 8192))
    host[...] = 1.0  # touched: resident, like the user's arrays
    dev = cp.empty(host.shape)
    gb = host.nbytes / 1e9
    rows = []

    def timed(label, fn):
        cp.cuda.Device().synchronize()
        t0 = time.perf_counter()
        fn()
        cp.cuda.Device().synchronize()
        s = time.perf_counter() - t0
        rows.append((label, s, gb / s))
        print(f"{label:<44} {s:7.3f} s {gb / s:7.1f} GB/s", flush=True)

    timed("pageable cupy.asarray (one copy)", lambda: dev.set(host))
    for t in (int(x) for x in args.threads.split(",")):
        stager = Stager(0, t)
        timed(f"staged upload, {t} threads (ring made here)", lambda: stager.upload(dev, host).wait())
        timed(f"staged upload, {t} threads", lambda: stager.upload(dev, host).wait())
        out = np.empty_like(host)  # fresh: first touch in the copy
        timed(f"staged download into a fresh array, {t} thr",
              lambda: stager.download(out, dev).wait())
        timed(f"staged download into the same array, {t} thr",
              lambda: stager.download(out, dev).wait())
        stager.close()
        del out
        step = -(-n // (4 * t))
        cuts = [(r, min(r + step, n)) for r in range(0, n, step)]

        def lock(c):
            r0, r1 = c
            cp.cuda.runtime.hostRegister(host[r0:r1].ctypes.data, host[r0:r1].nbytes, 0)

        def unlock(c):
            cp.cuda.runtime.hostUnregister(host[c[0]:c[1]].ctypes.data)
        with ThreadPoolExecutor(t) as pool:
            timed(f"hostRegister in chunks, {t} threads", lambda: list(pool.map(lock, cuts)))
            timed("direct copy from the locked array", lambda: dev.set(host))
            timed(f"hostUnregister, {t} threads", lambda: list(pool.map(unlock, cuts)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
