"""fp64-int8 with K in panels (summa/precision/panel_sums.py) on a NumPy
stand-in for CuPy (tests/fake_cupy_kernels.py): the panels' INT8 products
summed and folded once are the whole product, the exponents agreed over the
grid are those of the whole rows and columns, and the panel sums are left
alike on every rank where one lacks the memory."""

from types import SimpleNamespace

import numpy as np
import pytest

import fake_cupy_kernels
from helpers import gemm_scaled_error, use_fake_cupy, within_two_ulps
from summa.precision import kernels, ozaki


@pytest.fixture
def panel_sums(monkeypatch):
    use_fake_cupy(monkeypatch)
    from summa.precision import panel_sums
    return panel_sums


def _whole_k_exponents(a, b):
    """The exponents one GPU takes for the whole product (as
    grid_exponents gives every rank of a grid)."""
    k = a.shape[1]
    cap_a, cap_b = ozaki.budgets(ozaki.default_moduli(ozaki.BITS, k), k)
    return (ozaki.scale(a, 1, ozaki.BITS, np, cap_a)[1].ravel(),
            ozaki.scale(b, 0, ozaki.BITS, np, cap_b)[1].ravel())


@pytest.mark.parametrize("widths", [[600], [200, 200, 200], [300, 299, 1], [16, 584],
                                    [1, 1, 598], [300, 0, 300]])
