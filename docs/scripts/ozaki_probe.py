"""The rates float64 on INT8 tensor cores (issue 25) is built from, on one GPU:
native DGEMM, cuBLAS's INT8 GEMM (``cublasGemmEx`` 8I -> 32I, the "TN" form)
by shape, and summa's whole ``precision="fp64-int8"`` product with its error
against the float64 gauge.

    python3 docs/scripts/ozaki_probe.py --sizes 16384,32768 --json ozaki.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _best(fn, repeat: int) -> float:
    import cupy as cp
    fn()
    times = []
    for _ in range(repeat):
        cp.cuda.Device().synchronize()
        s = time.perf_counter()
        fn()
        cp.cuda.Device().synchronize()
        times.append(time.perf_counter() - s)
    return min(times)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="16384,32768")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--emulated", action="store_true", help="also summa's fp64-int8 product")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    import cupy as cp
    import numpy as np
    from summa.backend import get_backend
    backend = get_backend("cupy")
    rows = []

    def emit(r):
        rows.append(r)
        print(json.dumps(r), flush=True)
    for n in map(int, args.sizes.split(",")):
        a = cp.random.random((n, n)) * 2 - 1
        b = cp.random.random((n, n)) * 2 - 1
        c = a @ b
        sec = _best(lambda: cp.matmul(a, b, out=c), args.repeat)
        emit({"what": "dgemm", "n": n, "seconds": sec, "tflops": 2 * n**3 / sec / 1e12})
        del c
        a8 = cp.random.randint(-128, 128, (n, n), dtype=cp.int8)
        b8 = cp.random.randint(-128, 128, (n, n), dtype=cp.int8)
        sec = _best(lambda: backend.int8_product(a8, b8), args.repeat)
        emit({"what": "int8_product", "n": n, "seconds": sec, "tops": 2 * n**3 / sec / 1e12})
        # The bare GEMM, B already transposed (what a fused residue kernel can write).
        bt = cp.ascontiguousarray(b8.T)
        out = cp.empty((n, n), dtype=cp.int32)
        sec = _best(lambda: backend.int8_gemm_tn(a8, bt, out), args.repeat)
        emit({"what": "int8_gemm_tn", "n": n, "seconds": sec, "tops": 2 * n**3 / sec / 1e12})
        del a8, b8, bt, out
        if args.emulated:
            from summa import ozaki
            ref = a @ b
            gauge = cp.abs(a) @ cp.abs(b)
            got = ozaki.gemm_int8(a, b, xp=cp, backend=backend)
            err = float(cp.max(cp.abs(got - ref) / (n * np.finfo(np.float64).eps * gauge)))
            del got, ref, gauge
            sec = _best(lambda: ozaki.gemm_int8(a, b, xp=cp, backend=backend), args.repeat)
            emit({"what": "fp64-int8", "n": n, "seconds": sec, "tflops": 2 * n**3 / sec / 1e12,
                  "error_per_gauge": err})
        del a, b
        cp.get_default_memory_pool().free_all_blocks()
    if args.json:
        with open(args.json, "a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    for r in rows:
        rate = r.get("tflops", r.get("tops"))
        print(f"{r['what']:>14} N={r['n']:>6} {r['seconds']:8.4f} s {rate:9.1f} "
              f"{'TFLOP/s' if 'tflops' in r else 'TOPS'}"
              + (f"  error/gauge {r['error_per_gauge']:.2e}" if "error_per_gauge" in r else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
