"""The Plan of arrays held on one rank: settled on the grid's blocks (an
"auto" width, auto's direct copies) by the planner before the executor runs."""

import numpy as np
import pytest

import summa.execution.arrays as arrays
import summa.planning.arrays as planning_arrays
import summa.planning.distributed as distributed
import summa.planning.tuning as tuning
from helpers import gemm_scaled_error, marking_run
from summa.api.multiply import matmul
from summa.distribution.grid import ProcessGrid
from summa.distribution.matrix import DistMatrix
from summa.execution.algorithm import SummaStats
from summa.planning import Machine, make_plan
from summa.planning.request import PlanRequest


@pytest.mark.mpi(min_size=1)
def test_matmul_settles_its_plan_before_the_executor_runs(comm, monkeypatch):
    """matmul's Plan names "auto" (made without the operands): its width is
    measured and auto's direct copies decided by the planner
    (settled_on_grid), never inside the executor (execute); the stats
    record the plan as made and whether the width was measured."""
    monkeypatch.setattr(tuning, "_cache", {})
    asked, running = [], []
    measure, decide, run = (tuning.auto_panel_width, distributed.direct_copies_pay,
                            arrays.execute)

    def planner(real, what):
        def asking(*args, **kwargs):
            assert not running, f"the executor {what}"
            asked.append(what)
            return real(*args, **kwargs)
        return asking

    monkeypatch.setattr(tuning, "auto_panel_width", planner(measure, "measured a width"))
    monkeypatch.setattr(distributed, "direct_copies_pay", planner(decide, "decided copies"))
    monkeypatch.setattr(arrays, "execute", marking_run(run, running))
    rng = np.random.default_rng(5)
    x, y = rng.standard_normal((70, 80)), rng.standard_normal((80, 40))
    stats = SummaStats()
    z = matmul(x, y, panel_width="auto", stats=stats)
    # (on one GPU host arrays go through the out-of-core sweep, whose plan
    # settles its width and broadcasts with its memory: nothing is left to ask)
    in_memory = not stats.extra["plan"]["out_of_core"]
    several = comm.Get_size() > 1 and in_memory
    assert asked == ["measured a width"] * several + ["decided copies"] * in_memory
    assert stats.extra["panel_width_measured"] is several
    assert stats.extra["plan"]["panel_width"] == ("auto" if several else stats.panel_width)
    if comm.rank == 0:
        assert gemm_scaled_error(z, x, y) <= 1


@pytest.mark.mpi(min_size=1)
def test_the_blocks_settled_on_are_those_the_executor_scatters(comm, backend, monkeypatch):
    """settled_on_grid reads the blocks the in-memory executor will make
    (their layouts, shapes and bytes), so auto decides as it did on the
    scattered operands."""
    seen = []
    monkeypatch.setattr(planning_arrays, "settled_plan",
                        lambda plan, *operands: seen.append(operands) or (plan, False))
    (m, n, k), dtype = (37, 23, 41), "float32"
    plan = make_plan((m, n, k), dtype, Machine(ranks=comm.Get_size()),
                     PlanRequest(panel_width="auto"), host_held=True)
    with ProcessGrid(comm, plan.grid) as grid:
        assert planning_arrays.settled_on_grid(plan, grid, backend) == (plan, False)
        made = [DistMatrix.from_global(np.zeros(shape, dtype) if comm.rank == 0 else None,
                                       grid, backend) for shape in ((m, k), (k, n), (m, n))]
    (described,) = seen
    for laid, real in zip(described, made):
        assert laid.layout == real.layout and laid.shape == real.shape
        assert laid.local.shape == real.local.shape and laid.local.nbytes == real.local.nbytes
        assert laid.dtype == real.dtype and laid.grid is grid and laid.backend is backend
    out_of_core = make_plan((m, n, k), dtype, Machine(ranks=comm.Get_size()),
                            PlanRequest(panel_width="auto", out_of_core=True), host_held=True)
    with ProcessGrid(comm, plan.grid) as grid:
        assert planning_arrays.settled_on_grid(out_of_core, grid, backend) == (out_of_core,
                                                                              False)
    assert len(seen) == 1  # out of core settles nothing here (its sweep's planner does)
