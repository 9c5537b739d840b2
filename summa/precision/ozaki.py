"""float64 products from exact integer products (Ozaki scheme II), the
array-library part, for NumPy or CuPy (`xp`), the residue products through a
backend's INT8 GEMM (:meth:`summa.device.backend.Backend.int8_product`; on GPUs
cuBLAS's integer tensor cores). :mod:`summa.precision.ozaki_gpu` fuses the same steps
into CuPy kernels.

For ``C ~ A @ B`` in float64:

1. Scale. Each row i of A is multiplied by ``2**e_i`` and rounded to an
   integer of at most `bits` bits (``|Abar| <= 2**bits``); each column j of
   B likewise by ``2**f_j``. Powers of two: the scaling itself is exact.
   Within `bits`, each row keeps as many bits as the moduli allow for its
   2-norm (:func:`budgets`, :func:`exponents`): a row of spread-out entries,
   whose norm is well below sqrt(K) times its largest, keeps more than one
   whose entries are all alike (the worst case, :func:`bits_for`).
2. Residues. For pairwise coprime moduli ``m_l <= 256`` (:data:`MODULI`),
   ``Abar mod m_l`` and ``Bbar mod m_l`` in the symmetric range fit int8
   (computed in float64, exactly: ``x - m rint(x / m)`` for ``|x| < 2**52``).
3. Integer products. ``(Abar mod m_l) @ (Bbar mod m_l)`` is exact in int32
   while K * 128**2 < 2**31 (K up to 131071; longer K goes in pieces), and
   congruent to ``Abar @ Bbar`` mod m_l: one INT8 GEMM per modulus.
4. Reconstruction (Chinese remainder theorem). ``X = Abar @ Bbar`` is the
   integer in (-M/2, M/2), M the moduli's product, congruent to ``sum_l u_l
   w_l`` mod M, u_l the l-th product reduced mod m_l and ``w_l`` the CRT
   weights; it holds while ``|X_ij| <= |Abar_i| |Bbar_j| < M/2`` (the 2-norms
   of row i and column j, Cauchy-Schwarz; a 2**-30 share is left for the
   rounding of the quotient below), which step 1's exponents ensure.
   Each ``w_l`` is split into a high part, a multiple of ``2**t`` below
   ``2**(t+40)``, and the rest: the high sums are exact in float64, so the
   quotient by M and the remainder are too, and the low parts carry the rest
   to float64 accuracy (:func:`crt_weights`, :func:`fold`, :func:`finish`).
   Each product is folded in as it comes (two float64 sums per element),
   so no product has to wait for the others.
5. Unscale: ``C_ij = 2**(-e_i - f_j) X_ij``.

The only error is step 1's rounding: ``|C - A B|_ij <= 2**-(e_i+1) *
(|B| 1)_j`` + the same for B, where ``2**-e_i`` is the unit of row i's
last kept bit, about ``2**-bits_i`` of its largest entry (:func:`error_bound`).
For rows and columns of similar magnitudes and 51-52 bits kept that is
float64's own accuracy; where one row spans many orders of magnitude, its
small entries lose bits (tested at 1e±8), so a check (``--check``) is the
companion of this mode. Unless told, products take :func:`default_moduli`:
at K = 32768 15 moduli, with which rows of random entries keep 51-52 bits
and rows whose entries are all alike 50-51.
"""

from __future__ import annotations

import functools
import math

import numpy as np

__all__ = ["MODULI", "BITS", "SLACK", "K_EXACT", "K_NATIVE", "budgets", "bits_for", "moduli_for",
           "default_moduli", "choose", "scale", "norms", "exponents", "operands", "residues",
           "integer_product", "crt_weights", "fold", "finish", "reconstruct", "gemm_int8",
           "error_bound"]

#: The refusal of inputs that hold Inf or NaN.
NOT_FINITE = "precision fp64-int8 needs finite inputs: A or B holds Inf or NaN"

#: Pairwise coprime moduli up to 256, largest first (so the fewest reach a
#: given product): their symmetric residues fit int8.
MODULI = (256, 255, 253, 251, 247, 241, 239, 233, 229, 227, 223, 217, 211, 199, 197, 193,
          191, 181, 179, 173, 167, 163, 157, 151, 149, 139, 137, 131, 127, 113)

