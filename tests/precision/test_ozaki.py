"""Ozaki scheme II on the CPU (summa/precision/ozaki.py): exact residue products, the
reconstruction, scaling's edge cases, and the accuracy the bound states."""

import math
import os

import numpy as np
import pytest

from summa.precision import ozaki


def test_moduli_are_pairwise_coprime_and_fit_int8():
    assert all(math.gcd(a, b) == 1 for i, a in enumerate(ozaki.MODULI)
               for b in ozaki.MODULI[i + 1:])
    assert max(ozaki.MODULI) <= 256
    for m in ozaki.MODULI:
        r = ozaki.residues(np.arange(-3000, 3000), m)
        assert r.dtype == np.int8 and np.all((np.arange(-3000, 3000) - r) % m == 0)


def test_residue_products_reconstruct_the_integer_product_exactly(rng):
    k, bits = 37, 20
    a = rng.integers(-2**bits, 2**bits + 1, (9, k))
    b = rng.integers(-2**bits, 2**bits + 1, (k, 7))
    count = ozaki.moduli_for(bits, k)  # enough for these integers: |X| <= k 2**(2 bits)
    chosen = ozaki.MODULI[:count]
    parts = [ozaki.integer_product(ozaki.residues(a, m), ozaki.residues(b, m)) % m
             for m in chosen]
    exact = a.astype(object) @ b.astype(object)   # Python integers: no rounding
    got = ozaki.reconstruct(parts, chosen)
    assert np.array_equal(got, exact.astype(np.float64))  # exact below 2**53
    # one modulus fewer than the bound asks for can no longer tell the product
    short = ozaki.reconstruct(parts[:-1], chosen[:-1])
    worst = max(abs(int(x)) for x in exact.ravel())
    assert worst * 2 >= math.prod(chosen[:-1]) or np.array_equal(short, got)


def test_reconstruction_beyond_53_bits_is_float64_accurate(rng):
    chosen = ozaki.MODULI[:16]
    big = [int(x) for x in rng.integers(-2**62, 2**62, 40)]
    values = [v * 2**40 + 12345 for v in big]      # ~2**102, inside (-M/2, M/2)
    parts = [np.array([v % m for v in values]) for m in chosen]
    got = ozaki.reconstruct(parts, chosen)
    want = np.array([float(v) for v in values])
    # The error is absolute, a fixed fraction of the moduli's product: float64
    # accurate against the largest value (the GEMM's gauge sees that), and a
    # value far below it (one draw in ~400 has one) is accurate to that much.
    assert np.all(np.abs(got - want) <= 2 * np.finfo(float).eps * np.abs(want).max())


def test_long_inner_dimensions_go_in_pieces_that_int32_holds(rng, monkeypatch):
    monkeypatch.setattr(ozaki, "K_EXACT", 5)
    a8 = rng.integers(-128, 128, (4, 23)).astype(np.int8)
    b8 = rng.integers(-128, 128, (23, 3)).astype(np.int8)
    with pytest.raises(ValueError, match="int32"):
        ozaki.integer_product(a8, b8)
    a, b = rng.uniform(-1, 1, (4, 23)), rng.uniform(-1, 1, (23, 3))
    c = ozaki.gemm_int8(a, b)  # five pieces, their float64 products summed
    ref = a.astype(np.longdouble) @ b.astype(np.longdouble)
    assert np.all(np.abs(c - ref).astype(float) <= ozaki.error_bound(a, b, 52))


def test_the_reconstruction_folds_products_in_any_order(rng):
    """Each modulus's product is folded in as it comes: the high sums are
    exact, so the order cannot change the result's high part."""
    chosen = ozaki.MODULI[:12]
    values = np.array([int(v) * 2**30 for v in rng.integers(-2**50, 2**50, 50)], dtype=object)
    parts = [np.array([int(v) % m for v in values]) for m in chosen]
    forward = ozaki.reconstruct(parts, chosen)
    order = rng.permutation(len(chosen))
    backward = ozaki.reconstruct([parts[i] for i in order], [chosen[i] for i in order])
    want = values.astype(np.float64)
    assert np.array_equal(forward, want) and np.array_equal(backward, want)


