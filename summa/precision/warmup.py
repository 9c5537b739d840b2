"""fp64-int8's kernels made before its first product: :func:`ready` loads
them (:func:`summa.precision.kernels.module`: the shipped binary, else one
compile of the source) and runs small products, which start cuBLAS's
integer products, so that a call's figures say what this took apart from
the product.

Compiling the kernels in the background while a plain process's first call
started MPI gained nothing on an H100 (0.64-0.68 s of ``ready()`` after
0.30-0.44 s of MPI's start, against 0.67-0.73 s alone): mpi4py's
``MPI_Init_thread`` holds the GIL all along. Shipping them compiled
(:mod:`summa.precision.binaries`) leaves nothing to overlap.
"""

from __future__ import annotations

import time

import numpy as np

from . import kernels, ozaki
from .ozaki_gpu import gemm

__all__ = ["READY_PRODUCTS", "ready"]


#: The small products :func:`ready` makes: ``(m, k, n)`` and whether C's
#: rows lie apart (a transposed view: the sums through the finish kernel;
#: else the last fold ends the product).
READY_PRODUCTS = (((8, ozaki.K_NATIVE + 4, 16), False), ((16, ozaki.K_NATIVE + 4, 8), True))


def ready(dtype, backend) -> float:
    """Load (or compile) the kernels a `dtype` product takes and run
    :data:`READY_PRODUCTS`, the first time in this process; seconds it took
    (0 after). On a fresh H100 compiling CuPy's kernels one by one took 6.0 s
    of a float64 40960³ first call under 24 GiB; side by side, with the
    reductions raw, 0.6-1.1 s (`benchmarks/fp64_int8_user_case.py`); the
    shipped binary loads in milliseconds."""
    import cupy
    dtype = cupy.dtype(dtype)
    key = ("ready", dtype.char)
    if key in kernels.cache:
        return 0.0
    began = time.perf_counter()
    kernels.module()
    rng = np.random.default_rng(0)  # made on the host: no CuPy kernel to compile
    for (m, k, n), apart in READY_PRODUCTS:
        a, b = rng.uniform(-1, 1, (m, k)), rng.uniform(-1, 1, (k, n))
        if dtype.kind == "c":
            a, b = a + 1j * a, b - 1j * b
        c = cupy.zeros((n, m), dtype=a.dtype).T if apart else cupy.zeros((m, n), dtype=a.dtype)
        gemm(1.0, cupy.asarray(a), cupy.asarray(b), c, 0.5 if apart else 0.0, backend=backend)
    cupy.cuda.get_current_stream().synchronize()
    kernels.cache[key] = True
    return time.perf_counter() - began