def test_panel_sums_fold_once_and_are_the_whole_product(rng, panel_sums, widths):
    """PanelSums given the exponents of all of K: the panels' INT8 products
    summed in int32 and folded once are gemm's own product of the whole
    (summa.precision.ozaki.gemm_int8), in any cut of K, alpha and beta applied; one
    fold pass per plane group for the whole product, not per panel, and
    one INT8 GEMM per modulus per (non-empty) panel."""
    backend = fake_cupy_kernels.Backend()
    a, b = rng.uniform(-1, 1, (37, 600)), rng.standard_normal((600, 23))
    c0 = rng.uniform(-1, 1, (37, 23))
    sums = panel_sums.PanelSums(37, 23, 600, _whole_k_exponents(a, b), backend)
    cuts = np.cumsum([0] + widths)
    for k0, k1 in zip(cuts, cuts[1:]):
        sums.add(a[:, k0:k1], b[k0:k1])
    c = c0.copy()
    sums.finish(2.0, c, beta=-0.5)
    want = ozaki.gemm_int8(a, b)
    assert gemm_scaled_error(want, a, b) <= 1 and within_two_ulps(c, 2.0 * want - 0.5 * c0)
    folds = sum(kernels.kernel(name).launches for name in ("fold", "fold_finish"))
    assert folds == -(-sums.count // kernels.PLANES)
    assert backend.gemms == sums.count * sum(1 for w in widths if w)


def test_panel_sums_refuse_panels_past_k_or_short_of_it(rng, panel_sums):
    """More terms than K, a finish before all of K came, or a K past an
    int32 sum: one clear error each, C untouched."""
    backend = fake_cupy_kernels.Backend()
    a, b = rng.uniform(-1, 1, (30, 40)), rng.uniform(-1, 1, (40, 12))
    sums = panel_sums.PanelSums(30, 12, 40, _whole_k_exponents(a, b), backend)
    sums.add(a[:, :20], b[:20])
    c = np.full((30, 12), 7.0)
    with pytest.raises(ValueError, match="panels of 20 of K = 40"):
        sums.finish(1.0, c)
    assert np.all(c == 7.0)
    with pytest.raises(ValueError, match="panels past K = 40"):
        sums.add(a, b)
    with pytest.raises(ValueError, match="an int32 sum holds"):
        panel_sums.PanelSums(2, 2, ozaki.K_EXACT + 1, (None, None), backend)


@pytest.mark.mpi(min_size=1)
def test_grid_exponents_are_those_of_the_whole_rows_and_columns(comm, rng, panel_sums):
    """Each rank holding K columns of A's rows and K rows of B's columns:
    the allreduced exponents are those one GPU takes for the whole of them
    (summa.precision.ozaki.scale's over all of K), on every rank; Inf on one rank is
    refused on all (inside checked_later: at its end)."""
    a, b = rng.uniform(-1, 1, (23, 70)), rng.standard_normal((70, 11))
    a[3] *= 1e-200  # a row of tiny values keeps its bits
    cols = np.array_split(np.arange(70), comm.size)[comm.rank]
    e, f = panel_sums.grid_exponents(a[:, cols], b[cols], comm, comm, 70)
    count = ozaki.default_moduli(ozaki.BITS, 70)
    cap_a, cap_b = ozaki.budgets(count, 70)
    assert np.array_equal(e, ozaki.scale(a, 1, ozaki.BITS, np, cap_a)[1].ravel())
    assert np.array_equal(f, ozaki.scale(b, 0, ozaki.BITS, np, cap_b)[1].ravel())
    bad = a.copy()
    bad[5, 69] = np.nan  # on the last rank's columns only
    from summa.precision import ozaki_gpu
    with ozaki_gpu.checked_later() as checks:
        panel_sums.grid_exponents(bad[:, cols], b[cols], comm, comm, 70)
    assert not checks.finite()


@pytest.mark.mpi(min_size=2)
def test_panel_sums_are_left_on_every_rank_where_one_lacks_the_memory(comm, monkeypatch):
    """fp64-int8 on a grid takes panel sums only where every rank's device
    holds them: one rank short, every rank multiplies panel by panel (the
    exponents are collective: no rank may start them alone), no hang; a
    sum of fewer than K_NATIVE terms stays native float64; and
    SUMMA_FP64_INT8_SUMS=0 turns them off in the planner (the products'
    module reads no options). A plan's "no" (call.sums False) is no
    whatever the room."""
    from summa.execution import steps
    from summa.planning import memorycheck
    from summa.device.backend import get_backend
    from summa.distribution.grid import ProcessGrid
    from summa.distribution.layout import panel_schedule
    from summa.distribution.matrix import DistMatrix
    grid = ProcessGrid(comm)
    backend = get_backend("numpy")
    A, B, C = (DistMatrix.zeros(shape, "float64", grid, backend)
               for shape in ((64, 96), (96, 48), (64, 48)))
    panels = panel_schedule(A.layout.cols, B.layout.rows, 32)
    free = 0 if comm.rank == comm.size - 1 else 1 << 50
    monkeypatch.setattr(type(backend), "memory_free", lambda self: free)
    assert steps._panel_sums(_call(A, B, C, "fp64-int8"), False, panels) is None
    # room for one rank's sums on every GPU, but two ranks share each: none
    monkeypatch.setattr(memorycheck, "ranks_on_device", lambda backend, comm: 2)
    free = 400 << 20  # one rank's tiny sums and the 256 MiB margin fit, two ranks' do not
    assert steps._panel_sums(_call(A, B, C, "fp64-int8"), False, panels) is None
    free = 1 << 50  # room everywhere, but a sum of fewer than K_NATIVE terms: native
    short_a, short_b = (DistMatrix.zeros(shape, "float64", grid, backend)
                        for shape in ((64, ozaki.K_NATIVE - 1), (ozaki.K_NATIVE - 1, 48)))
    short = panel_schedule(short_a.layout.cols, short_b.layout.rows, 32)
    assert steps._panel_sums(_call(short_a, short_b, C, "fp64-int8"), False, short) is None
    # the setting is the planner's: the executor takes the plan's word (call.sums)
    from summa.planning import precision
    from summa.precision.panel_sums import panel_sums_apply
    assert precision.panel_sums_apply("float64", comm.size, 96)
    monkeypatch.setenv("SUMMA_FP64_INT8_SUMS", "0")
    assert not precision.panel_sums_apply("float64", comm.size, 96)
    assert panel_sums_apply("float64", comm.size, 96, sums=True)
    assert steps._panel_sums(_call(A, B, C, "fp64-int8"), False, panels) is None
    assert steps._panel_sums(_call(A, B, C, None), False, panels) is None
    assert steps._panel_sums(_call(A, B, C, "fp64-int8", sums=False), False, panels) is None


def _call(A, B, C, precision, sums=None):
    """What :func:`summa.execution.steps._panel_sums` reads of a call."""
    return SimpleNamespace(A=A, B=B, C=C, precision=precision, lookahead=1, sums=sums,
                           scheme=None)
