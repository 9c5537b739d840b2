"""Where does SUMMA's per-panel GEMM lose against one big GEMM? (one GPU, no MPI)

Times, for one rank's share of an N^3 product on a 2x1 grid (m = N/2, n = k = N):
one GEMM over all of K (cupy.matmul, and cuBLAS gemmEx as summa calls it), then the
same work as K/nb accumulating GEMMs on contiguous panel copies and on strided views.

    python3 docs/scripts/panel_gemm_probe.py 32768 float64 4096
"""

import os
import sys

import cupy
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from probe_timing import round_robin  # noqa: E402
from summa.backend import CupyBackend  # noqa: E402

n = int(sys.argv[1]) if len(sys.argv) > 1 else 32768
dtype = np.dtype(sys.argv[2] if len(sys.argv) > 2 else "float64")
nbs = [int(x) for x in sys.argv[3:]] or [2048, 4096, 8192]
m, k = n // 2, n
backend = CupyBackend(0)
rng = cupy.random.default_rng(1)
a = rng.standard_normal((m, k)).astype(dtype)
b = rng.standard_normal((k, n)).astype(dtype)
c = cupy.zeros((m, n), dtype=dtype)
flops = 2.0 * m * n * k


cases = {"cupy.matmul, one GEMM": lambda: cupy.matmul(a, b, out=c),
         "gemmEx, one GEMM": lambda: backend.gemm(1.0, a, b, c, beta=0.0)}
for nb in nbs:
    bufs = cupy.empty((m, nb), dtype=dtype)

    def copies(nb=nb, bufs=bufs):
        for k0 in range(0, k, nb):
            bufs[...] = a[:, k0:k0 + nb]
            backend.gemm(1.0, bufs, b[k0:k0 + nb], c, beta=0.0 if k0 == 0 else 1.0)

    def views(nb=nb):
        for k0 in range(0, k, nb):
            backend.gemm(1.0, a[:, k0:k0 + nb], b[k0:k0 + nb], c, beta=0.0 if k0 == 0 else 1.0)
    cases[f"{k // nb} panels nb={nb}, copied A panels"] = copies
    cases[f"{k // nb} panels nb={nb}, strided views"] = views
rows = list(round_robin(cases).items())  # in turns: a cool GPU favours nothing
print(f"m x n x k = {m} x {n} x {k} {dtype.name}")
for label, seconds in rows:
    print(f"{label:40s} {seconds:8.4f} s {flops / seconds / 1e12:8.1f} TFLOP/s "
          f"{rows[0][1] / seconds:6.3f} of matmul")
