"""float64 products from exact integer products (Ozaki scheme II), the
array-library part, for NumPy or CuPy (`xp`), the residue products through a
backend's INT8 GEMM (:meth:`summa.backend.Backend.int8_product`; on GPUs
cuBLAS's integer tensor cores). :mod:`summa.ozaki_gpu` fuses the same steps
into CuPy kernels.

For ``C ~ A @ B`` in float64:

1. Scale. Each row i of A is multiplied by ``2**e_i`` and rounded to an
   integer of at most `bits` bits (``|Abar| <= 2**bits``); each column j of
   B likewise by ``2**f_j``. Powers of two: the scaling itself is exact.
2. Residues. For pairwise coprime moduli ``m_l <= 256`` (:data:`MODULI`),
   ``Abar mod m_l`` and ``Bbar mod m_l`` in the symmetric range fit int8
   (computed in float64, exactly: ``x - m rint(x / m)`` for ``|x| < 2**52``).
3. Integer products. ``(Abar mod m_l) @ (Bbar mod m_l)`` is exact in int32
   while K * 128**2 < 2**31 (K up to 131071; longer K goes in pieces), and
   congruent to ``Abar @ Bbar`` mod m_l: one INT8 GEMM per modulus.
4. Reconstruction (Chinese remainder theorem). ``X = Abar @ Bbar`` is the
   integer in (-M/2, M/2), M the moduli's product, congruent to ``sum_l u_l
   w_l`` mod M, u_l the l-th product reduced mod m_l and ``w_l`` the CRT
   weights; it holds while ``K * 2**(2 bits) < M/4`` (:func:`moduli_for`).
   Each ``w_l`` is split into a high part, a multiple of ``2**t`` below
   ``2**(t+40)``, and the rest: the high sums are exact in float64, so the
   quotient by M and the remainder are too, and the low parts carry the rest
   to float64 accuracy (:func:`crt_weights`, :func:`fold`, :func:`finish`).
   Each product is folded in as it comes (two float64 sums per element),
   so no product has to wait for the others.
5. Unscale: ``C_ij = 2**(-e_i - f_j) X_ij``.

The only error is step 1's rounding: ``|C - A B|_ij <= 2**-bits *
amax_i * (|B| 1)`` + the same for B, with ``amax_i`` the largest
``|A_ij|`` of row i (:func:`error_bound`). For rows and columns of similar
magnitudes and ``bits`` = 52 that is float64's own accuracy; where one row
spans many orders of magnitude, its small entries lose bits (tested at
1e±8), so a check (``--check``) is the companion of this mode.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["MODULI", "BITS", "moduli_for", "scale", "residues", "integer_product",
           "crt_weights", "fold", "finish", "reconstruct", "gemm_int8", "error_bound"]

#: The refusal of inputs that hold Inf or NaN.
NOT_FINITE = "precision fp64-int8 needs finite inputs: A or B holds Inf or NaN"

#: Pairwise coprime moduli up to 256, largest first (so the fewest reach a
#: given product): their symmetric residues fit int8.
MODULI = (256, 255, 253, 251, 247, 241, 239, 233, 229, 227, 223, 217, 211, 199, 197, 193,
          191, 181, 179, 173, 167, 163, 157, 151, 149, 139, 137, 131, 127, 113)

#: Longest inner dimension one int32 accumulation of int8 products holds
#: exactly (K * 128 * 128 < 2**31). Module-level so tests can lower it.
K_EXACT = (2**31 - 1) // (128 * 128)


#: Bits each row of A and column of B keeps by default: float64's accuracy,
#: the most whose residues float64 arithmetic computes exactly.
BITS = 52


def moduli_for(bits: int, k: int) -> int:
    """How many of :data:`MODULI` a product of `bits`-bit integers over an
    inner dimension `k` needs: their product must exceed ``4 k 2**(2 bits)``
    (twice the range of the product, so the quotient of the reconstruction
    is never near a half)."""
    need = 2 + math.log2(max(1, k)) + 2 * bits
    total = 0.0
    for count, m in enumerate(MODULI, 1):
        total += math.log2(m)
        if total > need:
            return count
    raise ValueError(f"{bits}-bit operands over K = {k} need a product of moduli beyond "
                     f"2**{need:.0f}; the {len(MODULI)} moduli reach 2**{total:.0f}")


def check_bits(bits: int) -> int:
    """`bits` as an int, if float64 computes residues of such integers exactly."""
    if not 1 <= int(bits) <= 52:
        raise ValueError(f"bits must be 1-52 (float64 computes their residues exactly), "
                         f"got {bits}")
    return int(bits)


def scale(x, axis: int, bits: int, xp=np):
    """``(xbar, e)``: `x` times ``2**e`` along `axis` (per row for axis 1, per
    column for axis 0), rounded to integers with ``|xbar| <= 2**bits``
    (float64); ``e`` int32. Zero rows (columns) keep e = 0. Refuses Inf/NaN."""
    if not bool(xp.isfinite(x).all()):
        raise ValueError(NOT_FINITE)
    bits = check_bits(bits)
    e = exponents(xp.abs(x).max(axis=axis, keepdims=True), bits, xp)
    return xp.rint(xp.ldexp(x, e)), e


def exponents(amax, bits: int, xp=np):
    """The scaling exponents of rows (columns) whose largest magnitudes are
    `amax`: ``amax * 2**e < 2**bits`` (0 for zero rows)."""
    _, ex = xp.frexp(amax)  # amax < 2**ex
    return xp.where(amax > 0, bits - ex, 0).astype(np.int32)


def residues(xbar, m: int, xp=np):
    """``xbar mod m`` for float64 integers ``|xbar| < 2**52`` in ``[-128, 127]``,
    as int8. The quotient comes from a product with ``1/m`` (as on the GPU:
    :mod:`summa.ozaki_gpu` computes the same values); it may be one off, so
    the remainder, exact either way, is moved back into range."""
    r = xbar - m * xp.rint(xbar * (1.0 / m))  # exact: q m and the difference are integers
    r = xp.where(r > 127, r - m, r)
    r = xp.where(r < -128, r + m, r)
    return r.astype(np.int8)


def bits_for(count: int, k: int) -> int:
    """The most bits per row and column that `count` moduli reconstruct over
    an inner dimension `k` (:func:`moduli_for`'s inverse)."""
    total = sum(math.log2(m) for m in MODULI[:count])
    bits = math.floor((total - 2 - math.log2(max(1, k))) / 2 - 1e-9)
    if bits < 1:
        raise ValueError(f"{count} moduli cannot reconstruct products over K = {k}")
    return min(BITS, bits)


def integer_product(a8, b8, xp=np, backend=None):
    """``a8 @ b8`` exactly for int8 operands with K at most :data:`K_EXACT`,
    as int32. `backend` multiplies (:meth:`summa.backend.Backend.int8_product`:
    cuBLAS's INT8 GEMM on GPUs); without one, NumPy in int64."""
    if a8.shape[1] > K_EXACT:
        raise ValueError(f"K = {a8.shape[1]} exceeds the {K_EXACT} an int32 sum holds")
    if backend is not None:
        return backend.int8_product(a8, b8)
    return (a8.astype(np.int64) @ b8.astype(np.int64)).astype(np.int32)


def choose(bits: int, moduli: int | None, k: int) -> tuple[int, int]:
    """``(bits, moduli)`` for a product over `k`: the moduli `bits` needs, or
    for a given count of moduli the bits they can carry (at most `bits`)."""
    bits = check_bits(bits)
    if moduli is None:
        return bits, moduli_for(bits, k)
    count = int(moduli)
    if not 1 <= count <= len(MODULI):
        raise ValueError(f"moduli must be 1-{len(MODULI)}, got {count}")
    return min(bits, bits_for(count, k)), count


def crt_weights(moduli) -> dict:
    """The reconstruction's constants for `moduli`: ``t``, and in units of
    ``2**t`` each CRT weight's high part (an integer below ``2**40``) and low
    part (below 1), and M's (:func:`fold`, :func:`finish`)."""
    big = math.prod(moduli)
    t = big.bit_length() - 40
    hi, lo = [], []
    for m in moduli:
        rest = big // m
        w = rest * pow(rest % m, -1, m) % big
        hi.append(float(w >> t))
        lo.append((w - ((w >> t) << t)) / 2.0**t)
    return {"t": t, "w_hi": hi, "w_lo": lo, "m_hi": float(big >> t),
            "m_lo": (big - ((big >> t) << t)) / 2.0**t}


def fold(g, m: int, w_hi: float, w_lo: float, s_hi, s_lo, xp=np) -> None:
    """Add one integer product `g` (residues mod `m`, any representative
    below 2**31) into the sums: ``u = g mod m`` (symmetric), ``s_hi += u
    w_hi`` (exact: integers below 2**53), ``s_lo += u w_lo``."""
    g = g.astype(np.float64)
    u = g - m * xp.rint(g * (1.0 / m))
    s_hi += u * w_hi
    s_lo += u * w_lo


def finish(s_hi, s_lo, weights: dict, e=0, f=0, xp=np):
    """The float64 values ``2**(-e-f) X`` of the integers X whose folded sums
    are `s_hi`, `s_lo`: X ≡ sum mod M in (-M/2, M/2), the quotient from the
    sums' value and the remainder of the high parts exact."""
    q = xp.rint((s_hi + s_lo) / (weights["m_hi"] + weights["m_lo"]))
    d = (s_hi - q * weights["m_hi"]) + (s_lo - q * weights["m_lo"])
    return xp.ldexp(d, weights["t"] - e - f)


def reconstruct(parts, moduli, xp=np):
    """The integers in (-M/2, M/2) with residues `parts` (one array per
    modulus), as float64."""
    weights = crt_weights(moduli)
    s_hi = xp.zeros(parts[0].shape)
    s_lo = xp.zeros(parts[0].shape)
    for part, m, hi, lo in zip(parts, moduli, weights["w_hi"], weights["w_lo"]):
        fold(part, m, hi, lo, s_hi, s_lo, xp)
    return finish(s_hi, s_lo, weights, xp=xp)


def gemm_int8(a, b, bits: int = BITS, moduli: int | None = None, xp=np, backend=None):
    """``a @ b`` in float64 from int8 products (the module's steps); K longer
    than :data:`K_EXACT` in pieces whose float64 products are summed.

    Parameters
    ----------
    a, b : arrays of float64
    bits : int
        Bits each row of `a` and column of `b` keeps (52: float64's).
    moduli : int, optional
        How many moduli (default: as many as `bits` and K need); fewer than
        `bits` needs lower the bits kept (:func:`bits_for`): faster, less
        accurate.
    xp, backend : module, Backend, optional
        The array library of `a` and `b`, and the backend whose INT8 GEMM
        multiplies the residues (default: NumPy's int64 products).
    """
    if np.dtype(a.dtype).kind == "c" or np.dtype(b.dtype).kind == "c":
        return complex_product(lambda x, y: gemm_int8(x, y, bits, moduli, xp, backend), a, b,
                               xp)
    k = a.shape[1]
    if k > K_EXACT:
        return sum(gemm_int8(a[:, k0:k0 + K_EXACT], b[k0:k0 + K_EXACT], bits, moduli, xp,
                             backend) for k0 in range(0, k, K_EXACT))
    bits, count = choose(bits, moduli, k)
    abar, e = scale(a, 1, bits, xp)
    bbar, f = scale(b, 0, bits, xp)
    chosen = MODULI[:count]
    weights = crt_weights(chosen)
    s_hi = xp.zeros((a.shape[0], b.shape[1]))
    s_lo = xp.zeros((a.shape[0], b.shape[1]))
    for m, hi, lo in zip(chosen, weights["w_hi"], weights["w_lo"]):
        g = integer_product(residues(abar, m, xp), residues(bbar, m, xp), xp, backend)
        fold(g, m, hi, lo, s_hi, s_lo, xp)
    return finish(s_hi, s_lo, weights, e, f, xp)


def complex_product(real_product, a, b, xp=np):
    """``a @ b`` for complex operands from four real products (each as
    accurate as a real one; the 3M trick's three would mix the parts'
    magnitudes into one scaling)."""
    ar, ai = xp.ascontiguousarray(a.real), xp.ascontiguousarray(a.imag)
    br, bi = xp.ascontiguousarray(b.real), xp.ascontiguousarray(b.imag)
    real = real_product(ar, br) - real_product(ai, bi)
    imag = real_product(ar, bi) + real_product(ai, br)
    return real + 1j * imag


def error_bound(a, b, bits: int, xp=np):
    """Elementwise bound on ``|gemm_int8(a, b, bits) - a @ b|``: the scaling's
    rounding (half a unit of the last of `bits` bits of each row's and
    column's largest entry) carried through the product, plus float64's
    rounding of the reconstructed value."""
    if np.dtype(a.dtype).kind == "c" or np.dtype(b.dtype).kind == "c":  # the four products'
        ar, ai, br, bi = a.real, a.imag, b.real, b.imag
        return (error_bound(ar, br, bits, xp) + error_bound(ai, bi, bits, xp)
                + error_bound(ar, bi, bits, xp) + error_bound(ai, br, bits, xp))
    amax = xp.abs(a).max(axis=1, keepdims=True)
    bmax = xp.abs(b).max(axis=0, keepdims=True)
    ua, ub = amax * 2.0**-bits, bmax * 2.0**-bits
    k = a.shape[1]
    return (ua @ xp.ones((1, b.shape[1])) * (xp.abs(b).sum(axis=0, keepdims=True))
            + (xp.abs(a).sum(axis=1, keepdims=True)) * ub + k * ua * ub
            + 4 * np.finfo(np.float64).eps * (xp.abs(a) @ xp.abs(b)))
