"""float64 products from exact integer products (Ozaki scheme II), the
array-library part, for NumPy or CuPy (`xp`), the residue products through a
backend's INT8 GEMM (:meth:`summa.backend.Backend.int8_product`; on GPUs
cuBLAS's integer tensor cores). Not wired into SUMMA yet (issue 25).

For ``C ~ A @ B`` in float64:

1. Scale. Each row i of A is multiplied by ``2**e_i`` and rounded to an
   integer of at most `bits` bits (``|Abar| <= 2**bits``); each column j of
   B likewise by ``2**f_j``. Powers of two: the scaling itself is exact.
2. Residues. For pairwise coprime moduli ``m_l <= 256`` (:data:`MODULI`),
   ``Abar mod m_l`` and ``Bbar mod m_l`` in the symmetric range fit int8.
3. Integer products. ``(Abar mod m_l) @ (Bbar mod m_l)`` is exact in int32
   while K * 128**2 < 2**31 (K up to 131071; longer K goes in pieces), and
   congruent to ``Abar @ Bbar`` mod m_l: one INT8 GEMM per modulus.
4. Reconstruction. From its residues, ``Abar @ Bbar`` is the unique integer
   in (-M/2, M/2), M the moduli's product, as long as ``K * 2**(2 bits) <
   M/2`` (:func:`moduli_for`); Garner's mixed-radix digits give it with
   small-integer arithmetic, and a Horner sum in float64 its value.
5. Unscale: ``C_ij = 2**(-e_i - f_j) (Abar @ Bbar)_ij``.

The only error is step 1's rounding: ``|C - A B|_ij <= 2**-bits *
amax_i * (|B| 1)`` + the same for B, with ``amax_i`` the largest
``|A_ij|`` of row i (:func:`error_bound`). For rows and columns of similar
magnitudes and ``bits`` = 53 that is float64's own accuracy; where one row
spans many orders of magnitude, its small entries lose bits (tested at
1e±8), so a check (``--check``) is the companion of this mode.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["MODULI", "moduli_for", "scale", "residues", "integer_product", "reconstruct",
           "gemm_int8", "error_bound"]

#: Pairwise coprime moduli up to 256, largest first (so the fewest reach a
#: given product): their symmetric residues fit int8.
MODULI = (256, 255, 253, 251, 247, 241, 239, 233, 229, 227, 223, 217, 211, 199, 197, 193,
          191, 181, 179, 173, 167, 163, 157, 151, 149, 139, 137, 131, 127, 113)

#: Longest inner dimension one int32 accumulation of int8 products holds
#: exactly (K * 128 * 128 < 2**31). Module-level so tests can lower it.
K_EXACT = (2**31 - 1) // (128 * 128)


def moduli_for(bits: int, k: int) -> int:
    """How many of :data:`MODULI` a product of `bits`-bit integers over an
    inner dimension `k` needs: their product must exceed ``2 k 2**(2 bits)``."""
    need = 1 + math.log2(max(1, k)) + 2 * bits
    total = 0.0
    for count, m in enumerate(MODULI, 1):
        total += math.log2(m)
        if total > need:
            return count
    raise ValueError(f"{bits}-bit operands over K = {k} need a product of moduli beyond "
                     f"2**{need:.0f}; the {len(MODULI)} moduli reach 2**{total:.0f}")


def scale(x: np.ndarray, axis: int, bits: int, xp=np):
    """``(xbar, e)``: `x` times ``2**e`` along `axis` (per row for axis 1, per
    column for axis 0), rounded to integers with ``|xbar| <= 2**bits``
    (int64); ``e`` int32. Zero rows (columns) keep e = 0. Refuses Inf/NaN."""
    if not bool(xp.isfinite(x).all()):
        raise ValueError("precision fp64-int8 needs finite inputs: A or B holds Inf or NaN")
    if not 1 <= bits <= 62:
        raise ValueError(f"bits must be 1-62 (int64 holds the scaled integers), got {bits}")
    amax = xp.abs(x).max(axis=axis, keepdims=True)
    _, ex = xp.frexp(amax)  # amax <= 2**ex
    e = xp.where(amax > 0, bits - ex, 0).astype(np.int32)
    xbar = xp.rint(xp.ldexp(x, e)).astype(np.int64)
    return xbar, e


def residues(xbar, m: int, xp=np):
    """``xbar mod m`` in the symmetric range (``[-128, 127]`` for m = 256),
    as int8."""
    half = m // 2
    return ((xbar + half) % m - half).astype(np.int8)


def integer_product(a8, b8, xp=np, backend=None):
    """``a8 @ b8`` exactly for int8 operands, K cut into pieces whose int32
    sums cannot overflow; int64 result. `backend` multiplies each piece
    (:meth:`summa.backend.Backend.int8_product`: cuBLAS's INT8 GEMM on GPUs);
    without one, NumPy in int64."""
    k = a8.shape[1]
    out = None
    for k0 in range(0, max(k, 1), K_EXACT):
        a, b = a8[:, k0:k0 + K_EXACT], b8[k0:k0 + K_EXACT]
        part = (backend.int8_product(a, b).astype(np.int64) if backend is not None
                else a.astype(np.int64) @ b.astype(np.int64))
        out = part if out is None else out + part
    return out


def reconstruct(parts, moduli, xp=np):
    """The integers in (-M/2, M/2) with residues `parts` (one array per
    modulus), as float64: Garner's balanced mixed-radix digits (all in small
    integers), then a Horner sum from the most significant digit."""
    digits = []
    for i, m in enumerate(moduli):
        v = parts[i] % m
        for j in range(i):  # v = (v - d_j) / m_j mod m_i
            inv = pow(moduli[j], -1, m)
            v = ((v - digits[j]) % m) * inv % m
        half = m // 2
        digits.append(xp.where(v >= m - half, v - m, v) if m % 2 else
                      xp.where(v >= half, v - m, v))
    value = digits[-1].astype(np.float64)
    for i in range(len(moduli) - 2, -1, -1):
        value = digits[i].astype(np.float64) + moduli[i] * value
    return value


def gemm_int8(a, b, bits: int = 53, moduli: int | None = None, xp=np, backend=None):
    """``a @ b`` in float64 from int8 products (the module's steps).

    Parameters
    ----------
    a, b : arrays of float64
    bits : int
        Bits each row of `a` and column of `b` keeps (53: float64's).
    moduli : int, optional
        How many moduli (default: as many as `bits` and K need).
    xp, backend : module, Backend, optional
        The array library of `a` and `b`, and the backend whose INT8 GEMM
        multiplies the residues (default: NumPy's int64 products).
    """
    k = a.shape[1]
    count = moduli_for(bits, k) if moduli is None else int(moduli)
    abar, e = scale(a, 1, bits, xp)
    bbar, f = scale(b, 0, bits, xp)
    chosen = MODULI[:count]
    parts = [integer_product(residues(abar, m, xp), residues(bbar, m, xp), xp, backend) % m
             for m in chosen]
    c = reconstruct(parts, chosen, xp)
    return xp.ldexp(c, -(e + f))


def error_bound(a, b, bits: int, xp=np):
    """Elementwise bound on ``|gemm_int8(a, b, bits) - a @ b|``: the scaling's
    rounding (half a unit of the last of `bits` bits of each row's and
    column's largest entry) carried through the product, plus float64's
    rounding of the reconstructed value."""
    amax = xp.abs(a).max(axis=1, keepdims=True)
    bmax = xp.abs(b).max(axis=0, keepdims=True)
    ua, ub = amax * 2.0**-bits, bmax * 2.0**-bits
    k = a.shape[1]
    return (ua @ xp.ones((1, b.shape[1])) * (xp.abs(b).sum(axis=0, keepdims=True))
            + (xp.abs(a).sum(axis=1, keepdims=True)) * ub + k * ua * ub
            + 4 * np.finfo(np.float64).eps * (xp.abs(a) @ xp.abs(b)))
