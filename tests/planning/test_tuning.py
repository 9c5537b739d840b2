"""Panel-width choice: defaults, and 'auto' measured once, agreed by all ranks."""

import numpy as np
import pytest

import summa.planning.tuning as tuning
from helpers import gemm_scaled_error, marking_run
import summa.execution.algorithm as algorithm
import summa.execution.arrays as arrays
from summa.execution.algorithm import SummaStats, gemm, summa
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


def _measured_in_planning_only(monkeypatch) -> list:
    """Count the measurements of a panel width, and fail any that the
    in-memory executor (``run_in_memory``, as the entry points call it) makes."""
    monkeypatch.setattr(tuning, "_cache", {})
    calls, running = [], []
    measure, run = tuning.auto_panel_width, algorithm.run_in_memory

    def counted(*args, **kwargs):
        if running:
            raise AssertionError("the executor measured a panel width")
        calls.append(1)
        return measure(*args, **kwargs)

    monkeypatch.setattr(tuning, "auto_panel_width", counted)
    executing = marking_run(run, running)
    monkeypatch.setattr(algorithm, "run_in_memory", executing)
    monkeypatch.setattr(arrays, "run_in_memory", executing)
    return calls


@pytest.mark.mpi(min_size=1)
def test_auto_is_measured_by_the_planner_never_by_the_executor(comm, backend, monkeypatch):
    """An "auto" width is settled before the run, once per problem: a
    DistMatrix summa's by plan_distributed, matmul's (a Plan made without
    the operands) by settled_plan; the executor takes an integer."""
    calls = _measured_in_planning_only(monkeypatch)
    several = comm.Get_size() > 1
    with ProcessGrid(comm) as grid:
        A = DistMatrix.random((60, 90), "float64", grid, backend, seed=1)
        B = DistMatrix.random((90, 50), "float64", grid, backend, seed=2)
        C = DistMatrix.zeros((60, 50), "float64", grid, backend)
        stats = summa(1.0, A, B, 0.0, C, panel_width="auto")
        a, b, c = A.gather(), B.gather(), C.gather()
    assert len(calls) == (1 if several else 0)
    assert stats.extra["panel_width_measured"] is several
    assert len(set(comm.allgather(stats.panel_width))) == 1
    if comm.rank == 0:
        assert gemm_scaled_error(c, a, b) <= 1
    # matmul on arrays: its Plan names "auto"; settled on the operands, before the run
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal((70, 80)), rng.standard_normal((80, 40))
    stats = SummaStats()
    z = matmul(x, y, panel_width="auto", stats=stats)
    assert len(calls) == (2 if several else 0)
    assert stats.extra["panel_width_measured"] is several
    assert stats.extra["plan"]["panel_width"] == ("auto" if several else stats.panel_width)
    if comm.rank == 0:
        assert gemm_scaled_error(z, x, y) <= 1
    # out of core (as one GPU takes host arrays) the plan's width: none measured, and said
    stats = SummaStats()
    matmul(x, y, panel_width="auto", stats=stats, out_of_core=True, device_memory="64KiB")
    assert len(calls) == (2 if several else 0)
    assert stats.extra["panel_width_measured"] is False


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
