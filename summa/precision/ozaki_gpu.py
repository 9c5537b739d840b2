"""Ozaki scheme II on the GPU: :mod:`summa.precision.ozaki`'s steps fused into CuPy
kernels, the residue products on the INT8 tensor cores (cuBLAS, cuBLASLt).

``gemm(alpha, a, b, c, beta)`` computes ``c = alpha a @ b + beta c`` for
float64 CuPy arrays (complex128 from four real products):

1. the largest magnitude of each row of A and column of B (one reduction
   each, which also finds Inf/NaN) and their 2-norms (another) give the
   scaling exponents (:func:`summa.precision.ozaki.exponents`);
2. one kernel reads A once and writes its residues for every modulus (int8
   planes, K contiguous and padded to 4); B is transposed first (cuBLAS
   geam) so its planes are K-contiguous too, as the fast INT8 kernels need;
3. per modulus one INT8 GEMM ("TN", int32: cuBLASLt's fastest algorithm for
   large products, else ``cublasGemmEx``; :func:`summa.device.backend.int8_library`),
   its product folded into two float64 sums per element a few planes at a time;
4. the last fold turns the sums into the result, scaled and accumulated
   (a kernel of its own where C's rows are not contiguous).

Steps 2-4 of A and C may run a chunk of rows at a time (:attr:`Scheme.rows`,
chosen by the plan): B's exponents and planes are made once, A's exponents
once for all rows; each chunk's residues, integer products and sums take
the place of the last one's, so the scratch grows with the chunk, not with
C (:func:`scratch_bytes`), and every element is the same as without chunks.

On a grid SUMMA gives a rank K in panels: :mod:`summa.precision.panel_sums`
sums their INT8 products in int32 with exponents agreed over all of K
(:func:`scaling_exponents` with a communicator) and folds C once, where
memory allows.

Every operation mirrors the NumPy code of :mod:`summa.precision.ozaki` (the same
float64 formulas), so the two agree (tests/test_gpu.py).

This module holds the products (the steps above, the scopes they share, the
scratch they take); the CUDA kernels, their launches and the folds of the
integer products are :mod:`summa.precision.kernels`'.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math

import numpy as np

from . import ozaki
from .kernels import (PLANES, Encoding, Folds, combine, exponents, kernel, moduli_constants,
                      planes_a_pass, residue_planes, split)

__all__ = ["gemm", "Scheme", "scaling_exponents", "refuse_not_finite", "moduli_for",
           "check_moduli", "phase_seconds", "same_b", "checked_later", "scratch_bytes", "PLANES",
           "NOT_FINITE"]


@dataclasses.dataclass(frozen=True)
class Scheme:
    """How a product runs the scheme, beside its operands: what
    :func:`gemm`, :class:`summa.precision.panel_sums.PanelSums` and
    :func:`summa.precision.panel_sums.grid_exponents` take (the
    defaults: the module's).

    Attributes
    ----------
    bits : int
        The most bits any row of A or column of B keeps
        (:func:`summa.precision.ozaki.choose`; default
        :data:`summa.precision.ozaki.BITS`).
    moduli : int or None
        How many moduli: fewer trade accuracy for speed
        (:func:`summa.precision.ozaki.choose`); None: the default for the
        product's K (:func:`moduli_for`). A plan's carries the moduli asked
        (:attr:`summa.planning.Plan.scheme`): this module reads no options.
    planes : int
        Integer products folded a pass (default :data:`PLANES`).
    rows : int or None
        Rows of A and C a product takes at a time: B's exponents and planes
        are made once, then each chunk of rows makes its residues, INT8
        products and folds, so the scratch grows with the chunk, not with
        C (:func:`scratch_bytes`). None: all rows at once. Chosen by the
        plan (:attr:`summa.planning.memory.MemoryPlan.int8_rows`), never
        here.
    """

    bits: int = ozaki.BITS
    moduli: int | None = None
    planes: int = PLANES
    rows: int | None = None


NOT_FINITE = ozaki.NOT_FINITE
class _Scopes:
    """The state of this process's open :func:`checked_later` and
    :func:`same_b` contexts (one object, so every product sees the innermost
    ones without a ``global``; each context restores what it found).

    Attributes
    ----------
    pending : list or None
        Inside :func:`checked_later`: each product's largest input magnitudes
        (Inf where one held Inf or NaN).
    held : dict or None
        Inside :func:`same_b`: B's exponents and residue planes kept for the
        products.
    """

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        """No context open (the state at import)."""
        self.pending: list | None = None
        self.held: dict | None = None


_scopes = _Scopes()


def scaling_exponents(x, axis: int, bits: int, cap: float, comm=None):
    """The scaling exponents of `x`'s rows (axis 1) or columns (axis 0), as
    int32, each row's scaled 2-norm within ``2**cap``
    (:func:`summa.precision.ozaki.exponents`); with `comm`, of the whole rows whose
    parts its ranks hold (collective). Refuses Inf/NaN (at once, or inside
    :func:`checked_later` at its end)."""
    amax = kernel("amax")(x, axis=axis)  # Inf where a row holds Inf or NaN
    if comm is not None:  # the whole row's largest (Inf where any part held Inf/NaN)
        amax = _allreduced(amax, comm, "MAX")
    _refuse([kernel("amax")(amax, axis=None)] if amax.size else [])
    norm = kernel("norm")(x, amax.reshape((-1, 1) if axis == 1 else (1, -1)), axis=axis)
    if comm is not None:  # each part scaled by the whole row's exponent: the squares add up
        norm = _allreduced(norm, comm, "SUM", squares=True)
    return exponents(amax, norm, bits, cap)


def _allreduced(x, comm, op: str, squares: bool = False):
    """Device array `x` allreduced over `comm` with MPI's `op` (by host;
    `squares`: the root of the sum of its squares, on the host too, so no
    CuPy kernel compiles)."""
    import cupy
    from mpi4py import MPI
    host = cupy.asnumpy(x)
    if squares:
        host *= host
    comm.Allreduce(MPI.IN_PLACE, host, op=getattr(MPI, op))
    return cupy.asarray(np.sqrt(host) if squares else host)


def _refuse(tops) -> None:
    """Raise :data:`NOT_FINITE` where any of `tops` (the largest magnitudes
    of operands, device scalars, Inf where one held Inf or NaN) is Inf, or
    inside :func:`checked_later` keep them for its end."""
    if _scopes.pending is not None:
        _scopes.pending.extend(tops)
    elif not _finite(tops):
        raise ValueError(NOT_FINITE)


def _finite(tops) -> bool:
    """Are all of `tops` finite? (Waits for the GPU.)"""
    return all(math.isfinite(float(top)) for top in tops)


def refuse_not_finite(a, b) -> None:
    """The Inf/NaN refusal of :func:`gemm` for a product made otherwise (a
    short sum in native float64, :data:`summa.precision.ozaki.K_NATIVE`): the same
    error, at once or at :func:`checked_later`'s end."""
    parts = [p for x in (a, b) for p in ((x.real, x.imag) if x.dtype.kind == "c" else (x,))]
    _refuse([kernel("amax")(p, axis=None) for p in parts])


