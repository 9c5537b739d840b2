"""Panel-width choice: defaults, and 'auto' measured once, agreed by all ranks."""

import numpy as np
import pytest

import summa.planning.tuning as tuning
from helpers import gemm_scaled_error
from summa.execution.algorithm import SummaStats, gemm
from summa.api.multiply import matmul
from summa.distribution.grid import ProcessGrid
from summa.distribution.matrix import DistMatrix


def test_defaults():
    assert tuning.default_panel_width("numpy", np.float64) == 256
    assert tuning.default_panel_width("cupy", np.float64) == 4096
    assert tuning.default_panel_width("cupy", np.float32, "tf32") == 8192
    assert tuning.default_panel_width("cupy", np.float16) == 8192
    assert tuning.default_panel_width("cupy", np.float32) == 8192
    assert tuning.default_panel_width("cupy", np.float32, out_of_core=True) == 4096
    # float64 on INT8: each product reconstructs its C block, so wide panels
    assert tuning.default_panel_width("cupy", np.float64, "fp64-int8") == 16384
    assert tuning.default_panel_width("cupy", np.float64, "fp64-int8", out_of_core=True) == 16384


@pytest.mark.mpi(min_size=1)
def test_auto_is_measured_once_agreed_and_correct(comm, backend, monkeypatch):
    monkeypatch.setattr(tuning, "_cache", {})
    with ProcessGrid(comm) as grid:
        A = DistMatrix.random((300, 700), "float64", grid, backend, seed=1)
        B = DistMatrix.random((700, 200), "float64", grid, backend, seed=2)
        first, second = SummaStats(), SummaStats()
        C = gemm(A, B, panel_width="auto", stats=first)
        gemm(A, B, panel_width="auto", stats=second)
        a, b, c = A.gather(), B.gather(), C.gather()
    widths = comm.allgather(first.panel_width)
    assert len(set(widths)) == 1
    if comm.Get_size() > 1:
        assert first.panel_width in tuning.CANDIDATE_WIDTHS and first.panel_width <= 700
        assert first.extra["panel_width_measured"] is True
        assert second.extra["panel_width_measured"] is False
        assert second.panel_width == first.panel_width
    if comm.rank == 0:
        assert gemm_scaled_error(c, a, b) <= 1


@pytest.mark.mpi(min_size=1)
def test_auto_prefers_the_narrowest_width_near_the_best_rate(comm, backend, monkeypatch):
    """With every width equally fast per unit of K, the narrowest one wins."""
    monkeypatch.setattr(tuning, "_cache", {})
    monkeypatch.setattr(tuning.time, "perf_counter", iter(range(10**6)).__next__)
    with ProcessGrid(comm) as grid:
        if grid.size == 1:
            pytest.skip("one rank never measures")
        A = DistMatrix.random((64, 5000), "float32", grid, backend, seed=1)
        B = DistMatrix.random((5000, 64), "float32", grid, backend, seed=2)
        C = DistMatrix.zeros((64, 64), "float32", grid, backend)
        width, measured = tuning.auto_panel_width(A, B, C)
    # the fake clock advances by 1 per call: each width takes "1 s", so the
    # widest is fastest per unit of K
    assert measured and width == 4096


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("bad", [0, -3, 2.5, "wide"])
def test_bad_panel_widths(comm, backend, bad):
    with ProcessGrid(comm) as grid:
        A = DistMatrix.random((8, 8), "float64", grid, backend, seed=1)
        with pytest.raises(ValueError, match="panel width"):
            matmul(A, A, panel_width=bad)
