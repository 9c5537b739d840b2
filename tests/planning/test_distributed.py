"""The Plan of summa on DistMatrix operands: auto's choice of direct copies
(ipc) is the planner's, made on the operands' blocks and carried by the
Plan, never the executor's."""

import contextlib
from dataclasses import replace

import numpy as np
import pytest

import summa.execution.algorithm as algorithm
import summa.planning.distributed as distributed
import summa.planning.selection as selection
from helpers import gemm_scaled_error, random_array
from summa.distribution.grid import ProcessGrid
from summa.distribution.matrix import DistMatrix
from summa.execution.algorithm import prepare, run_in_memory
from summa.planning.distributed import plan_distributed, settled_plan
from summa.planning.request import PlanRequest


class _GpuStandIn:
    """A backend the planner takes for a GPU with direct copies
    (``is_gpu``, ``supports_ipc``, CuPy's name), over NumPy blocks: what
    ``auto``'s choice reads, and nothing the planner runs on a device."""

    name, is_gpu, supports_ipc, device = "cupy", True, True, 0

    def on_device(self):
        return contextlib.nullcontext()


def _operands(grid, backend, shape=(24, 20, 32)):
    """DistMatrix A, B and C (zeros) of `shape` ``(m, n, k)`` on `backend`."""
    m, n, k = shape
    made = []
    for rows, cols in ((m, k), (k, n), (m, n)):
        X = DistMatrix.zeros((rows, cols), "float64", grid)
        made.append(DistMatrix(grid, X.layout, X.local, backend))
    return made


def _refuse(*args, **kwargs):
    raise AssertionError("the executor decided whether direct copies pay")


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("stay_open, hides, copies", [(True, False, True), (False, True, True),
                                                      (False, False, False)])
def test_the_planner_settles_auto_s_direct_copies_on_the_operands(
        comm, monkeypatch, stay_open, hides, copies):
    """On GPUs of a grid whose rows or columns lie within a node, ``auto``
    copies directly where the peers' blocks stay open or opening them hides
    behind a rank's own GEMMs: plan_distributed decides it (collectively) on
    the operands' blocks and the Plan carries it, its text says it; a Plan
    made without the operands has it settled by settled_plan."""
    asked = []
    monkeypatch.setattr(selection, "_stay_open",
                        lambda grid, backend, blocks, dirs: asked.append("open") or stay_open)
    monkeypatch.setattr(selection, "_hides_connect",
                        lambda *args: asked.append("hide") or hides)
    with ProcessGrid(comm) as grid:
        A, B, C = _operands(grid, _GpuStandIn())
        plan, _ = plan_distributed(A, B, C, PlanRequest(panel_width=8))
        assert plan.copy_engines is copies
        assert asked == (["open"] if stay_open else ["open", "hide"])
        said = "direct copies between" if copies else "no direct copies"
        assert f"broadcaster auto ({said}" in str(plan)
        asked.clear()
        settled, measured = settled_plan(replace(plan, copy_engines=None), A, B, C)
        assert settled == plan and not measured and asked
        asked.clear()
        assert settled_plan(plan, A, B, C)[0] is plan and not asked  # settled already
        nccl, _ = plan_distributed(A, B, C, PlanRequest(panel_width=8, broadcaster="nccl"))
    # another kind asks nothing: auto's choice is not made for it
    assert nccl.copy_engines is True and not asked and "nccl (" not in str(nccl)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("copies", [True, False])
def test_the_run_builds_the_broadcasters_the_plan_names(comm, backend, rng, monkeypatch,
                                                        copies):
    """run_in_memory and prepare take auto's choice of direct copies from
    the Plan as it is: the broadcasters are made with the plan's
    copy_engines, and nothing of the choice is asked again while the plan
    runs; a plan that has not settled it is refused."""
    made = []
    real = algorithm.grid_broadcasters
    monkeypatch.setattr(algorithm, "grid_broadcasters", lambda grid, kind, be, copy_engines:
                        made.append((kind, copy_engines)) or real(grid, kind, be, copy_engines))
    a, b = random_array(rng, (20, 30), "float64"), random_array(rng, (30, 10), "float64")
    with ProcessGrid(comm) as grid:
        A, B = (DistMatrix.from_global(x, grid, backend) for x in (a, b))
        C = DistMatrix.zeros((20, 10), "float64", grid, backend)
        plan, _ = plan_distributed(A, B, C, PlanRequest(panel_width=4))
        plan = replace(plan, copy_engines=copies)
        for name in ("_stay_open", "_hides_connect", "direct_copies_pay"):
            monkeypatch.setattr(selection, name, _refuse)
        monkeypatch.setattr(distributed, "direct_copies_pay", _refuse)
        prepare(plan, A, B, C)
        run_in_memory(plan, A, B, C)
        with pytest.raises(ValueError, match="copy_engines"):
            run_in_memory(replace(plan, copy_engines=None), A, B, C)
        c = C.gather()
    assert made == [("auto", copies)] * 2
    if comm.rank == 0:
        assert gemm_scaled_error(c, a, b) <= 1


def test_a_plan_without_operands_leaves_the_choice_to_settle():
    """make_plan's plans (arrays, files, the benchmark) are made before the
    operands' blocks exist: their copy_engines is None until settled, and
    their text says nothing of it."""
    from summa.planning import Machine, make_plan
    plan = make_plan((64, 64, 64), np.float64, Machine(backend="cupy", ranks=2),
                     PlanRequest(grid=(2, 1)))
    assert plan.copy_engines is None
    assert "broadcaster auto," in str(plan)
