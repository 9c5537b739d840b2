"""Panels copied transposed before their GEMMs, where the GPU's GEMM reads
them faster so: A's column-major (:func:`summa.planning.tuning.transposes_a`),
B's that lie by columns row-major (:func:`summa.planning.tuning.transposes_b`).

On an H200, cuBLAS multiplied one rank's share of N = 32768 at 56.6 TFLOP/s in
float64 with A column-major against 52.1 row-major (XLA lays out JAX's operands
so, which is how JAX's sharded matmul beat P x cupy.matmul). Transposing a
panel reads and writes it once (512 MiB each way for a 4096-wide float64 panel
of 16384 rows: a fraction of a millisecond of HBM time), while its GEMM runs
~80 ms. Whole runs on 2 H200s: float64 111.1 against 105.8 TFLOP/s, float32
107.2 against 102.1 (docs/benchmarks.md, "Measurements behind the defaults").
"""

from __future__ import annotations

from ..planning.tuning import column_major

__all__ = ["PanelsOfA", "PanelsOfB", "PanelForms"]


class PanelsOfA:
    """The A operand of each panel GEMM: the panel itself, or (`transpose`) its
    transposed copy in one scratch buffer of `width` x `rows`, read by the
    GEMM column-major (``copy.T``).

    The copy is queued on the current (compute) stream right before its GEMM,
    so one GEMM's read of the buffer comes before the next panel's copy into it.
    """

    def __init__(self, backend, rows: int, width: int, dtype, transpose: bool):
        self.backend = backend
        self.transpose = bool(transpose)
        self.buffer = backend.xp.empty(rows * width if self.transpose else 0, dtype=dtype)

    def __call__(self, a):
        """`a` (rows x panel width) as its GEMM should read it: as it is where
        it is column-major already (A stored by columns, :mod:`summa.host.storage`)."""
        if not self.transpose or a.size == 0 or column_major(a):
            return a
        m, w = a.shape
        copy = self.buffer[: m * w].reshape(w, m)
        self.backend.transpose(a, copy)
        return copy.T


class PanelsOfB:
    """The B operand of each panel GEMM: the panel itself, or (`transpose`)
    where it is column-major, its row-major copy in one scratch buffer of
    `width` x `cols`, conjugated there where its GEMM was to conjugate it
    (cuBLAS conjugates only what it reads transposed).

    Like :class:`PanelsOfA`, the copy is queued on the current (compute)
    stream right before its GEMM.
    """

    def __init__(self, backend, width: int, cols: int, dtype, transpose: bool):
        self.backend = backend
        self.transpose = bool(transpose)
        self.buffer = backend.xp.empty(width * cols if self.transpose else 0, dtype=dtype)

    def __call__(self, b, conj: bool = False) -> tuple:
        """``(operand, conj)``: `b` (panel width x cols) as its GEMM should
        read it, and whether that GEMM still conjugates it."""
        if not self.transpose or b.size == 0 or not column_major(b):
            return b, conj
        w, n = b.shape
        copy = self.buffer[: w * n].reshape(w, n)
        self.backend.transpose(b.T, copy, conj)
        return copy, False


class PanelForms:
    """How each panel GEMM reads its operands: A as `a` (:class:`PanelsOfA`)
    gives it, B as `b` (:class:`PanelsOfB`)."""

    def __init__(self, a: PanelsOfA, b: PanelsOfB):
        self.a, self.b = a, b

    def __call__(self, a, b, conj: tuple = (False, False)) -> tuple:
        """``(a, b, conj)`` for the GEMM of panels `a` and `b`, `conj` (A's,
        B's) what it still conjugates."""
        b, conj_b = self.b(b, conj[1])
        return self.a(a), b, (conj[0], conj_b)