@pytest.mark.parametrize("data", ["uniform", "normal", "rows 1e±8"])
def test_float64_products_within_the_stated_bound_and_float64_level(rng, data):
    m, k, n = 48, 300, 40
    if data == "uniform":
        a, b = rng.uniform(-1, 1, (m, k)), rng.uniform(-1, 1, (k, n))
    elif data == "normal":
        a, b = rng.standard_normal((m, k)), rng.standard_normal((k, n))
    else:  # each row (column) of A (B) at its own scale: within a row all alike
        a = rng.uniform(-1, 1, (m, k)) * 10.0 ** rng.uniform(-8, 8, (m, 1))
        b = rng.uniform(-1, 1, (k, n)) * 10.0 ** rng.uniform(-8, 8, (1, n))
    c = ozaki.gemm_int8(a, b, bits=52)
    ref = a.astype(np.longdouble) @ b.astype(np.longdouble)
    err = np.abs(c - ref).astype(np.float64)
    assert np.all(err <= ozaki.error_bound(a, b, 52))
    gauge = k * np.finfo(np.float64).eps * (np.abs(a) @ np.abs(b))  # the PBLAS gauge
    assert np.max(err / gauge) <= 1


def test_spread_within_a_row_costs_its_small_entries_bits(rng):
    # the honest limit: a row keeps 53 bits of its largest entry, so its entries
    # 1e16 smaller keep none, and where B's column weighs them most (its entry
    # against the large one is tiny), the product leaves float64's gauge
    a = rng.uniform(-1, 1, (8, 64))
    a[:, 0] *= 1e8
    a[:, 1:] *= 1e-8
    b = rng.uniform(-1, 1, (64, 8))
    b[0] *= 1e-8
    c = ozaki.gemm_int8(a, b, bits=52)
    ref = a.astype(np.longdouble) @ b.astype(np.longdouble)
    err = np.abs(c - ref).astype(np.float64)
    assert np.all(err <= ozaki.error_bound(a, b, 52))
    gauge = 64 * np.finfo(np.float64).eps * (np.abs(a) @ np.abs(b))
    assert np.max(err / gauge) > 1  # beyond float64's gauge: what --check is for


def test_fewer_bits_need_fewer_moduli_and_cost_accuracy(rng):
    a, b = rng.uniform(-1, 1, (20, 100)), rng.uniform(-1, 1, (100, 20))
    assert ozaki.moduli_for(20, 100) < ozaki.moduli_for(52, 100)
    ref = a @ b
    errs = [np.max(np.abs(ozaki.gemm_int8(a, b, bits=t) - ref)) for t in (16, 30, 52)]
    assert errs[0] > errs[1] > errs[2]
    for t, e in zip((16, 30), errs):
        assert e <= np.max(ozaki.error_bound(a, b, t))


def test_zeros_subnormals_and_non_finite_inputs(rng):
    a = rng.uniform(-1, 1, (6, 5))
    a[2] = 0.0                                 # a zero row stays zero
    a[4] = rng.uniform(-1, 1, 5) * 1e-310      # a subnormal row keeps its bits
    b = rng.uniform(-1, 1, (5, 4))
    c = ozaki.gemm_int8(a, b)
    assert np.all(c[2] == 0)
    ref = a.astype(np.longdouble) @ b.astype(np.longdouble)
    assert np.all(np.abs(c - ref).astype(float) <= ozaki.error_bound(a, b, 52))
    for bad in (np.inf, np.nan):
        a2 = a.copy()
        a2[0, 0] = bad
        with pytest.raises(ValueError, match="finite inputs"):
            ozaki.gemm_int8(a2, b)
    with pytest.raises(ValueError, match="bits"):
        ozaki.gemm_int8(a, b, bits=63)
    with pytest.raises(ValueError, match="moduli"):
        ozaki.moduli_for(62, 2**120)


