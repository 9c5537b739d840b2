"""fp64-int8 with K in panels, as SUMMA gives a rank its product on a grid:
each panel's INT8 products summed in int32 (one plane a modulus) and C
folded once at the end (:class:`PanelSums`), with scaling exponents agreed
over all of K (:func:`grid_exponents`), so the result is the one
:func:`summa.precision.ozaki_gpu.gemm` makes of the whole product on one
GPU; and, read by the planner without a GPU, when they apply
(:func:`panel_sums_apply`) and the device memory they take
(:func:`panel_sums_bytes`).
"""

from __future__ import annotations

import numpy as np

from . import ozaki
from .kernels import PLANES, Encoding, Folds, moduli_constants, residue_planes
from .ozaki_gpu import Scheme, moduli_for, scaling_exponents

__all__ = ["PanelSums", "grid_exponents", "panel_sums_bytes", "panel_sums_apply"]


def panel_sums_bytes(m: int, n: int, width: int, k: int, planes: int = PLANES,
                     moduli: int | None = None) -> int:
    """Device bytes :class:`PanelSums` takes beside its operands for an
    ``m x n`` C over `k` terms in panels up to `width` wide: the int32 sums
    (a plane per modulus: `moduli`, None the default for `k`), one panel's
    residue planes and B transposed, and the fold's two float64 sums."""
    count = moduli_for(k, moduli)
    kp, np_ = -(-width // 4) * 4, -(-n // 4) * 4
    folds = 16 * m * n if count > planes else 0
    return 4 * count * m * np_ + count * (m + np_) * kp + 8 * n * kp + folds


def panel_sums_apply(dtype, ranks: int, k: int, *, sums: bool) -> bool:
    """Do fp64-int8 products of `dtype` given in K panels on a grid of
    `ranks` sum their INT8 products and fold C once (:class:`PanelSums`),
    where memory allows? float64 on several ranks, K within an int32 sum
    and of at least :data:`summa.precision.ozaki.K_NATIVE` terms (fewer run native
    float64), where `sums` (the planner's ``SUMMA_FP64_INT8_SUMS``; False:
    a fold a panel, as one rank's out-of-core tiles make it: the reference
    a benchmark compares against)."""
    return (np.dtype(dtype).kind == "f" and ranks > 1 and ozaki.K_NATIVE <= k <= ozaki.K_EXACT
            and bool(sums))


class PanelSums:
    """``c = alpha a @ b + beta c`` for A and B given in K panels, as SUMMA
    receives them on a grid: each panel's INT8 products summed in int32
    (one plane a modulus) and C folded once at the end, not once a panel.
    The scaling exponents are those of all of K (:func:`grid_exponents`),
    so the result is the one :func:`summa.precision.ozaki_gpu.gemm` makes
    of the whole product on one GPU, and nothing needs checking panel by
    panel. Device memory: :func:`panel_sums_bytes`.

    Parameters
    ----------
    m, n, k : int
        C's shape and the terms of its sums (all of K).
    exponents : tuple
        ``(e, f)`` of :func:`grid_exponents`.
    backend : summa.device.backend.CupyBackend
        Its INT8 GEMM and transpose.
    scheme : Scheme
        As :func:`grid_exponents` took it (bits and moduli), and the
        products folded a pass.
    """

    def __init__(self, m: int, n: int, k: int, exponents, backend, scheme: Scheme = Scheme()):
        import cupy
        if k > ozaki.K_EXACT:
            raise ValueError(f"K = {k} exceeds the {ozaki.K_EXACT} an int32 sum holds")
        # as grid_exponents chose
        _, self.count = ozaki.choose(scheme.bits, scheme.moduli, k)
        self.m, self.n, self.k, self.backend, self.planes = m, n, k, backend, scheme.planes
        self.np_ = -(-n // 4) * 4
        self.constants = moduli_constants(self.count)
        self.sums = cupy.empty((self.count, m, self.np_), dtype=cupy.int32)
        self.e, self.f = exponents
        self.seen = 0
        self.started = False  # the first panel's products set the sums, the rest add

    def add(self, a, b) -> None:
        """Add the panel product ``a @ b`` (`a` m x w, `b` w x n, float64)."""
        import cupy
        width = a.shape[1]
        if self.seen + width > self.k:
            raise ValueError(f"panels past K = {self.k}")
        self.seen += width
        if width == 0 or self.m == 0 or self.n == 0:
            return
        kp = -(-width // 4) * 4
        bt = cupy.empty((self.n, width), dtype=cupy.float64)
        self.backend.transpose(b, bt)
        a8 = residue_planes(a, self.e, self.count, self.m, kp, self.constants)
        b8 = residue_planes(bt, self.f, self.count, self.np_, kp, self.constants)
        for p in range(self.count):
            self.backend.int8_gemm_tn(a8[p], b8[p], self.sums[p], accumulate=self.started)
        self.started = True

    def finish(self, alpha, c, beta=0.0) -> None:
        """``c = alpha (the sum of the panel products) + beta c``, once all of
        K has been added."""
        if self.seen != self.k:
            raise ValueError(f"panels of {self.seen} of K = {self.k} terms added")
        m, n, count = self.m, self.n, self.count
        if m == 0 or n == 0:
            return
        if not self.started:  # K = 0: the product is zero
            self.sums.fill(0)
        folds = Folds(m, n, self.planes, Encoding(count, self.constants, self.e, self.f),
                       alpha, beta, c)
        for j, (l0, _) in enumerate(folds.groups):  # the planes lie in the sums already
            folds.fold(j, self.sums[l0:])
        folds.finish()


def grid_exponents(a, b, row_comm, col_comm, k: int, scheme: Scheme = Scheme()):
    """``(e, f)``: the scaling exponents of the rows of A and the columns of
    B over all of K, where each rank holds a block of them (`a`: its rows of
    A, its K columns; `b`: its K rows of B, its columns), the same on every
    rank of a grid row (`row_comm`, A's rows) or column (`col_comm`, B's
    columns) as one GPU's whole product would take
    (:func:`summa.precision.ozaki_gpu.gemm`): two allreduces of a number a
    row each way. `scheme`'s bits and moduli (the :class:`PanelSums` given
    these exponents takes the same). Collective; Inf/NaN refused as in
    :func:`summa.precision.ozaki_gpu.gemm` (inside
    :func:`summa.precision.ozaki_gpu.checked_later`, at its end)."""
    bits = scheme.bits
    _, count = ozaki.choose(bits, scheme.moduli, k)
    cap_a, cap_b = ozaki.budgets(count, k)
    return (scaling_exponents(a, 1, bits, cap_a, row_comm),
            scaling_exponents(b, 0, bits, cap_b, col_comm))
