"""The ideal a benchmark sets beside summa: this rank's share of the work as
one product on its device alone (``summa bench``'s "ideal" and
"efficiency"), planned as one GEMM on device data is
(:func:`summa.planning.memory.resident_plan`), and skipped where it would
not fit."""

from __future__ import annotations

import time

import numpy as np

from ..planning.memory import resident_plan
from ..planning.planner import FREE_SHARE
from ..planning.precision import moduli_asked
from ..precision import ozaki_gpu

__all__ = ["ideal_memory", "ideal_bytes", "single_device_seconds"]


def ideal_memory(shape, dtype, transposed_a: bool = False, precision=None, free=None):
    """The MemoryPlan of :func:`single_device_seconds`' product: its operands,
    C, and fp64-int8's scratch, its rows in chunks within `free` (one GEMM on
    the device: its whole scratch ran a 32768³ ideal out of an 80 GB GPU)."""
    m, n, k = shape
    copies = (m * k * (1 + transposed_a) + k * n) * np.dtype(dtype).itemsize
    return resident_plan(m, n, k, dtype, precision, copies,
                         budget=None if free is None else int(free * FREE_SHARE))


def ideal_bytes(shape, dtype, transposed_a: bool = False, precision=None, free=None) -> int:
    """Device bytes of :func:`single_device_seconds`' product."""
    return ideal_memory(shape, dtype, transposed_a, precision, free).device_bytes


def single_device_seconds(backend, shape, dtype, precision, repeat: int = 3,
                           transposed_a: bool = False) -> tuple[float, float]:
    """Best time of this rank's share of the work, (rows of C here) x (columns
    of C here) x K, as one product on this rank's device alone: the best of
    ``xp.matmul`` and the backend's own GEMM (the one summa uses), and with
    `transposed_a` (summa read A column-major) that GEMM on a column-major A;
    and the best with A row-major (as the user holds it). (None, None) where
    its operands would not fit the device (out of core, or in memory near
    the device's size): the ideal is then skipped, not the run."""
    m, n, k = shape
    if 0 in shape:
        return 0.0, 0.0
    free = backend.memory_free()
    memory = ideal_memory(shape, dtype, transposed_a, precision, free)
    if free is not None and memory.device_bytes > 0.95 * free:
        return None, None
    # the moduli asked (as the run's plan takes them), the rows and planes its own memory's
    scheme = ozaki_gpu.Scheme(moduli=moduli_asked(), rows=memory.int8_rows,
                              planes=memory.int8_planes or ozaki_gpu.PLANES) \
        if precision == "fp64-int8" else None
    xp = backend.xp
    rng = xp.random.default_rng()
    a = rng.standard_normal((m, k)).astype(dtype)
    b = rng.standard_normal((k, n)).astype(dtype)
    c = xp.matmul(a, b)
    row_major = [lambda: backend.gemm(1.0, a, b, c, beta=0.0, precision=precision,
                                      scheme=scheme)]
    if precision in (None, "default") or dtype.char not in "fF":
        row_major.append(lambda: xp.matmul(a, b, out=c))
    column_major = []
    if transposed_a:
        a_cm = xp.asfortranarray(a)
        column_major.append(lambda: backend.gemm(1.0, a_cm, b, c, beta=0.0,
                                                 precision=precision, scheme=scheme))
    best = []
    for run in row_major + column_major:
        run()
        best.append(float("inf"))
        for _ in range(repeat):
            backend.synchronize()
            t0 = time.perf_counter()
            run()
            backend.synchronize()
            best[-1] = min(best[-1], time.perf_counter() - t0)
    return min(best), min(best[:len(row_major)])