def test_the_numpy_backend_multiplies_residues_exactly(rng):
    from summa.device.backend import NumpyBackend
    a = rng.uniform(-1, 1, (30, 70))
    b = rng.uniform(-1, 1, (70, 20))
    assert np.array_equal(ozaki.gemm_int8(a, b, backend=NumpyBackend()), ozaki.gemm_int8(a, b))


def test_fp64_int8_is_refused_where_it_cannot_run(monkeypatch):
    """One clear error: on CPUs, for other dtypes, on GPUs without INT8
    tensor cores; from the command line exit status 2."""
    from summa.planning.checks import check_scalars

    class OldGpu:
        name = "cupy"
        is_gpu = True

        def has_int8_tensor_cores(self):
            return False

        def describe(self):
            return "a GPU of compute capability 7.0"
    with pytest.raises(ValueError, match="INT8 tensor cores .*7.0"):
        check_scalars(1.0, 0.0, np.dtype("float64"), "fp64-int8", OldGpu())
    with pytest.raises(ValueError, match="emulates float64 and complex128 products; the data "
                                         "are float32"):
        check_scalars(1.0, 0.0, np.dtype("float32"), "fp64-int8", OldGpu())
    from test_cli import job
    p = job(1, "bench", "--backend", "numpy", "--size", "32", "--precision", "fp64-int8")
    assert p.returncode == 2 and "fp64-int8 needs the cupy backend" in p.stderr
    assert p.stderr.count("error") == 1
    p = job(1, "calibrate", "--backend", "numpy", "--precision", "fp64-int8", "-o",
            os.devnull)
    assert p.returncode == 2 and "fp64-int8 needs the cupy backend" in p.stderr
    for args, message in ((["--moduli", "14"], "--moduli applies to --precision fp64-int8"),
                          (["--precision", "fp64-int8", "--moduli", "31"], "must be 3-30"),
                          (["--precision", "fp64-int8", "--moduli", "2"], "must be 3-30")):
        p = job(1, "bench", "--backend", "numpy", "--size", "32", *args)
        assert p.returncode == 2 and message in p.stderr, p.stderr


def test_fewer_moduli_keep_fewer_bits_and_stay_within_their_bound(rng):
    """A moduli count below the default lowers the bits rows keep, so the
    reconstruction never wraps; the error grows as the bound says."""
    a, b = rng.uniform(-1, 1, (30, 400)), rng.uniform(-1, 1, (400, 20))
    full = ozaki.default_moduli(ozaki.BITS, 400)
    ref = a.astype(np.longdouble) @ b.astype(np.longdouble)
    errors = []
    for count in (full, full - 2, full - 4):
        bits = ozaki.bits_for(count, 400)
        assert ozaki.moduli_for(bits, 400) <= count
        c = ozaki.gemm_int8(a, b, moduli=count)
        err = np.abs(c - ref).astype(float)
        assert np.all(err <= ozaki.error_bound(a, b, moduli=count))
        errors.append(err.max())
    assert errors[0] < errors[1] < errors[2]
    with pytest.raises(ValueError, match="moduli must be"):
        ozaki.gemm_int8(a, b, moduli=0)
    with pytest.raises(ValueError, match="cannot reconstruct"):
        ozaki.gemm_int8(a, b, moduli=1)


def _kept(x, axis, count, side):
    """The bits each row (axis 1) or column (axis 0) of `x` keeps for `count`
    moduli: its largest entry below 2**kept once scaled."""
    cap = ozaki.budgets(count, x.shape[1] if axis == 1 else x.shape[0])[side]
    amax = np.abs(x).max(axis=axis, keepdims=True)
    e = ozaki.exponents(amax, ozaki.BITS, np, ozaki.norms(x, amax, axis), cap)
    return (e + np.frexp(amax)[1]).ravel()


