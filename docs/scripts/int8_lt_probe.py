"""INT8 GEMMs ("TN", int32 out) through cuBLASLt's algorithms against the
``cublasGemmEx`` call summa's fp64-int8 products make (issue 25: "the INT8
figure may rise with cuBLASLt"), on one GPU: every algorithm cuBLASLt's
heuristic offers for the shape, timed alone and as 16 back to back (one
float64 product's worth, under the power cap), bits checked against gemmEx.

    python3 docs/scripts/int8_lt_probe.py --sizes 16384,32768
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "docs", "scripts"))

_COMPUTE_32I, _R_8I, _R_32I, _OP_T = 72, 3, 10, 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="16384,32768")
    p.add_argument("--candidates", type=int, default=16)
    p.add_argument("--json")
    args = p.parse_args()
    import cupy as cp
    import numpy as np
    from ozaki_probe import _best
    from summa import lt
    from summa.backend import get_backend
    backend = get_backend("cupy")
    lt.CANDIDATES = args.candidates
    gemm = lt.LtGemm(cp)
    stream = cp.cuda.get_current_stream().ptr
    rows = []
    for n in map(int, args.sizes.split(",")):
        a8 = cp.random.randint(-128, 128, (n, n), dtype=cp.int8)
        bt8 = cp.random.randint(-128, 128, (n, n), dtype=cp.int8)
        want, out = cp.empty((n, n), dtype=cp.int32), cp.empty((n, n), dtype=cp.int32)
        ops = 2 * n**3
        sec = _best(lambda: backend.int8_gemm_tn(a8, bt8, want), 3)
        burst = _best(lambda: [backend.int8_gemm_tn(a8, bt8, want) for _ in range(16)], 2)
        rows.append({"what": "gemmEx", "n": n, "tops": ops / sec / 1e12,
                     "tops_16": 16 * ops / burst / 1e12})
        print(json.dumps(rows[-1]), flush=True)
        # The same column-major call as gemmEx's: out^T (n x n) = bt8^T a8, K contiguous.
        desc = gemm._desc(_COMPUTE_32I, _R_32I)
        trans = ctypes.c_int(_OP_T)
        gemm._check(gemm.lib.cublasLtMatmulDescSetAttribute(
            desc, ctypes.c_int(lt._DESC_TRANSA), ctypes.byref(trans), ctypes.c_size_t(4)),
            "cublasLtMatmulDescSetAttribute")
        la, lb = gemm._layout(_R_8I, n, n, n), gemm._layout(_R_8I, n, n, n)
        lc = gemm._layout(_R_32I, n, n, n)
        aligns = {"a": 256, "b": 256, "c": 256, "d": 256}
        found = gemm._candidates(desc, la, lb, lc, aligns)
        one, zero = np.ones(1, dtype=np.int32), np.zeros(1, dtype=np.int32)
        for i, result in enumerate(found):
            def run(algo=result.algo):
                status = gemm._run(desc, algo, one.ctypes.data, zero.ctypes.data,
                                   bt8.data.ptr, la, a8.data.ptr, lb, out.data.ptr, lc, stream)
                if status:
                    raise RuntimeError(f"cublasLtMatmul status {status}")
            try:
                sec = _best(run, 3)
                burst = _best(lambda: [run() for _ in range(16)], 2)
                same = bool((out == want).all())
            except RuntimeError as exc:
                print(f"algorithm {i}: {exc}", flush=True)
                continue
            rows.append({"what": f"cuBLASLt algorithm {i}", "n": n, "tops": ops / sec / 1e12,
                         "tops_16": 16 * ops / burst / 1e12, "same_bits": same,
                         "workspace": int(result.workspace_size),
                         "waves": float(result.waves_count)})
            print(json.dumps(rows[-1]), flush=True)
        for layout in (la, lb, lc):
            gemm.lib.cublasLtMatrixLayoutDestroy(layout)
    if args.json:
        with open(args.json, "a") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    print()
    for r in rows:
        print(f"{r['what']:>24} N={r['n']:>6} {r['tops']:8.1f} TOPS alone, {r['tops_16']:8.1f} "
              f"16 back to back" + ("" if "same_bits" not in r else
                                   f", same bits as gemmEx {r['same_bits']}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