class _Checks:
    """The Inf/NaN checks of the products made inside :func:`checked_later`."""

    def __init__(self):
        self.flags = []

    def finite(self) -> bool:
        """Were all their inputs finite? (Waits for the GPU: once.)"""
        return _finite(self.flags)


@contextlib.contextmanager
def checked_later():
    """Inside, products do not stop the host to check their inputs for
    Inf/NaN (a synchronisation with the GPU each, so the host could not queue
    the next panel's copies and GEMMs ahead): the yielded object's
    ``finite()`` answers for all of them at the end. Their products are then
    meaningless where it says False; the caller raises (every rank alike)."""
    outer, checks = _scopes.pending, _Checks()
    _scopes.pending = checks.flags
    try:
        yield checks
    finally:
        _scopes.pending = outer


@contextlib.contextmanager
def same_b():
    """Products inside share B's exponents and residue planes where they are
    given the same B (the caller promises it does not change meanwhile): the
    row strips of an out-of-core tile's last panel, which go home one by one
    as they are final, transpose and reduce B once, not once a strip. One B
    is kept at a time, so the memory is one product's."""
    outer, _scopes.held = _scopes.held, {}
    try:
        yield
    finally:
        _scopes.held = outer


def _b_side(b, count: int, bits: int, cap: float, cols_p: int, k_p: int, constants, backend):
    """B's column exponents and its residue planes (B transposed, so K is
    contiguous): made here, or inside :func:`same_b` those made for this B."""
    import cupy
    data = getattr(b, "data", None)
    held = _scopes.held
    key = (getattr(data, "ptr", None) or b.__array_interface__["data"][0], b.shape,
           b.strides, count, bits)
    if held is not None and held.get("key") == key:
        return held["f"], held["b8"]
    if held is not None:
        held.clear()  # the last B's planes go before this one's come
    k, n = b.shape
    if b.T.flags.c_contiguous:  # column-major already (B stored by columns): read as it lies
        bt = b.T
    else:
        bt = cupy.empty((n, k), dtype=cupy.float64)
        backend.transpose(b, bt)
    f = scaling_exponents(bt, 1, bits, cap)
    b8 = residue_planes(bt, f, count, cols_p, k_p, constants)
    if held is not None:
        held.update(key=key, f=f, b8=b8)
    return f, b8


