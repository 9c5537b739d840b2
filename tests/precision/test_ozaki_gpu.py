"""summa.precision.ozaki_gpu's orchestration on a NumPy stand-in for CuPy
(tests/fake_cupy_kernels.py: the kernels as the same formulas in NumPy): the
same products as summa.precision.ozaki's, whatever the grouping of the folds, with or
without the overlapped folds, K in pieces, A's and C's rows in chunks, complex operands,
alpha and beta; the scratch a product holds, as the plans count it; and the kernels made
before the first product (summa.precision.warmup)."""

import sys
import weakref

import numpy as np
import pytest

import fake_cupy_kernels
from helpers import (expected_reductions, gemm_scaled_error, reduction_cases, use_fake_cupy,
                     within_two_ulps)
from summa.precision import kernels, ozaki


@pytest.fixture
def ozaki_gpu(monkeypatch):
    use_fake_cupy(monkeypatch)
    from summa.precision import ozaki_gpu
    return ozaki_gpu


@pytest.mark.parametrize("planes", ["1", "3", "4", "16"])
def test_every_grouping_of_the_folds_gives_the_cpu_product(rng, ozaki_gpu, planes):
    backend = fake_cupy_kernels.Backend()
    a, b = rng.uniform(-1, 1, (37, 61)), rng.standard_normal((61, 23))  # K, N not multiples of 4
    c = np.empty((37, 23))
    ozaki_gpu.gemm(1.0, a, b, c, backend=backend, scheme=ozaki_gpu.Scheme(planes=int(planes)))
    count = ozaki.default_moduli(ozaki.BITS, 61)
    assert backend.gemms == count and within_two_ulps(c, ozaki.gemm_int8(a, b))
    launches = {name: kernels.kernel(name).launches for name in ("fold", "fold_finish")}
    # the last fold ends the product (no finish pass): one of them per product
    assert launches["fold_finish"] == 1 and kernels.kernel("finish").launches == 0
    assert sum(launches.values()) == -(-count // min(int(planes), count))


@pytest.mark.parametrize("planes", ["4", "16"])
def test_a_product_into_columns_apart_ends_in_the_finish_pass(rng, ozaki_gpu, planes):
    backend = fake_cupy_kernels.Backend()
    a, b = rng.uniform(-1, 1, (21, 30)), rng.standard_normal((30, 17))
    whole = rng.uniform(-1, 1, (17, 21)).T  # C's columns contiguous, not its rows
    c0 = whole.copy()
    ozaki_gpu.gemm(2.0, a, b, whole, beta=-1.0, backend=backend,
                   scheme=ozaki_gpu.Scheme(planes=int(planes)))
    assert within_two_ulps(whole, 2.0 * ozaki.gemm_int8(a, b) - c0)
    assert kernels.kernel("fold_finish").launches == 0 and kernels.kernel("finish").launches == 1


def test_alpha_beta_views_and_k_in_pieces(rng, ozaki_gpu, monkeypatch):
    monkeypatch.setattr(ozaki, "K_EXACT", 16)
    backend = fake_cupy_kernels.Backend()
    big = rng.uniform(-1, 1, (40, 80))
    a = big[3:33, 5:55]  # rows with a pitch
    b = rng.uniform(-1, 1, (50, 19))
    c0 = rng.uniform(-1, 1, (30, 19))
    c = c0.copy()
    ozaki_gpu.gemm(-1.5, a, b, c, beta=0.25, backend=backend)
    want = -1.5 * ozaki.gemm_int8(a, b) + 0.25 * c0
    ref = -1.5 * (a.astype(np.longdouble) @ b.astype(np.longdouble)) + 0.25 * c0
    assert np.max(np.abs(c - want)) <= 1e-14 and np.all(
        np.abs(c - ref).astype(float) <= 1.5 * ozaki.error_bound(a, b, ozaki.BITS) + 1e-15)


def test_complex_products_moduli_and_refusals(rng, ozaki_gpu):
    backend = fake_cupy_kernels.Backend()
    a = rng.uniform(-1, 1, (12, 33)) + 1j * rng.uniform(-1, 1, (12, 33))
    b = rng.uniform(-1, 1, (33, 9)) + 1j * rng.uniform(-1, 1, (33, 9))
    c = np.zeros((12, 9), dtype=complex)
    ozaki_gpu.gemm(2.0, a, b, c, backend=backend)
    assert np.all(np.abs(c - 2 * ozaki.gemm_int8(a, b)) <= 1e-14)
    real = rng.uniform(-1, 1, (8, 40))
    out = np.empty((8, 8))
    ozaki_gpu.gemm(1.0, real, real.T.copy(), out, backend=backend,
                   scheme=ozaki_gpu.Scheme(moduli=10))
    assert within_two_ulps(out, ozaki.gemm_int8(real, real.T.copy(), moduli=10))
    bad = real.copy()
    bad[2, 3] = np.nan
    with pytest.raises(ValueError, match="finite inputs"):
        ozaki_gpu.gemm(1.0, bad, real.T.copy(), out, backend=backend)
    empty = np.full((8, 8), 3.0)
    ozaki_gpu.gemm(1.0, real[:, :0], real.T[:0].copy(), empty, beta=0.5, backend=backend)
    assert np.all(empty == 1.5)


def test_complex_alpha_and_beta_and_a_c_of_nan_with_beta_zero(rng, ozaki_gpu):
    """The four real products join C as ``alpha (re + i im) + beta C``, for
    complex alpha and beta; with beta 0 whatever C held (NaN) is gone."""
    backend = fake_cupy_kernels.Backend()
    a = rng.uniform(-1, 1, (12, 33)) + 1j * rng.uniform(-1, 1, (12, 33))
    b = rng.uniform(-1, 1, (33, 9)) + 1j * rng.uniform(-1, 1, (33, 9))
    c0 = rng.uniform(-1, 1, (12, 9)) + 1j * rng.uniform(-1, 1, (12, 9))
    c = c0.copy()
    ozaki_gpu.gemm(0.5 - 1j, a, b, c, beta=2.0 + 0.5j, backend=backend)
    assert gemm_scaled_error(c, a, b, c0, alpha=0.5 - 1j, beta=2.0 + 0.5j) <= 1
    fresh = np.full((12, 9), np.nan, dtype=complex)
    ozaki_gpu.gemm(0.5 - 1j, a, b, fresh, backend=backend)
    assert gemm_scaled_error(fresh, a, b, alpha=0.5 - 1j) <= 1


def test_a_scheme_reaches_each_real_product_of_a_complex_one_in_k_pieces(rng, ozaki_gpu,
                                                                         monkeypatch):
    """A Scheme's bits, moduli and planes reach the four real products of a
    complex one and each piece of K: every piece's 10 INT8 GEMMs folded 3 a
    pass, and the CPU's product of the same bits and moduli."""
    monkeypatch.setattr(ozaki, "K_EXACT", 16)
    backend = fake_cupy_kernels.Backend()
    a = rng.uniform(-1, 1, (12, 33)) + 1j * rng.uniform(-1, 1, (12, 33))
    b = rng.uniform(-1, 1, (33, 9)) + 1j * rng.uniform(-1, 1, (33, 9))
    c = np.zeros((12, 9), dtype=complex)
    ozaki_gpu.gemm(2.0, a, b, c, backend=backend,
                   scheme=ozaki_gpu.Scheme(bits=30, moduli=10, planes=3))
    products = 4 * 3  # four real products, three pieces of K each
    assert backend.gemms == products * 10
    launches = sum(kernels.kernel(name).launches for name in ("fold", "fold_finish"))
    assert launches == products * -(-10 // 3)
    assert np.all(np.abs(c - 2 * ozaki.gemm_int8(a, b, bits=30, moduli=10)) <= 1e-14)


def test_row_strips_inside_same_b_make_b_once_and_give_the_whole_product(rng, ozaki_gpu):
    # An out-of-core tile's last panel goes home in row strips: B's residues
    # are made once for all of them, and the strips are the whole product's rows.
    backend = fake_cupy_kernels.Backend()
    a, b = rng.uniform(-1, 1, (48, 40)), rng.standard_normal((40, 21))
    whole = np.empty((48, 21))
    ozaki_gpu.gemm(1.0, a, b, whole, backend=backend)
    residues = kernels.kernel("residues")
    before = residues.launches
    strips = np.empty((48, 21))
    with ozaki_gpu.same_b():
        for r0, r1 in ((0, 20), (20, 36), (36, 48)):
            ozaki_gpu.gemm(1.0, a[r0:r1], b, strips[r0:r1], backend=backend)
        assert residues.launches - before == 1 + 3  # B once, each strip's A
        other = rng.standard_normal((40, 21))  # another B inside: made anew, right
        c = np.empty((48, 21))
        ozaki_gpu.gemm(1.0, a, other, c, backend=backend)
        assert within_two_ulps(c, ozaki.gemm_int8(a, other))
    np.testing.assert_array_equal(strips, whole)
    assert ozaki_gpu._scopes.held is None  # nothing kept after the context
    ozaki_gpu.gemm(1.0, a[:20], b, strips[:20], backend=backend)
    assert residues.launches - before == 4 + 2 + 2  # outside: B made again


def test_inputs_checked_later_say_so_once_at_the_end(rng, ozaki_gpu):
    # SUMMA's products do not stop the host for each Inf/NaN check: the
    # checks are kept and answered at the end (every rank alike, by its caller).
    backend = fake_cupy_kernels.Backend()
    a, b = rng.uniform(-1, 1, (12, 10)), rng.uniform(-1, 1, (10, 9))
    bad = b.copy()
    bad[3, 4] = np.nan
    c = np.empty((12, 9))
    with ozaki_gpu.checked_later() as checks:
        ozaki_gpu.gemm(1.0, a, b, c, backend=backend)
        assert checks.finite() and len(checks.flags) == 2  # A's rows, B's columns
        with np.errstate(invalid="ignore"):  # its residues are meaningless: NaN cast
            ozaki_gpu.gemm(1.0, a, bad, c, backend=backend)  # no raise here
    assert not checks.finite() and ozaki_gpu._scopes.pending is None
    with pytest.raises(ValueError, match="finite inputs"):  # outside: at once
        ozaki_gpu.gemm(1.0, a, bad, c, backend=backend)


def test_short_sums_made_natively_refuse_inf_and_nan_as_the_products_do(rng, ozaki_gpu):
    """refuse_not_finite: the refusal of a product the backend makes in native
    float64 (K below K_NATIVE): the same error at once, or kept inside
    checked_later; finite and empty operands, complex ones too, pass."""
    a, b = rng.uniform(-1, 1, (6, 5)), rng.uniform(-1, 1, (5, 4))
    ozaki_gpu.refuse_not_finite(a, b)
    ozaki_gpu.refuse_not_finite(a[:, :0], b[:0])
    ozaki_gpu.refuse_not_finite(a + 1j * a, b)
    for bad in (np.inf, -np.inf, np.nan):
        for which in range(2):
            x, y = a.copy(), (b + 1j * b) if which else b.copy()
            (y if which else x)[2, 3] = bad if not which else complex(0, bad)
            with pytest.raises(ValueError, match="finite inputs"):
                ozaki_gpu.refuse_not_finite(x, y)
            with ozaki_gpu.checked_later() as checks:
                ozaki_gpu.refuse_not_finite(x, y)
            assert not checks.finite()


def test_moduli_asked_reach_the_products_and_the_plans(rng, ozaki_gpu, monkeypatch):
    """summa.matmul/gemm(..., moduli=L): inside, the planner takes L moduli,
    counts their scratch so and hands them to every product in its Plan's
    scheme (a width measured later, a sweep's tiles too), which then takes
    them wherever it runs; before and after, the default: in memory the
    panels' width's for every panel, a sweep's tile products each their
    own K's. The products themselves read no options: a scheme's None is
    the default for their K. Bad counts and counts without fp64-int8
    refused with one clear error."""
    from summa.planning import Machine, PlanRequest, make_plan, precision as asking
    from summa.planning.memory import Execution, memory_plan
    monkeypatch.delenv("SUMMA_FP64_INT8_MODULI", raising=False)
    backend = fake_cupy_kernels.Backend()
    a, b = rng.uniform(-1, 1, (20, 300)), rng.uniform(-1, 1, (300, 12))
    c = np.empty((20, 12))

    def planned():
        return memory_plan(4096, 4096, 4096, "float64", (1, 1), 4096,
                           Execution(1, "cupy", precision="fp64-int8")).device_bytes

    def made(width=4096, device_memory=None, moduli=None):
        return make_plan((4096, 4096, 4096), "float64", Machine("cupy", 2, free_device=2**40),
                         PlanRequest(precision="fp64-int8", panel_width=width,
                                     device_memory=device_memory), moduli=moduli)
    default, plan = asking.moduli_for(300), planned()
    in_memory, auto, sweep = made(), made("auto"), made(1000, device_memory="1GiB")
    assert in_memory.moduli == in_memory.scheme.moduli == asking.moduli_for(4096)
    assert auto.moduli is auto.scheme.moduli is None
    assert sweep.out_of_core and sweep.moduli and sweep.scheme.moduli is None
    with asking.asked_moduli(20):
        in_memory, auto, sweep = made(), made("auto"), made(1000, device_memory="1GiB")
        assert asking.moduli_for(300) == 20 and planned() > plan
        ozaki_gpu.gemm(1.0, a, b, c, backend=backend)  # no scheme: no options read
        assert backend.gemms == default != 20
    assert in_memory.scheme.moduli == auto.scheme.moduli == sweep.scheme.moduli == 20
    assert made(1000, device_memory="1GiB", moduli=12).scheme.moduli == 12
    backend.gemms = 0
    ozaki_gpu.gemm(1.0, a, b, c, backend=backend, scheme=sweep.scheme)
    assert backend.gemms == 20 and within_two_ulps(c, ozaki.gemm_int8(a, b, moduli=20))
    assert asking.moduli_for(300) == ozaki_gpu.moduli_for(300) == default
    assert planned() == plan
    for moduli, precision, message in ((15, None, "applies to precision fp64-int8"),
                                       (2, "fp64-int8", "must be 3-30"),
                                       (31, "fp64-int8", "must be 3-30"),
                                       (True, "fp64-int8", "an integer")):
        with pytest.raises(ValueError, match=message):
            ozaki_gpu.check_moduli(moduli, precision)


def test_matmul_and_gemm_refuse_moduli_they_cannot_take(rng):
    import summa
    from mpi4py import MPI
    from summa.device.backend import get_backend
    from summa.distribution.grid import ProcessGrid
    from summa.distribution.matrix import DistMatrix
    a, b = rng.uniform(-1, 1, (8, 6)), rng.uniform(-1, 1, (6, 5))
    with pytest.raises(ValueError, match="moduli applies to precision fp64-int8"):
        summa.matmul(a, b, moduli=15)  # refused before any worker starts
    with pytest.raises(ValueError, match="must be 3-30"):
        summa.matmul(a, b, precision="fp64-int8", moduli=2, comm=MPI.COMM_SELF)
    with ProcessGrid(MPI.COMM_SELF) as grid:
        A = DistMatrix.from_global(a, grid, get_backend("numpy"))
        B = DistMatrix.from_global(b, grid, get_backend("numpy"))
        with pytest.raises(ValueError, match="moduli applies to precision fp64-int8"):
            summa.gemm(A, B, moduli=15)
        with pytest.raises(ValueError, match="moduli applies to precision fp64-int8"):
            summa.matmul(A, B, device="numpy", moduli=15)


@pytest.mark.parametrize("rows", [10, 13, 37, 100])
def test_rows_in_chunks_are_the_whole_product_bit_for_bit(rng, ozaki_gpu, rows):
    """Scheme(rows=r): B's residues once, then A's and C's rows r at a time
    (a ragged last chunk, one chunk of all rows, r past m): every element
    the whole product's, into C with a pitch, alpha and beta applied, within
    the gauge; per chunk its residues, its INT8 products and one fold that
    ends it (the fused fold into a row slice of C)."""
    backend = fake_cupy_kernels.Backend()
    m, k, n = 37, 61, 23
    a, b = rng.uniform(-1, 1, (m, k)), rng.standard_normal((k, n))
    c0 = rng.uniform(-1, 1, (m, n))
    whole = rng.uniform(-1, 1, (m, n + 5))[:, :n]  # rows with a pitch
    whole[...] = c0
    ozaki_gpu.gemm(1.5, a, b, whole, beta=-0.5, backend=backend)
    names = ("residues", "fold", "fold_finish")
    before = {name: kernels.kernel(name).launches for name in names}
    gemms = backend.gemms
    c = np.zeros((m, n + 7))[:, :n]
    c[...] = c0
    ozaki_gpu.gemm(1.5, a, b, c, beta=-0.5, backend=backend,
                   scheme=ozaki_gpu.Scheme(planes=16, rows=rows))
    np.testing.assert_array_equal(c, whole)
    assert gemm_scaled_error(c, a, b, c0, alpha=1.5, beta=-0.5) <= 1
    chunks = -(-m // min(rows, m))
    assert backend.gemms - gemms == chunks * ozaki.default_moduli(ozaki.BITS, k)
    launched = {name: kernels.kernel(name).launches - before[name] for name in names}
    assert launched["residues"] == 1 + chunks and launched["fold_finish"] == chunks


def test_rows_in_chunks_of_a_c_with_columns_apart_and_of_complex_products(rng, ozaki_gpu):
    """Chunks of rows where C's rows are not contiguous (each chunk's sums
    through the finish pass) and in each real product of a complex one:
    the whole product's elements."""
    backend = fake_cupy_kernels.Backend()
    a, b = rng.uniform(-1, 1, (21, 30)), rng.standard_normal((30, 17))
    want = rng.uniform(-1, 1, (17, 21)).T  # C's columns contiguous, not its rows
    got = want.copy(order="F")
    ozaki_gpu.gemm(2.0, a, b, want, beta=-1.0, backend=backend)
    ozaki_gpu.gemm(2.0, a, b, got, beta=-1.0, backend=backend,
                   scheme=ozaki_gpu.Scheme(rows=8))
    np.testing.assert_array_equal(got, want)
    za = rng.uniform(-1, 1, (12, 33)) + 1j * rng.uniform(-1, 1, (12, 33))
    zb = rng.uniform(-1, 1, (33, 9)) + 1j * rng.uniform(-1, 1, (33, 9))
    whole, chunked = np.zeros((12, 9), dtype=complex), np.zeros((12, 9), dtype=complex)
    ozaki_gpu.gemm(2.0, za, zb, whole, backend=backend)
    gemms = backend.gemms
    ozaki_gpu.gemm(2.0, za, zb, chunked, backend=backend, scheme=ozaki_gpu.Scheme(rows=5))
    np.testing.assert_array_equal(chunked, whole)
    assert gemm_scaled_error(chunked, za, zb, alpha=2.0) <= 1
    assert backend.gemms - gemms == 4 * 3 * ozaki.default_moduli(ozaki.BITS, 33)  # 3 chunks


class _Allocations:
    """cupy.empty/zeros of the stand-in, counting the bytes they hold at
    once (an array's bytes are free when the last view of it goes)."""

    def __init__(self):
        self.live = self.peak = 0

    def _held(self, array):
        self.live += array.nbytes
        self.peak = max(self.peak, self.live)
        weakref.finalize(array, self._free, array.nbytes)
        return array

    def _free(self, nbytes):
        self.live -= nbytes

    def empty(self, shape, dtype=float):
        return self._held(np.empty(shape, dtype))

    def zeros(self, shape, dtype=float):
        return self._held(np.zeros(shape, dtype))


@pytest.mark.parametrize("rows,planes", [(None, 4), (40, 4), (64, 4), (100, 4), (None, 32),
                                         (40, 32), (16, 4), (4, 4)])
def test_a_products_scratch_is_what_scratch_bytes_counts_for_its_rows(rng, ozaki_gpu, monkeypatch,
                                                                      rows, planes):
    """What gemm holds at once beside its operands is scratch_bytes' count for
    the scheme's rows: B's planes and then a chunk's residues, products and
    sums (B transposed goes once B's residues are made), never all of C's;
    more planes a pass than moduli hold only the moduli's (and, one pass
    into a C of contiguous rows, no sums: counted all the same)."""
    backend = fake_cupy_kernels.Backend()
    m, k, n = 150, 64, 48  # 15 moduli, folded 4 a pass: the two sums are made
    a, b, c = rng.uniform(-1, 1, (m, k)), rng.uniform(-1, 1, (k, n)), np.empty((m, n))
    held = _Allocations()
    monkeypatch.setattr(sys.modules["cupy"], "empty", held.empty)
    monkeypatch.setattr(sys.modules["cupy"], "zeros", held.zeros)
    ozaki_gpu.gemm(1.0, a, b, c, backend=backend,
                   scheme=ozaki_gpu.Scheme(rows=rows, planes=planes))
    count = ozaki.default_moduli(ozaki.BITS, k)
    counted = ozaki_gpu.scratch_bytes(m, n, k, count, planes, rows=rows)
    sums = 16 * (rows or m) * n if planes >= count else 0
    assert counted - sums <= held.peak <= counted and held.live == 0
    if rows is not None and rows < m:
        assert counted < ozaki_gpu.scratch_bytes(m, n, k, count)
    assert gemm_scaled_error(c, a, b) <= 1


@pytest.fixture
def warmup(monkeypatch):
    use_fake_cupy(monkeypatch)
    from summa.precision import warmup
    return warmup


@pytest.mark.parametrize("dtype", ["float64", "complex128"])
def test_ready_makes_the_kernels_once_on_the_callers_gpu_before_its_products(warmup, dtype,
                                                                             monkeypatch):
    """ready() makes the kernels' module (one, whatever the shapes: no
    variants) before its small products, which then launch every kernel a
    product takes on the caller's GPU (the finish pass; complex: the parts
    and their join into C, the real products' own C contiguous); a second
    call does nothing."""
    cupy = sys.modules["cupy"]
    fake_cupy_kernels._RawModule.made.clear()
    devices, gemm = [], warmup.gemm

    def product(*args, **kwargs):
        devices.append((cupy.cuda.Device().id, len(fake_cupy_kernels._RawModule.made)))
        gemm(*args, **kwargs)
    monkeypatch.setattr(warmup, "gemm", product)
    with cupy.cuda.Device(3):
        assert warmup.ready(dtype, fake_cupy_kernels.Backend()) > 0
        assert warmup.ready(dtype, fake_cupy_kernels.Backend()) == 0
        launched = {name for name in ("finish", "fold_finish", "combine", "split")
                    if kernels.kernel(name).launches}
    assert devices and all(made == 1 for _, made in devices)
    assert {device for device, _ in devices} == {3}
    assert len(fake_cupy_kernels._RawModule.made) == 1
    assert launched == ({"fold_finish", "combine", "split"} if dtype == "complex128"
                        else {"finish", "fold_finish"})


def test_the_reductions_read_every_layout_by_its_strides(rng, ozaki_gpu):
    """The scaling's two reductions are two raw kernels for any shape and
    strides (CuPy's reductions compiled a variant each through CUB, 1-8 s a
    variant on a fresh H100): each layout gives NumPy's values, and a
    reduction along rows stored by rows takes the kernel whose threads lie
    along the outputs (reads that coalesce)."""
    for label, x, axis in reduction_cases(rng):
        largest, norm = expected_reductions(x, axis)
        got = kernels.kernel("amax")(x, axis=axis)
        assert np.array_equal(got, largest), label
        if axis is not None:
            scaled = kernels.kernel("norm")(x, got, axis=axis)
            finite = np.isfinite(largest)
            assert np.allclose(scaled[finite], norm[finite], rtol=1e-14), label
    launches = {name: kernels.kernel(name).launches for name in ("reduce_inner", "reduce_outer")}
    assert launches["reduce_outer"] > 0 and launches["reduce_inner"] > 0
    with pytest.raises(ValueError, match="along an axis"):
        kernels.kernel("norm")(x, largest, axis=None)
