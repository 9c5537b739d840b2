"""fp64-int8's kernels made before its first product: :func:`ready`
compiles (or loads from CuPy's kernel cache on disk) every kernel variant a
dtype's products take, side by side, and runs small products that find
them made.

Compiling them in the background while a plain process's first call starts
MPI gained nothing on an H100 (0.64-0.68 s of ``ready()`` after 0.30-0.44 s
of MPI's start, against 0.67-0.73 s alone): mpi4py's ``MPI_Init_thread``
holds the GIL all along, so the compiling threads wait for it.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from . import kernels, ozaki
from .kernels import kernel
from .ozaki_gpu import gemm

__all__ = ["READY_PRODUCTS", "ready", "warmers"]


#: The small products :func:`ready` makes: ``(m, k, n)`` and whether C is a
#: strip of a wider array. CuPy compiles an elementwise kernel again for
#: another number of dimensions (contiguous or a view): long rows and a strip
#: of C, as the sweep's are.
READY_PRODUCTS = (((8, ozaki.K_NATIVE + 4, 16), True), ((1024, 1028, 1024), False),
                  ((1024, 1028, 1024), True))


def ready(dtype, backend) -> float:
    """Compile (or load from CuPy's kernel cache on disk) every kernel a
    `dtype` product takes, the first time in this process; seconds it took
    (0 after). Each kernel variant the small products :data:`READY_PRODUCTS`
    launch is compiled in a thread of its own (:func:`warmers`: NVRTC lets
    go of the GIL), then those products run, which compile whatever the
    threads missed. On a fresh machine the kernels, compiled one by one,
    took 6.0 s of a float64 40960³ first call under 24 GiB (12.4 s, the
    second 2.7: `benchmarks/fp64_int8_user_case.py`); side by side 5.7-10.7 s
    on fresh H100s, as long as CuPy's reduction kernels took (a variant per
    shape class). With those raw (:class:`summa.precision.kernels.Reduction`:
    one compile for any shape) fresh H100s compiled for 0.6-1.1 s. CuPy keeps
    them on disk, so a later process loads them (0.1-0.2 s). Run before a
    call's clock, so that its figures say what compiling took apart from
    the product."""
    import cupy
    dtype = cupy.dtype(dtype)
    key = ("ready", dtype.char)
    if key in kernels.cache:
        return 0.0
    began = time.perf_counter()
    _warm_all(warmers(dtype.kind == "c"), cupy.cuda.Device().id)
    rng = np.random.default_rng(0)  # made on the host: no CuPy kernel to compile
    for (m, k, n), strip in READY_PRODUCTS:
        a, b = rng.uniform(-1, 1, (m, k)), rng.uniform(-1, 1, (k, n))
        if dtype.kind == "c":
            a, b = a + 1j * a, b - 1j * b
        c = cupy.zeros((m, n + 8 * strip), dtype=a.dtype)[:, :n]
        gemm(1.0, cupy.asarray(a), cupy.asarray(b), c, 0.5 if strip else 0.0, backend=backend)
    cupy.cuda.get_current_stream().synchronize()
    kernels.cache[key] = True
    return time.perf_counter() - began


def _warm_all(calls: list, device: int) -> None:
    """Each of `calls` (:func:`warmers`) in a thread of its own on `device`."""
    import cupy

    def warm(call):
        with cupy.cuda.Device(device):  # a thread starts on device 0
            call()
            cupy.cuda.get_current_stream().synchronize()
    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        list(pool.map(warm, calls))


def warmers(complex_: bool = False) -> list:
    """Calls that each launch one kernel variant of :data:`READY_PRODUCTS`'
    products, once, on zeros of their shapes (complex: also those of the
    complex products' parts): what :func:`ready` compiles side by side."""
    import cupy
    for name in ("exponents", "finish", "combine"):
        kernel(name)  # made here: the threads only compile their variants

    def finish(m, n):  # a strip of C: the sums through the finish kernel
        return lambda: kernel("finish")(
            cupy.zeros((m, n)), cupy.zeros((m, n)), cupy.zeros((m, 1), dtype=cupy.int32),
            cupy.zeros((1, n), dtype=cupy.int32), 1.0, 0.0, np.int32(0), 1.0, 0.0,
            cupy.zeros((m, n + 8))[:, :n])
    # (the raw kernels, the reductions' among them: one compile whatever the shapes)
    calls = {name: kernel(name).compile
             for name in ("residues", "fold", "fold_finish", "reduce_inner", "reduce_outer")}
    # the scaling's exponents, from the reductions' 1-D outputs: one variant
    calls["exponents"] = lambda: kernel("exponents")(cupy.zeros(2), cupy.ones(2), np.int32(1),
                                                     np.float64(1.0))
    for (m, k, n), strip in READY_PRODUCTS:
        if strip:
            calls.setdefault(("finish", m, n), finish(m, n))
    if complex_:
        calls["parts"] = lambda: cupy.ascontiguousarray(cupy.zeros((2, 2), complex).real)
        for strip in (False, True):  # C whole, and a strip of a wider C
            calls[("combine", strip)] = lambda strip=strip: kernel("combine")(
                cupy.zeros((2, 2)), cupy.zeros((2, 2)), 1j, 0j,
                cupy.zeros((2, 2 + strip), complex)[:, :2])
    return list(calls.values())