#: Longest inner dimension one int32 accumulation of int8 products holds
#: exactly (K * 128 * 128 < 2**31). Module-level so tests can lower it.
K_EXACT = (2**31 - 1) // (128 * 128)


#: Shortest inner dimension whose fp64-int8 products go through INT8 GEMMs;
#: shorter ones (an edge panel) run native float64: the scaling rounds each
#: entry to ``2**-(BITS - SLACK)`` of its row's largest, which a sum of K
#: terms' ``(K + 2) eps`` gauge covers only from K = 14 on (a 5 x 3 x 1
#: product measured 1.07 of it), and below ~32 terms the residue planes and
#: folds (15 passes over memory) cost more than native float64's products
#: (by their bytes against its flops, on an RTX 3090's slow float64 too).
K_NATIVE = 32


#: Bits each row of A and column of B keeps by default: float64's accuracy,
#: the most whose residues float64 arithmetic computes exactly.
BITS = 52


#: Bits below `bits` the default count of moduli may leave a row or column
#: whose entries are all of its largest magnitude (the worst case of the
#: bound); rows of spread-out entries keep `bits` or one fewer
#: (:func:`default_moduli`).
SLACK = 2


def budgets(count: int, k: int) -> tuple[float, float]:
    """log2 of the largest 2-norms the scaled rows of A and columns of B may
    have for `count` moduli over an inner dimension `k`: ``|Abar_i| |Bbar_j| <
    M/2`` (Cauchy-Schwarz bounds the product's entries by it), less a 2**-30
    share for the rounding of the reconstruction's quotient, and less the
    rounding of the scaled entries (half a unit each). A gets the half bit
    that an integer split of the budget leaves (B's exponents must not
    depend on A: :func:`summa.precision.ozaki_gpu.same_b`)."""
    half = (sum(math.log2(m) for m in MODULI[:count]) - 1 + math.log2(1 - 2.0**-30)) / 2
    rounding = 0.5 * math.sqrt(max(1, k))
    return tuple(math.log2(max(2.0**cap - rounding, 2.0**-60)) for cap in (half + 0.5, half - 0.5))


@functools.lru_cache(maxsize=4096)  # the planner asks for every cut it tries
def bits_for(count: int, k: int) -> int:
    """The bits (at most :data:`BITS`) `count` moduli keep in every row and
    column over an inner dimension `k`, whatever its entries: the worst case,
    a row whose entries are all as large as its largest (2-norm sqrt(k))."""
    # such a row scaled into [0.5, 1) (0.75 has exponent 0, so e is its bits)
    # has a 2-norm below sqrt(k); B's budget is the smaller
    return int(exponents(np.array([0.75]), BITS, np, np.array([math.sqrt(max(1, k))]),
                         budgets(count, k)[1])[0])


@functools.lru_cache(maxsize=4096)  # the planner asks for every cut it tries
def moduli_for(bits: int, k: int) -> int:
    """How many of :data:`MODULI` keep `bits` bits in every row and column
    over an inner dimension `k` (:func:`bits_for`), whatever their entries."""
    for count in range(1, len(MODULI) + 1):
        if bits_for(count, k) >= bits:
            return count
    raise ValueError(f"{bits}-bit operands over K = {k} need more than the {len(MODULI)} moduli")


def moduli_range() -> tuple[int, int]:
    """The fewest and the most moduli a product can take (fewer than the
    fewest cannot rebuild a product over K up to :data:`K_EXACT`)."""
    fewest = min(c for c in range(1, len(MODULI) + 1) if bits_for(c, K_EXACT) >= 1)
    return fewest, len(MODULI)


def check_moduli(moduli) -> int:
    """`moduli` as an int where a product can take that many
    (:func:`moduli_range`), else one clear ValueError."""
    if isinstance(moduli, bool) or not isinstance(moduli, (int, np.integer)):
        raise ValueError(f"moduli must be an integer, got {moduli!r}")
    fewest, most = moduli_range()
    if not fewest <= moduli <= most:
        raise ValueError(f"moduli must be {fewest}-{most} (fewer cannot rebuild "
                         f"products over K up to {K_EXACT}), got {moduli}")
    return int(moduli)