def scratch_bytes(m: int, n: int, k: int, count: int, planes: int | None = None,
                  rows: int | None = None) -> int:
    """Device bytes one product takes at once beside its operands: the
    scaling exponents of A's rows and B's columns, B's residue planes, and
    either B transposed (while those are made) or, once it is gone, one
    chunk of `rows` rows' (None: all `m`; :attr:`Scheme.rows`) A's residue
    planes, the integer products folded a pass (`planes`; None:
    :data:`PLANES`) and the two sums."""
    kp, np_ = -(-k // 4) * 4, -(-n // 4) * 4
    r = _chunk_rows(m, rows)
    chunk = count * r * kp + 4 * planes_a_pass(planes, count) * r * np_ + 16 * r * n
    return 4 * (m + n) + count * np_ * kp + max(8 * n * k, chunk)


def _chunk_rows(m: int, rows: int | None) -> int:
    """Rows of A and C one chunk of a product of `m` rows takes
    (:attr:`Scheme.rows`; None: all): what :func:`gemm` allocates for and
    :func:`scratch_bytes` counts."""
    return m if rows is None else max(1, min(m, int(rows)))


def check_moduli(moduli, precision) -> int | None:
    """`moduli` as an int if a float64-on-INT8 product can take it (3 to 30;
    fewer cannot rebuild a product over K up to :data:`summa.precision.ozaki.K_EXACT`),
    else one clear ValueError; None stays None."""
    if moduli is None:
        return None
    if precision != "fp64-int8":
        raise ValueError("moduli applies to precision fp64-int8")
    return ozaki.check_moduli(moduli)


def moduli_for(k: int, moduli: int | None = None) -> int:
    """The moduli a product over `k` takes: `moduli`, else
    :func:`summa.precision.ozaki.default_moduli`'s (15 for K = 32768).
    (What the options ask: :func:`summa.planning.precision.moduli_for`.)"""
    return ozaki.choose(ozaki.BITS, moduli, min(k, ozaki.K_EXACT))[1]


def gemm(alpha, a, b, c, beta=0.0, *, backend=None, scheme: Scheme = Scheme(),
         marks: list | None = None) -> None:
    """``c = alpha a @ b + beta c`` in float64 from INT8 GEMMs (the module's
    steps).

    Parameters
    ----------
    alpha, beta : scalar
    a, b, c : CuPy arrays
        float64 or complex128 (complex: four real products); views with
        contiguous rows fine. `c` is updated in place.
    backend : summa.device.backend.CupyBackend
        Its INT8 GEMM and transpose.
    scheme : Scheme
        Bits, moduli (default :func:`moduli_for`'s: fewer trade accuracy for
        speed), products folded a pass and rows of A and C taken at a time
        (the same product, bit for bit, in less memory).
    marks : list, optional
        Collects ``(phase, event)`` pairs for timing (:func:`phase_seconds`);
        float64 products only.
    """
    import cupy
    m, k = a.shape
    n = b.shape[1]
    if a.dtype.kind == "c" or b.dtype.kind == "c":
        _complex(alpha, a, b, c, beta, backend, scheme)
        return
    if k > ozaki.K_EXACT:  # pieces an int32 sum holds, each accumulated
        for i, k0 in enumerate(range(0, k, ozaki.K_EXACT)):
            gemm(alpha, a[:, k0:k0 + ozaki.K_EXACT], b[k0:k0 + ozaki.K_EXACT], c,
                 beta if i == 0 else 1.0, backend=backend, scheme=scheme, marks=marks)
        return
    # checked as the caller asked
    bits, count = ozaki.choose(scheme.bits, scheme.moduli, k)
    constants = moduli_constants(count)
    cap_a, cap_b = ozaki.budgets(count, k)

    def mark(phase):
        if marks is not None:
            event = cupy.cuda.Event()
            event.record()
            marks.append((phase, event))
    mark("start")
    if k == 0 or m == 0 or n == 0:
        if beta == 0:
            c.fill(0)
        elif beta != 1:
            c *= beta
        return
    e = scaling_exponents(a, 1, bits, cap_a)  # (m,): all rows at once, sliced per chunk
    kp, np_ = -(-k // 4) * 4, -(-n // 4) * 4
    mark("scale")
    f, b8 = _b_side(b, count, bits, cap_b, np_, kp, constants, backend)  # (n,), B's planes
    rows = _chunk_rows(m, scheme.rows)
    # One buffer of products, for every chunk: folds on a stream of their own
    # beside the next group's GEMMs (two buffers) gained nothing
    # (on one H200: 1.091x native DGEMM's rate with two, 1.101x with one).
    g = cupy.empty(planes_a_pass(scheme.planes, count) * rows * np_, dtype=cupy.int32)
    for r0 in range(0, m, rows):
        r1 = min(m, r0 + rows)
        _rows_product((alpha, beta), a[r0:r1], c[r0:r1],
                      Encoding(count, constants, e[r0:r1], f), (b8, g, kp),
                      (backend, scheme.planes, mark))


def _rows_product(scalars, a, c, encoding: Encoding, held, run) -> None:
    """One chunk of rows of :func:`gemm`'s product: ``c = alpha a @ b + beta
    c`` for these rows of A and C (`encoding`: their exponents and all of
    B's), its A residues, INT8 products and folds, freed when it returns
    (the next chunk's take their place). `scalars`: ``(alpha, beta)``;
    `held`: ``(B's planes, the flat int32 buffer of products, K padded)``;
    `run`: ``(backend, planes folded a pass, gemm's phase marker)``."""
    (alpha, beta), (b8, g, kp), (backend, planes, mark) = scalars, held, run
    m, n = c.shape
    np_ = b8.shape[1]
    a8 = residue_planes(a, encoding.e, encoding.count, m, kp, encoding.constants)
    mark("residues")
    folds = Folds(m, n, planes, encoding, alpha, beta, c)
    # the chunk's planes m np_ apart, each C-contiguous (a ragged last chunk too)
    g = g[: folds.planes * m * np_].reshape(folds.planes, m, np_)
    for j, (l0, group) in enumerate(folds.groups):
        for p in range(l0, l0 + group):
            backend.int8_gemm_tn(a8[p], b8[p], g[p - l0])
        folds.fold(j, g)
    mark("products")
    del a8
    folds.finish()
    mark("finish")


def phase_seconds(marks: list) -> dict:
    """Seconds per phase of the ``(phase, event)`` pairs :func:`gemm` collected
    in `marks` (each phase timed from the mark before it; summed over the
    products it made), once the GPU has passed the last one."""
    import cupy
    seconds: dict = {}
    for (_, start), (phase, end) in zip(marks, marks[1:]):
        seconds[phase] = seconds.get(phase, 0.0) + cupy.cuda.get_elapsed_time(start, end) / 1e3
    return seconds


def _complex(alpha, a, b, c, beta, backend, scheme: Scheme) -> None:
    """complex128 ``c = alpha a @ b + beta c`` from four real products
    (:func:`summa.precision.ozaki.complex_product`, each :func:`gemm` with
    `backend` and `scheme`), joined into `c` in place: beside the operands'
    real and imaginary parts, the two real results and one real product's
    scratch, no more (what the plans count, ``tiling.ozaki_scratch``)."""
    import cupy
    m, n = a.shape[0], b.shape[1]
    ar, ai = _parts(a)
    br, bi = _parts(b)
    real = cupy.empty((m, n), dtype=cupy.float64)
    imag = cupy.empty((m, n), dtype=cupy.float64)
    gemm(1.0, ar, br, real, 0.0, backend=backend, scheme=scheme)
    gemm(-1.0, ai, bi, real, 1.0, backend=backend, scheme=scheme)
    gemm(1.0, ar, bi, imag, 0.0, backend=backend, scheme=scheme)
    gemm(1.0, ai, br, imag, 1.0, backend=backend, scheme=scheme)
    combine(real, imag, alpha, beta, c)


def _parts(x) -> tuple:
    """A complex or real operand's real and imaginary parts, each contiguous
    (a real one's imaginary part zeros)."""
    import cupy
    if x.dtype.kind == "c":
        return split(x)
    return cupy.ascontiguousarray(x, dtype=cupy.float64), cupy.zeros(x.shape, cupy.float64)
