"""Where a warm .npy read goes slow (issue 23): one file read by summa's
read_block and by plain preadv on T threads, into fresh and into touched
memory, from the page cache.

    python3 docs/scripts/read_probe.py --size 24576 --dir /tmp/read-probe
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
    from summa import io
    p = argparse.ArgumentParser()
    p.add_argument("--size", type=int, default=24576)
    p.add_argument("--dir", default="/tmp/read-probe")
    args = p.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    path = os.path.join(args.dir, "A.npy")
    n = args.size
    x = np.lib.format.open_memmap(path, mode="w+", dtype=np.float64, shape=(n, n))
    x[...] = 1.5
    x.flush()
    del x
    header = io._read_header_local(path)
    rows, cols = np.arange(n), np.arange(n)
    io.read_block(header, rows, cols)  # the page cache holds it now
    size = os.path.getsize(path) - header.offset

    def plain(threads, dest):
        fd = os.open(path, os.O_RDONLY)
        view = dest.reshape(-1).view(np.uint8)
        step = -(-size // (4 * threads))

        def part(i):
            got = 0
            piece = view[i:i + step]
            while got < piece.nbytes:
                got += os.preadv(fd, [piece[got:]], header.offset + i + got)
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(part, range(0, size, step)))
        os.close(fd)
    for label, fn in [
        ("read_block (16 threads, fresh)", lambda: io.read_block(header, rows, cols)),
        ("preadv 1 thread, fresh", lambda: plain(1, np.empty((n, n)))),
        ("preadv 16 threads, fresh", lambda: plain(16, np.empty((n, n)))),
        ("preadv 16 threads, touched", lambda d=np.ones((n, n)): plain(16, d)),
        ("preadv 4 threads, touched", lambda d=np.ones((n, n)): plain(4, d)),
        ("np.empty + touch 16 threads", lambda: io.parallel_touch(np.empty((n, n)))
         if hasattr(io, "parallel_touch") else None),
    ]:
        s = time.perf_counter()
        fn()
        sec = time.perf_counter() - s
        print(f"{label:>34}: {sec:6.2f} s, {size / sec / 1e9:6.2f} GB/s", flush=True)
    os.remove(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
