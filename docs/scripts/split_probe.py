"""Does cutting one rank's product into narrower GEMMs run faster on one GPU?

The per-GPU share of N = 32768 on a 2x1 grid (16384 x 32768 x 32768, float64
by default), as one GEMM and as column, row and K pieces (cuBLAS gemmEx, the
GEMM summa calls), median of 5 turns taken in round robin (probe_timing.py):

    python3 docs/scripts/split_probe.py [dtype] [tf32] [at]

``at``: A stored column-major (cuBLAS's transposed operand) in every case; the
row-major runs also time 8 K panels each first copied transposed (as
``SUMMA_TRANSPOSE_A`` does) and one GEMM on a column-major copy of A.
"""
import os
import sys

import cupy
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from probe_timing import round_robin  # noqa: E402
from summa.backend import CupyBackend  # noqa: E402

dtype = np.dtype(sys.argv[1] if len(sys.argv) > 1 else "float64")
precision = "tf32" if "tf32" in sys.argv[2:] else None
column_major = "at" in sys.argv[2:]
m, k, n = 16384, 32768, 32768
be = CupyBackend(0)


def gemm(alpha, x, y, out, beta):
    be.gemm(alpha, x, y, out, beta=beta, precision=precision)


rng = cupy.random.default_rng(1)
a = rng.uniform(-1, 1, (m, k)).astype(dtype)
if column_major:
    a = cupy.asfortranarray(a)
b = rng.uniform(-1, 1, (k, n)).astype(dtype)
c = cupy.zeros((m, n), dtype=dtype)
cols = {p: [cupy.zeros((m, n // p), dtype=dtype) for _ in range(p)] for p in (2, 4)}


def column_pieces(p):  # separate C pieces
    w = n // p
    for j in range(p):
        gemm(1.0, a, b[:, j * w:(j + 1) * w], cols[p][j], beta=0.0)


def column_strips(p):  # strided views of one C, as --schedule strips writes them
    w = n // p
    for j in range(p):
        gemm(1.0, a, b_strips[p][j], c[:, j * w:(j + 1) * w], beta=0.0)


# a strip of B arrives in a buffer of its own (all of K by the strip's width)
b_strips = {4: [cupy.ascontiguousarray(b[:, j * (n // 4):(j + 1) * (n // 4)]) for j in range(4)]}


def row_pieces(p):
    h = m // p
    for i in range(p):
        gemm(1.0, a[i * h:(i + 1) * h], b, c[i * h:(i + 1) * h], beta=0.0)


def k_pieces(p):
    w = k // p
    for i in range(p):
        gemm(1.0, a[:, i * w:(i + 1) * w], b[i * w:(i + 1) * w], c, beta=0.0 if i == 0 else 1.0)


c2 = cupy.zeros((m, n), dtype=dtype)


def k_halves_apart():
    """The K halves with beta = 0 into two outputs, then one add: is it beta = 1
    (reading C) or the shorter K that costs the split?"""
    w = k // 2
    gemm(1.0, a[:, :w], b[:w], c, beta=0.0)
    gemm(1.0, a[:, w:], b[w:], c2, beta=0.0)
    c.__iadd__(c2)


def k_halves_beta0():
    """The second half alone with beta = 0 twice (wrong sum, same kernels): the
    rate of two K/2 GEMMs without reading C."""
    w = k // 2
    gemm(1.0, a[:, :w], b[:w], c, beta=0.0)
    gemm(1.0, a[:, w:], b[w:], c, beta=0.0)


def transposed_panels(p):
    """K panels, each copied transposed into one scratch buffer first."""
    w = k // p
    for i in range(p):
        copy = scratch[: m * w].reshape(w, m)
        be.transpose(a[:, i * w:(i + 1) * w], copy)
        gemm(1.0, copy.T, b[i * w:(i + 1) * w], c, beta=0.0 if i == 0 else 1.0)


cases = [("one GEMM", lambda: gemm(1.0, a, b, c, beta=0.0)),
         ("cupy.matmul", lambda: cupy.matmul(a, b, out=c))]
cases += [(f"{p} column pieces", lambda p=p: column_pieces(p)) for p in (2, 4)]
cases += [("4 column strips of one C", lambda: column_strips(4))]
cases += [(f"{p} row pieces", lambda p=p: row_pieces(p)) for p in (2, 4)]
cases += [(f"{p} K pieces", lambda p=p: k_pieces(p)) for p in (2, 8)]
cases += [("2 K pieces, beta 0 + add", k_halves_apart), ("2 K pieces, both beta 0", k_halves_beta0)]
if not column_major:
    scratch = cupy.empty(m * (k // 8), dtype=dtype)
    a_cm = cupy.asfortranarray(a)
    cases += [("8 K panels, copied transposed", lambda: transposed_panels(8)),
              ("one GEMM, A column-major", lambda: gemm(1.0, a_cm, b, c, beta=0.0))]
flops = 2.0 * m * n * k
print(f"{m} x {n} x {k} {dtype.name}{'/tf32' if precision else ''}, TFLOP/s"
      + (", A column-major" if column_major else "")
      + (" (cupy.matmul without TF32)" if precision else ""))
for name, seconds in round_robin(dict(cases)).items():
    print(f"{name:26s} {flops / seconds / 1e12:7.1f}", flush=True)
