"""What the first fp64-int8 product of a fresh process costs beyond the
product (the user's first call on a fresh machine took 9.8 s where
later first calls took 2.1-3.7): in a child process with an empty CuPy
kernel cache (``CUPY_CACHE_DIR``) and again with the one it filled, the
first and second product of a small shape (below cuBLASLt's timing, so only
CuPy's compilation and cuBLAS's start count), float64 first.

    python3 benchmarks/fp64_int8_first_product.py [--size 2048]
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


def child(n: int) -> list[dict]:
    sys.path.insert(0, ROOT)
    start = time.perf_counter()
    import cupy as cp
    from summa.device.backend import get_backend
    rows = [{"what": "import and backend", "seconds": None}]
    backend = get_backend("cupy")
    rows[0]["seconds"] = time.perf_counter() - start
    a, b = cp.random.random((n, n)), cp.random.random((n, n))
    c = cp.empty((n, n))
    cp.cuda.Device().synchronize()
    for precision in (None, "fp64-int8"):
        for call in ("first", "second"):
            s = time.perf_counter()
            backend.gemm(1.0, a, b, c, beta=0.0, precision=precision)
            cp.cuda.Device().synchronize()
            rows.append({"what": f"{precision or 'float64'} {call} product",
                         "seconds": time.perf_counter() - s})
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", type=int, default=2048)
    p.add_argument("--json")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args.size)))
        return 0
    rows = []
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, CUPY_CACHE_DIR=cache)
        for kernels in ("empty kernel cache", "kernel cache kept"):
            out = subprocess.run([sys.executable, __file__, "--child", "--size", str(args.size)],
                                 env=env, capture_output=True, text=True)
            if out.returncode:
                print(out.stdout[-2000:], out.stderr[-4000:], file=sys.stderr)
                return out.returncode
            rows += [dict(r, kernels=kernels, n=args.size)
                     for r in json.loads(out.stdout.strip().splitlines()[-1])]
    for r in rows:
        calls.append_json(args.json, r)
    for r in rows:
        print(f"{r['kernels']:>18}  {r['what']:<26} {r['seconds']:8.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