@functools.lru_cache(maxsize=4096)  # the planner asks for every cut it tries
def default_moduli(bits: int, k: int) -> int:
    """The moduli a product over `k` takes unless told: the fewest that keep
    at least ``bits - SLACK`` bits in every row and column (an error at most
    ``2**SLACK`` times `bits`' own where a row's entries are all of one
    size), so that rows of spread-out entries, whose 2-norms are smaller,
    keep `bits` or one fewer (:func:`exponents`)."""
    return moduli_for(max(1, bits - SLACK), k)


def check_bits(bits: int) -> int:
    """`bits` as an int, if float64 computes residues of such integers exactly."""
    if not 1 <= int(bits) <= 52:
        raise ValueError(f"bits must be 1-52 (float64 computes their residues exactly), "
                         f"got {bits}")
    return int(bits)


def scale(x, axis: int, bits: int, xp=np, cap: float | None = None):
    """``(xbar, e)``: `x` times ``2**e`` along `axis` (per row for axis 1, per
    column for axis 0), rounded to integers with ``|xbar| <= 2**bits``
    (float64) and, given `cap`, each row's (column's) 2-norm below
    ``2**cap`` (:func:`budgets`); ``e`` int32. Zero rows (columns) keep
    e = 0. Refuses Inf/NaN."""
    if not bool(xp.isfinite(x).all()):
        raise ValueError(NOT_FINITE)
    bits = check_bits(bits)
    amax = xp.abs(x).max(axis=axis, keepdims=True)
    norm = None if cap is None else norms(x, amax, axis, xp)
    e = exponents(amax, bits, xp, norm, cap)
    return xp.rint(xp.ldexp(x, e)), e


def norms(x, amax, axis: int, xp=np):
    """2-norms of `x`'s rows (axis 1) or columns (axis 0) scaled by the power
    of two that brings their largest magnitudes `amax` into [0.5, 1) (so no
    square overflows; those that underflow weigh below 2**-1000)."""
    _, ex = xp.frexp(amax)
    return xp.sqrt(xp.sum(xp.square(xp.ldexp(x, -ex)), axis=axis, keepdims=True))


def exponents(amax, bits: int, xp=np, norm=None, cap: float | None = None):
    """The scaling exponents of rows (columns) whose largest magnitudes are
    `amax`: ``amax * 2**e < 2**bits``, and given their :func:`norms` `norm`,
    the scaled row's 2-norm at most ``2**cap`` (with room for its rounding
    to float64: 2**-30); 0 for zero rows. Rows of spread-out entries thus
    keep more bits than :func:`bits_for` promises (Ozaki scheme II's
    Cauchy-Schwarz scaling)."""
    _, ex = xp.frexp(amax)  # amax < 2**ex
    kept = bits
    if norm is not None:  # norm >= 0.5 where amax > 0
        # a row holding Inf/NaN is refused (its product meaningless) but
        # keeps a finite exponent: no integer overflow in the kernels meanwhile
        norm = xp.where(xp.isfinite(norm), xp.maximum(norm, 0.5), 0.5)
        kept = xp.minimum(bits, xp.floor(cap - xp.log2(norm * (1 + 2.0**-30)) - 1e-9))
    return xp.where(amax > 0, kept - ex, 0).astype(np.int32)


def residues(xbar, m: int, xp=np):
    """``xbar mod m`` for float64 integers ``|xbar| < 2**52`` in ``[-128, 127]``,
    as int8. The quotient comes from a product with ``1/m`` (as on the GPU:
    :mod:`summa.precision.ozaki_gpu` computes the same values); it may be one off, so
    the remainder, exact either way, is moved back into range."""
    r = xbar - m * xp.rint(xbar * (1.0 / m))  # exact: q m and the difference are integers
    r = xp.where(r > 127, r - m, r)
    r = xp.where(r < -128, r + m, r)
    return r.astype(np.int8)


