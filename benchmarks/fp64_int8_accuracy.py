"""Accuracy of float64 on INT8 products (summa.precision.ozaki, the NumPy form of the GPU
kernels' arithmetic) against native float64, by data: max error / float64
PBLAS gauge (K eps |A||B|) against an 80-bit (long double) reference; each
count of moduli labelled with the bits it keeps in every row (rows of
spread-out entries keep more).

    python3 benchmarks/fp64_int8_accuracy.py --m 128 --k 2048
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _data(kind: str, rng, m: int, k: int, n: int):
    if kind == "uniform [-1, 1)":
        return rng.uniform(-1, 1, (m, k)), rng.uniform(-1, 1, (k, n))
    if kind == "normal":
        return rng.standard_normal((m, k)), rng.standard_normal((k, n))
    if kind == "rows and columns at 1e±8":  # each row (column) at its own scale
        return (rng.uniform(-1, 1, (m, k)) * 10.0 ** rng.uniform(-8, 8, (m, 1)),
                rng.uniform(-1, 1, (k, n)) * 10.0 ** rng.uniform(-8, 8, (1, n)))
    # one entry of each row 1e16 above the others (the scheme's honest limit)
    a = rng.uniform(-1, 1, (m, k)) * 1e-8
    a[:, 0] *= 1e16
    b = rng.uniform(-1, 1, (k, n))
    b[0] *= 1e-8
    return a, b


KINDS = ("uniform [-1, 1)", "normal", "rows and columns at 1e±8",
         "a row spanning 1e16 (one large entry)")


def main() -> int:
    from summa.precision import ozaki
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--m", type=int, default=128)
    p.add_argument("--k", type=int, default=2048)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--fewer", default="-1,0,2",
                   help="moduli counts as so many fewer than the default (comma-separated; "
                        "-1 is one more)")
    args = p.parse_args()
    rng = np.random.default_rng(args.seed)
    m = n = args.m
    k = args.k
    full = ozaki.default_moduli(ozaki.BITS, k)
    counts = [full - int(x) for x in args.fewer.split(",")]
    print(f"M = N = {m}, K = {k}; max |C - C_exact| / (K eps |A||B|), C_exact in long double")
    print(f"{'data':>40} {'native':>9} " + " ".join(
        f"{f'{c} moduli (>={ozaki.bits_for(c, k)} b)':>18}" for c in counts))
    for kind in KINDS:
        a, b = _data(kind, rng, m, k, n)
        exact = a.astype(np.longdouble) @ b.astype(np.longdouble)
        gauge = k * np.finfo(np.float64).eps * (np.abs(a) @ np.abs(b))

        def err(c):
            return float(np.max((np.abs(c - exact) / gauge).astype(np.float64)))
        row = [err(a @ b)] + [err(ozaki.gemm_int8(a, b, moduli=c)) for c in counts]
        print(f"{kind:>40} {row[0]:9.2e} " + " ".join(f"{e:18.2e}" for e in row[1:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