def test_rows_keep_bits_by_their_2_norm_within_the_moduli_s_product(rng):
    """Cauchy-Schwarz scaling: the scaled rows' and columns' 2-norms multiply
    to below M/2 (so the reconstruction is exact), a row whose entries are all
    alike keeps bits_for's bits, rows of random entries more; the default
    count is the fewest that keep bits - SLACK in the worst case."""
    k = 32768
    count = ozaki.default_moduli(ozaki.BITS, k)
    assert ozaki.bits_for(count, k) >= ozaki.BITS - ozaki.SLACK
    assert ozaki.bits_for(count - 1, k) < ozaki.BITS - ozaki.SLACK
    alike = np.full((1, k), 0.75) * rng.choice([-1.0, 1.0], (1, k))
    spread = np.vstack([rng.uniform(-1, 1, (3, k)), rng.standard_normal((3, k))])
    for side, axis in ((0, 1), (1, 0)):
        x = (alike, spread) if axis == 1 else (alike.T, spread.T)
        worst, random = _kept(x[0], axis, count, side), _kept(x[1], axis, count, side)
        assert worst.min() >= ozaki.bits_for(count, k) and random.min() > worst.max()
        assert random.min() >= ozaki.BITS - 1
    a, b = np.vstack([alike, spread]), np.vstack([alike, spread]).T.copy()
    abar, _, bbar, _ = ozaki.operands(a, b, ozaki.BITS, count)
    half = math.prod(ozaki.MODULI[:count]) // 2
    for i in range(a.shape[0]):
        for j in range(b.shape[1]):
            # the bound in exact integers: |Abar_i|^2 |Bbar_j|^2 < (M/2)^2
            na = sum(int(v) ** 2 for v in abar[i])
            nb = sum(int(v) ** 2 for v in bbar[:, j])
            assert na * nb < half ** 2


@pytest.mark.parametrize("count", [4, 6, 9, 13])  # below the 52-bit cap at K = 64
def test_products_at_the_edge_of_the_budget_reconstruct_exactly(count):
    """Rows and columns whose entries all have one size make Cauchy-Schwarz an
    equality; sized so that the exponents' rounding down leaves no room, the
    product reaches M/2 within a few parts in a million, and is still rebuilt
    exactly (a bit more and it would wrap around M)."""
    k = 64
    cap_a, cap_b = ozaki.budgets(count, k)
    # 2**(frac(cap) - 1), a hair less: each scaled row's norm just below 2**cap
    a = np.full((3, k), 2.0 ** (cap_a % 1 - 1) * (1 - 1e-6))
    a[1] *= -1
    b = np.full((k, 2), 2.0 ** (cap_b % 1 - 1) * (1 - 1e-6))
    abar, e, bbar, f = ozaki.operands(a, b, ozaki.BITS, count)
    exact = abar.astype(np.int64).astype(object) @ bbar.astype(np.int64).astype(object)
    half = math.prod(ozaki.MODULI[:count]) / 2
    assert 0.9999 * half < float(np.abs(exact).max()) < half
    c = ozaki.gemm_int8(a, b, moduli=count)
    want = np.ldexp(exact.astype(np.float64), -e - f)
    assert np.all(np.abs(c - want) <= 2 * np.spacing(np.abs(want)))


def test_complex128_products_from_four_real_ones(rng):
    m, k, n = 20, 150, 17
    a = rng.uniform(-1, 1, (m, k)) + 1j * rng.uniform(-1, 1, (m, k))
    b = rng.standard_normal((k, n)) + 1j * rng.standard_normal((k, n))
    c = ozaki.gemm_int8(a, b)
    ref = a.astype(np.clongdouble) @ b.astype(np.clongdouble)
    err = np.abs(c - ref).astype(np.float64)
    assert c.dtype == np.complex128
    assert np.all(err <= ozaki.error_bound(a, b, ozaki.BITS))
    gauge = k * np.finfo(np.float64).eps * (np.abs(a) @ np.abs(b))
    assert np.max(err / gauge) <= 1