def integer_product(a8, b8, xp=np, backend=None):
    """``a8 @ b8`` exactly for int8 operands with K at most :data:`K_EXACT`,
    as int32. `backend` multiplies (:meth:`summa.device.backend.Backend.int8_product`:
    cuBLAS's INT8 GEMM on GPUs); without one, NumPy in int64."""
    if a8.shape[1] > K_EXACT:
        raise ValueError(f"K = {a8.shape[1]} exceeds the {K_EXACT} an int32 sum holds")
    if backend is not None:
        return backend.int8_product(a8, b8)
    return (a8.astype(np.int64) @ b8.astype(np.int64)).astype(np.int32)


def choose(bits: int, moduli: int | None, k: int) -> tuple[int, int]:
    """``(bits, moduli)`` for a product over `k`: `bits` (checked), the most
    any row or column keeps, and the moduli given (checked: every row keeps
    a bit at least) or :func:`default_moduli`'s."""
    bits = check_bits(bits)
    if moduli is None:
        return bits, default_moduli(bits, k)
    count = int(moduli)
    if not 1 <= count <= len(MODULI):
        raise ValueError(f"moduli must be 1-{len(MODULI)}, got {count}")
    if bits_for(count, k) < 1:
        raise ValueError(f"{count} moduli cannot reconstruct products over K = {k}")
    return bits, count


def operands(a, b, bits: int, count: int, xp=np):
    """``(abar, e, bbar, f)``: `a`'s rows and `b`'s columns scaled to integers
    for `count` moduli (:func:`scale` within :func:`budgets`)."""
    cap_a, cap_b = budgets(count, a.shape[1])
    abar, e = scale(a, 1, bits, xp, cap_a)
    bbar, f = scale(b, 0, bits, xp, cap_b)
    return abar, e, bbar, f


def crt_weights(moduli) -> dict:
    """The reconstruction's constants for `moduli`: ``t``, and in units of
    ``2**t`` each CRT weight's high part (an integer below ``2**40``) and low
    part (below 1), and M's (:func:`fold`, :func:`finish`)."""
    big = math.prod(moduli)
    t = max(0, big.bit_length() - 40)  # below 2**40 the weights are their own high parts
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
        The most bits a row of `a` or column of `b` keeps (52: float64's);
        each keeps as many as the moduli's product allows for its 2-norm.
    moduli : int, optional
        How many moduli (default :func:`default_moduli`: every row keeps at
        least ``bits - SLACK``, rows of spread-out entries `bits` or one
        fewer); fewer keep fewer bits (:func:`bits_for`): faster, less
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
    abar, e, bbar, f = operands(a, b, bits, count, xp)
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


def error_bound(a, b, bits: int = BITS, moduli: int | None = None, xp=np):
    """Elementwise bound on ``|gemm_int8(a, b, bits, moduli) - a @ b|``: the
    scaling's rounding (half a unit of each row's and column's last kept
    bit) carried through the product, plus float64's rounding of the
    reconstructed value (and of the sum of K's pieces)."""
    if np.dtype(a.dtype).kind == "c" or np.dtype(b.dtype).kind == "c":  # the four products'
        ar, ai, br, bi = a.real, a.imag, b.real, b.imag
        return sum(error_bound(x, y, bits, moduli, xp)
                   for x, y in ((ar, br), (ai, bi), (ar, bi), (ai, br)))
    k = a.shape[1]
    if k > K_EXACT:
        pieces = range(0, k, K_EXACT)
        return (sum(error_bound(a[:, k0:k0 + K_EXACT], b[k0:k0 + K_EXACT], bits, moduli, xp)
                    for k0 in pieces)
                + len(pieces) * np.finfo(np.float64).eps * (xp.abs(a) @ xp.abs(b)))
    bits, count = choose(bits, moduli, k)
    _, e, _, f = operands(a, b, bits, count, xp)
    ua, ub = xp.ldexp(0.5, -e), xp.ldexp(0.5, -f)  # (m, 1), (1, n)
    return (ua * xp.abs(b).sum(axis=0, keepdims=True) + xp.abs(a).sum(axis=1, keepdims=True) * ub
            + k * ua * ub + 4 * np.finfo(np.float64).eps * (xp.abs(a) @ xp.abs(b)))
