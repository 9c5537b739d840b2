"""Where float64 on INT8 tensor cores loses its rate out of core (issue 25):
one GPU, ``summa.matmul(a, b, precision="fp64-int8", out_of_core=True)`` on
host arrays, every product of the sweep timed on the GPU by phase (scale,
residues, products, finish), the GPU's gaps between products, and the host's
seconds inside each call (a call that stops the host shows there), against
the bare product of the whole matrices in the same run.

    python3 docs/scripts/ozaki_ooc_probe.py --size 32768 --device-memory 64GiB --nb 16384
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", type=int, default=32768)
    p.add_argument("--device-memory", action="append", default=None,
                   help="out-of-core budgets (repeatable; default 64GiB and 24GiB)")
    p.add_argument("--nb", default="", help="panel widths, one per budget (default: summa's)")
    p.add_argument("--json")
    args = p.parse_args()
    import cupy as cp
    import summa
    from summa import ozaki_gpu
    from summa.backend import get_backend
    n = args.size
    budgets = args.device_memory or ["64GiB", "24GiB"]
    widths = [int(w) if w else None for w in args.nb.split(",")] if args.nb else \
        [None] * len(budgets)
    a_dev = cp.random.random((n, n)) * 2 - 1
    b_dev = cp.random.random((n, n)) * 2 - 1
    c_dev = cp.empty((n, n))
    backend = get_backend("cupy")
    ozaki_gpu.gemm(1.0, a_dev, b_dev, c_dev, backend=backend)  # warm-up
    cp.cuda.Device().synchronize()
    t0 = time.perf_counter()
    ozaki_gpu.gemm(1.0, a_dev, b_dev, c_dev, backend=backend)
    cp.cuda.Device().synchronize()
    bare = time.perf_counter() - t0
    rows = [{"what": "bare", "n": n, "seconds": bare, "tflops": 2 * n**3 / bare / 1e12}]
    a, b = cp.asnumpy(a_dev), cp.asnumpy(b_dev)
    del a_dev, b_dev, c_dev
    cp.get_default_memory_pool().free_all_blocks()

    calls = []
    original = ozaki_gpu.gemm

    def timed(alpha, x, y, z, beta=0.0, **kw):
        marks = []
        s = time.perf_counter()
        original(alpha, x, y, z, beta, marks=marks, **kw)
        calls.append((x.shape[0], y.shape[1], x.shape[1], time.perf_counter() - s, marks))
    ozaki_gpu.gemm = timed
    try:
        for budget, nb in zip(budgets, widths):
            kw = {"precision": "fp64-int8", "out_of_core": True, "device_memory": budget}
            if nb:
                kw["panel_width"] = nb
            summa.matmul(a, b, **kw)  # first call: plans, pins, warms the kernels
            calls.clear()
            stats = summa.SummaStats()
            t0 = time.perf_counter()
            summa.matmul(a, b, stats=stats, **kw)
            wall = time.perf_counter() - t0
            cp.cuda.Device().synchronize()
            phases = collections.Counter()
            gaps, host_in, shapes = 0.0, 0.0, collections.Counter()
            last = None
            for m_, n_, k_, host, marks in calls:
                shapes[f"{m_}x{n_}x{k_}"] += 1
                host_in += host
                phases.update(ozaki_gpu.phase_seconds(marks))
                if last is not None:
                    gaps += max(0.0, cp.cuda.get_elapsed_time(last, marks[0][1]) / 1e3)
                last = marks[-1][1]
            gpu = sum(phases.values())
            row = {"what": "out of core", "n": n, "device_memory": budget, "nb": nb,
                   "seconds": wall, "tflops": 2 * n**3 / wall / 1e12, "products": len(calls),
                   "shapes": dict(shapes), "gpu_in_products": gpu,
                   "gpu_gaps_between_products": gaps, "host_in_products": host_in,
                   "phases": dict(phases)}
            row["extra"] = {k: v for k, v in stats.extra.items()
                            if isinstance(v, (int, float, str, list))}
            rows.append(row)
    finally:
        ozaki_gpu.gemm = original
    for r in rows:
        print(json.dumps(r), flush=True)
    if args.json:
        with open(args.json, "a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    print()
    for r in rows:
        line = f"{r['what']:>12} {r.get('device_memory', ''):>6} nb {str(r.get('nb')):>6} " \
               f"{r['seconds']:7.3f} s {r['tflops']:6.1f} TFLOP/s"
        if "products" in r:
            line += (f"; {r['products']} products {r['shapes']}: GPU in them "
                     f"{r['gpu_in_products']:.3f} s (" + ", ".join(
                         f"{k} {v:.3f}" for k, v in r["phases"].items()) +
                     f"), GPU gaps between {r['gpu_gaps_between_products']:.3f} s, host inside "
                     f"the calls {r['host_in_products']:.3f} s")
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
