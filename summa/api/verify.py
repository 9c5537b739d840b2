"""Correctness checks with a PBLAS-style gauge.

The error of an element of ``alpha * A @ B + beta * C`` computed in a dtype
with unit roundoff ``eps`` is bounded by ``K * eps * (|alpha| |A||B| + |beta| |C|)``
(elementwise absolute values). Checks divide the observed error by that gauge:
a *scaled residual* <= 1 passes; a wrong result gives values far above 1.
"""

from __future__ import annotations

import numpy as np

from ..runtime.mpi import MPI
from ..device.numpy_backend import NumpyBackend
from ..runtime.watchdog import watch

__all__ = ["unit_roundoff", "reference_dtype", "scaled_error", "freivalds"]


def unit_roundoff(dtype, precision: str | None = None) -> float:
    """Machine epsilon of the arithmetic used for `dtype` (tf32 has 10 mantissa bits)."""
    if precision == "tf32":
        return 2.0 ** -10
    return float(np.finfo(np.dtype(dtype)).eps)


def reference_dtype(dtype) -> np.dtype:
    """float64 or complex128: the precision of references."""
    return np.dtype(np.complex128 if np.dtype(dtype).kind == "c" else np.float64)


def scaled_error(result, reference, gauge) -> float:
    """``max |result - reference| / gauge`` elementwise (inf where the gauge is 0
    but the error is not; NaN anywhere gives inf)."""
    err = np.abs(np.asarray(result, dtype=reference.dtype) - reference)
    gauge = np.asarray(gauge, dtype=np.float64)
    if not np.all(np.isfinite(err)):
        return float("inf")
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(gauge > 0, err / np.where(gauge > 0, gauge, 1), np.where(err > 0, np.inf, 0))
    return float(ratio.max(initial=0.0))


def _matvec(M, x: np.ndarray, absolute: bool, compute=None) -> np.ndarray:
    """``M @ x`` (or ``|M| @ x``) in reference precision, replicated on every rank.

    Each rank multiplies its block by its slice of `x` and scatters the partial
    sums into a full-length vector; one Allreduce over the grid adds them up.
    Rows are processed in chunks so the upcast copy stays small; `compute` (a
    GPU backend) does the work for a host-held block, chunk by chunk. A NumPy
    array `M` is one whole block, multiplied where called (no Allreduce).
    """
    whole = isinstance(M, np.ndarray)
    if compute is None:
        compute = NumpyBackend() if whole else M.backend
    xp, ref = compute.xp, reference_dtype(M.dtype)
    out_dtype = np.result_type(np.float64 if absolute else ref, x.dtype)
    local = M if whole else M.local
    rows = np.arange(M.shape[0]) if whole else M.row_indices()
    cols = np.arange(M.shape[1]) if whole else M.col_indices()
    xs = compute.asarray(x[cols])
    partial = np.zeros(M.shape[0], dtype=out_dtype)
    step = max(1, (1 << 25) // max(1, cols.size))
    for r0 in range(0, rows.size, step):
        block = compute.asarray(local[r0:r0 + step]).astype(ref, copy=False)
        if absolute:
            block = xp.abs(block)
        partial[rows[r0:r0 + step]] = compute.to_host(block @ xs)
    if whole:
        return partial
    out = np.empty_like(partial)
    with watch("the other ranks' matrix-vector products of the check"):
        M.grid.comm.Allreduce(partial, out, op=MPI.SUM)
    return out


def _check_operands(A, B, C, C0) -> None:
    """One clear error for operands that cannot be a product's."""
    given = [M for M in (A, B, C, C0) if M is not None]
    arrays = [isinstance(M, np.ndarray) for M in given]
    if any(arrays) and not all(arrays):
        raise TypeError("freivalds takes DistMatrix operands or NumPy arrays, not a mix")
    if any(len(M.shape) != 2 for M in given):
        raise ValueError("freivalds takes matrices (2-D)")
    (m, k), (k2, n) = A.shape, B.shape
    if k != k2 or tuple(C.shape) != (m, n) or (C0 is not None and tuple(C0.shape) != (m, n)):
        raise ValueError(f"freivalds: shapes A {tuple(A.shape)}, B {tuple(B.shape)}, C "
                         f"{tuple(C.shape)} are not those of C = A @ B")


def freivalds(A, B, C, alpha=1.0, beta=0.0, C0=None, vectors: int = 2, seed: int = 12345,
              precision: str | None = None, compute=None) -> float:
    """Scaled residual of ``C == alpha * A @ B + beta * C0`` by Freivalds' test.

    For random vectors ``x`` it compares ``C x`` with ``alpha A (B x) + beta C0 x``
    at O(N^2) cost, against the gauge ``(K + N) eps (|alpha||A|(|B||x|) + |beta||C0||x|)``
    (the GEMM's and the check's own rounding) plus ``(K + 2) eta sum|x|``, what
    C's elements may lose in the subnormal range (`eta` its dtype's smallest
    subnormal a rounding: a correctly rounded float16 product of values near
    1e-4, K = 1, was 2.5 times the gauge without it). On DistMatrix operands
    collective (every rank returns the same value).

    Parameters
    ----------
    A, B, C : DistMatrix or numpy.ndarray
        The operands (``op`` already applied) and the computed result:
        DistMatrix (collective), or NumPy arrays such as ``summa.matmul``'s
        (computed where called, on the host or on `compute`'s GPU).
    alpha, beta : scalar
    C0 : DistMatrix or numpy.ndarray, optional
        C's values before the update, needed when ``beta != 0``.
    vectors : int
        Number of random vectors.
    precision : str, optional
        ``"tf32"`` when the GEMM ran in TF32.
    compute : Backend, optional
        Where the products run when the matrices are host-held (out of core):
        a GPU backend streams them through the device, many times faster
        than the host. Default: each matrix's own backend.

    Returns
    -------
    float
        Largest scaled residual; <= 1 passes.
    """
    if beta != 0 and C0 is None:
        raise ValueError("freivalds needs C0 when beta != 0")
    _check_operands(A, B, C, C0)
    ref = reference_dtype(C.dtype)
    k, n = B.shape
    eps = unit_roundoff(C.dtype, precision)
    eta = float(np.finfo(C.dtype).smallest_subnormal)
    rng = np.random.default_rng(seed)
    worst = 0.0
    for _ in range(vectors):
        x = rng.uniform(-1.0, 1.0, n).astype(ref)
        ax = np.abs(x)
        expect = alpha * _matvec(A, _matvec(B, x, False, compute), False, compute)
        gauge = abs(alpha) * _matvec(A, _matvec(B, ax, True, compute), True, compute)
        if beta != 0:
            expect = expect + beta * _matvec(C0, x, False, compute)
            gauge = gauge + abs(beta) * _matvec(C0, ax, True, compute)
        got = _matvec(C, x, False, compute)
        underflow = (k + 2) * eta * float(ax.sum())
        worst = max(worst, scaled_error(got, expect, (k + n) * eps * gauge + underflow))
    return worst
