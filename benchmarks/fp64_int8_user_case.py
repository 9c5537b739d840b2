"""The user's own float64 call on INT8 tensor cores, end to end:
``summa.matmul(a, b, precision="fp64-int8")`` on pageable NumPy arrays, its
first and second call in a fresh process, against ``summa.matmul(a, b)``
(native float64) and the user's own CuPy loop (user_case.py's: blocks up,
``cupy.matmul``, blocks down) in the same process; the first call with an
empty cache of cuBLASLt's choices and again in a second process that finds
them; with ``--free`` only that much of the GPU left free (a 24 GB card).

    python3 benchmarks/fp64_int8_user_case.py --size 32768 [--free 24GiB] [--panel-width 8192]

At ``--size 40960`` on one H100 the two processes took 179 s with the
references (about 40 s of them each, most of it the loop by hand), ~50 s
each without (making the operands and the checks included): give a device
call that much. ``--references native`` times native float64 only beside
fp64-int8.

``--processes 1`` runs the first process alone (its cache of cuBLASLt's
choices empty): half the time, for comparing widths or trees in one device
call.

``--least-rows N`` lets fp64-int8's products take C's rows in chunks of as
few as N (``summa.planning.tiling.FP64_INT8_ROWS``), which leaves room for
wider panels under a small budget.

``--head-first N`` cuts each C tile's first panel in pieces from N columns
(``summa.planning.memory.FP64_INT8_HEAD_FIRST``; default: whole), to weigh
a shorter wait for the first upload against more products.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import calls  # JSON lines stamped with machine, date, command

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def one_process(n: int, free: str | None, references: str = "all",
                panel_width: int | None = None, head_first: int | None = None,
                least_rows: int | None = None) -> list[dict]:
    """The calls, timed, in this process (one GPU: summa.matmul plans and
    runs here, so `head_first` and `least_rows` set here are the ones its
    plans take)."""
    sys.path.insert(0, ROOT)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import cupy as cp
    import numpy as np
    from user_case import _loop, hold_all_but
    import summa
    from summa.planning import memory, tiling
    from summa.planning.memory import parse_bytes
    if head_first:
        memory.FP64_INT8_HEAD_FIRST = head_first
    if least_rows:
        tiling.FP64_INT8_ROWS = least_rows

    def host(seed):  # pageable, as the user holds it (made on the GPU: fast)
        x = np.empty((n, n))
        x[...] = cp.random.default_rng(seed).uniform(-1, 1, (n, n)).get()
        cp.get_default_memory_pool().free_all_blocks()
        return x
    a, b = host(1), host(2)
    if free:  # after the data is made: its making needs more
        hold_all_but(parse_bytes(free), 1)
    room = cp.cuda.runtime.memGetInfo()[0]
    rows = []

    def timed(what, fn):
        s = time.perf_counter()
        c = fn()
        rows.append({"what": what, "n": n, "seconds": time.perf_counter() - s,
                     "tflops": 2 * n**3 / (time.perf_counter() - s) / 1e12})
        return c

    def by_hand():
        c = _loop(a, b, room)
        cp.get_default_memory_pool().free_all_blocks()
        return c
    def int8(what):
        """The fp64-int8 call, with what its stats say of it: the kernels'
        compiling (before the product) and the products' own time."""
        stats = summa.SummaStats()
        c = timed(what, lambda: summa.matmul(a, b, precision="fp64-int8", stats=stats,
                                             panel_width=panel_width))
        rows[-1].update(compile_seconds=stats.extra.get("compile_seconds"),
                        products_seconds=stats.compute, panels=stats.panels,
                        head_first=stats.extra["plan"]["memory"]["head_first"],
                        # the GPU waiting before its first product and between them
                        head_seconds=stats.extra.get("head_seconds"),
                        between_seconds=stats.extra.get("between_seconds"))
        return c
    c = int8("fp64-int8 first call")
    rows[-1]["check"] = float(summa.freivalds(a, b, c))
    del c
    int8("fp64-int8 second call")
    if references != "none":  # beside it in the same process, twice as fp64-int8 is
        timed("float64 (summa)", lambda: summa.matmul(a, b))
        timed("float64 (summa) again", lambda: summa.matmul(a, b))
    if references == "all":  # (the loop by hand: most of a minute at N = 40960)
        timed("float64 by hand (cupy)", by_hand)
        timed("float64 by hand again", by_hand)
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", type=int, default=32768)
    p.add_argument("--free", help="GPU memory left free, e.g. 24GiB (default: all of it)")
    p.add_argument("--json")
    p.add_argument("--references", choices=("all", "native", "none"), default="all",
                   help="what else each process times: native float64 summa.matmul and the "
                        "CuPy loop by hand (all, the default), native only, or none")
    p.add_argument("--no-references", dest="references", action="store_const", const="none",
                   help="the same as --references none")
    p.add_argument("--panel-width", type=int,
                   help="the fp64-int8 calls' panel width (default: the planner's)")
    p.add_argument("--head-first", type=int,
                   help="fp64-int8's first panel in pieces from this many columns "
                        "(default: whole)")
    p.add_argument("--least-rows", type=int,
                   help="the fewest rows of C an fp64-int8 product takes at a time "
                        "(summa.planning.tiling.FP64_INT8_ROWS; default: its)")
    p.add_argument("--processes", type=int, choices=(1, 2), default=2,
                   help="fresh processes: 2 (the default), the second finding the first's "
                        "cuBLASLt choices; 1: the first alone")
    p.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.inner:
        print(json.dumps(one_process(args.size, args.free, args.references,
                                     args.panel_width, args.head_first, args.least_rows)))
        return 0
    # the options each fresh process is given as they were asked here
    passed = [x for flag, value in (("--free", args.free), ("--panel-width", args.panel_width),
                                    ("--head-first", args.head_first),
                                    ("--least-rows", args.least_rows))
              if value for x in (flag, str(value))]
    rows = []
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, SUMMA_CACHE_DIR=cache)
        for process in ("empty cache", "cache kept")[:args.processes]:
            out = subprocess.run([sys.executable, __file__, "--size", str(args.size), "--inner",
                                  "--references", args.references] + passed,
                                 env=env, capture_output=True, text=True)
            if out.returncode:
                print(out.stdout[-2000:], out.stderr[-4000:], file=sys.stderr)
                return out.returncode
            for r in json.loads(out.stdout.strip().splitlines()[-1]):
                rows.append(dict(r, process=process, free=args.free))
    for r in rows:
        calls.append_json(args.json, r)
    for r in rows:
        print(f"{r['process']:>12}  {r['what']:<24} N={r['n']}  {r['seconds']:7.3f} s "
              f"{r['tflops']:7.1f} TFLOP/s" + (f"  check {r['check']:.2e}" if "check" in r else "")
              + (f"  compiling {r['compile_seconds']:.2f} s, products {r['products_seconds']:.2f} s"
                 if r.get("compile_seconds") is not None else "")
              + (f"  {r['panels']} products a tile, first piece {r['head_first'] or 'whole'}"
                 if "panels" in r else "")
              + (f", waits {r['head_seconds']:.3f} s before the first, "
                 f"{r['between_seconds']:.3f} s between" if r.get("head_seconds") is not None
                 else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
