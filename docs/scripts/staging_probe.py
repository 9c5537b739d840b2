"""What limits staged uploads: T threads each copying chunks from pageable
rows into page-locked chunks of their own, then (step by step) queueing the
chunk's device copy on one shared stream or a stream of their own, recording
an event per chunk, and handing chunks through a queue as summa's stager does.

    python3 docs/scripts/staging_probe.py --gib 1 --threads 8,12,16
"""

from __future__ import annotations

import argparse
import queue
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np


def main() -> int:
    import cupy as cp
    p = argparse.ArgumentParser()
    p.add_argument("--gib", type=float, default=1.0)
    p.add_argument("--threads", default="8,12,16")
    p.add_argument("--chunk-mib", default="8,32")
    args = p.parse_args()
    cols = 16384
    rows = int(args.gib * 2**30 / 8 / 4096)
    whole = np.ones((rows, cols))
    src = whole[:, :4096]  # strided rows, as A's panels are
    dev = cp.empty((rows, 4096))
    rt = cp.cuda.runtime
    print(f"switch interval {sys.getswitchinterval()} s; {src.nbytes / 1e9:.2f} GB per upload")

    for chunk_mib in map(int, args.chunk_mib.split(",")):
        step = (chunk_mib << 20) // (4096 * 8)
        cuts = [(r, min(r + step, rows)) for r in range(0, rows, step)]
        for t in map(int, args.threads.split(",")):
            bufs = [np.frombuffer(cp.cuda.alloc_pinned_memory(step * 4096 * 8), np.float64)
                    .reshape(step, 4096) for _ in range(t + 4)]
            shared = cp.cuda.Stream(non_blocking=True)
            own = [cp.cuda.Stream(non_blocking=True) for _ in range(t + 4)]
            local = threading.local()

            def stream_of(mode, i):
                return shared if mode != "own stream" else own[i]

            def work(mode):
                free = queue.Queue()
                for i in range(len(bufs)):
                    free.put((i, None))

                def one(cut):
                    i, ev = free.get()
                    if ev is not None:
                        ev.synchronize()
                    r0, r1 = cut
                    stage = bufs[i][: r1 - r0]
                    np.copyto(stage, src[r0:r1])
                    if mode == "copy only":
                        free.put((i, None))
                        return
                    s = stream_of(mode, i)
                    rt.memcpyAsync(dev[r0:r1].data.ptr, stage.ctypes.data, stage.nbytes, 1,
                                   s.ptr)
                    ev = cp.cuda.Event(disable_timing=True) if mode != "no event" else None
                    if ev is not None:
                        ev.record(s)
                    else:
                        s.synchronize()
                    free.put((i, ev))
                with ThreadPoolExecutor(t, initializer=lambda: rt.setDevice(0)) as pool:
                    list(pool.map(one, cuts))
                cp.cuda.Device().synchronize()

            for mode in ("copy only", "shared stream", "own stream", "no event"):
                work(mode)
                s = time.perf_counter()
                work(mode)
                sec = time.perf_counter() - s
                print(f"chunk {chunk_mib:2d} MiB, {t:2d} threads, {mode:>14}: "
                      f"{src.nbytes / sec / 1e9:6.1f} GB/s", flush=True)
            del bufs
    sys.path.insert(0, ".")
    from summa.staging import Stager
    for interval in (0.005, 0.0005):
        sys.setswitchinterval(interval)
        for t in map(int, args.threads.split(",")):
            stager = Stager(0, t)
            stager.upload(dev, src).wait()
            cp.cuda.Device().synchronize()
            s = time.perf_counter()
            stager.upload(dev, src).wait()
            stager.up.synchronize()
            sec = time.perf_counter() - s
            stager.close()
            print(f"summa Stager, {t:2d} threads, switch interval {interval}: "
                  f"{src.nbytes / sec / 1e9:6.1f} GB/s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
