"""A device budget no out-of-core plan can take is refused before the
backend starts, and the floor never refuses what the planner plans."""

import io

import numpy as np
import pytest

from summa import cli
from summa.api import fileplan, files as files_module
from summa.planning import arrays as planning_arrays
from summa.cli import bench
from summa.planning.least import check_least_budget, least_budget
from summa.planning.plan import Machine
from summa.planning.planner import make_plan
from summa.planning.request import PlanRequest
from test_multiply import save


@pytest.mark.parametrize("backend", ["numpy", "cupy"])
@pytest.mark.parametrize("shape,width", [((96, 96, 96), None), ((300, 200, 700), None),
                                         ((64, 2000, 5000), 64), ((5, 7, 3), None)])
def test_the_floor_never_refuses_a_budget_the_planner_plans(backend, shape, width):
    planned = 0
    for budget in sorted({int(1.5 ** e) for e in range(50)}):
        try:
            make_plan(shape, "float64", Machine(backend),
                      PlanRequest(out_of_core=True, device_memory=budget, panel_width=width))
        except ValueError:
            continue
        planned += 1
        # raises where the floor is too high
        check_least_budget(shape, 8, PlanRequest(device_memory=budget, panel_width=width))
    assert planned, "some budget of the range is planned"
    assert least_budget(shape[2], 8, width)[0] > 1


@pytest.mark.parametrize("asked", [dict(out_of_core=False), dict(schedule="strips"),
                                   dict(device_memory=None)])
def test_the_floor_applies_only_where_the_budget_does(asked):
    check_least_budget((96, 96, 96), 8, PlanRequest(**{"device_memory": "1B", **asked}))
    with pytest.raises(ValueError, match="too small for any out-of-core tile"):
        check_least_budget((96, 96, 96), 8, PlanRequest(device_memory="1B"))


def _no_backend(*args, **kwargs):
    raise AssertionError("the backend was started before the budget was refused")


def test_bench_refuses_a_one_byte_budget_before_the_backend_starts(comm, monkeypatch):
    monkeypatch.setattr(bench, "agree_backend", _no_backend)
    with pytest.raises(cli.UsageError, match=r"a device budget of 1 byte is too small for any "
                                             r"out-of-core tile: the least .* takes 1.5 KiB"):
        cli.main(["bench", "--size", "96", "--device-memory", "1B"], comm, io.StringIO())


def test_matmul_refuses_a_one_byte_budget_before_the_backend_starts(monkeypatch):
    import summa
    monkeypatch.setattr(planning_arrays, "get_backend", _no_backend)
    with pytest.raises(ValueError, match="a device budget of 1 byte is too small for any"):
        summa.matmul(np.ones((300, 300)), np.ones((300, 300)), device_memory="1B")


@pytest.mark.mpi(min_size=1)
def test_multiply_refuses_a_one_byte_budget_before_the_backend_starts(comm, folder, monkeypatch):
    pa, pb = save(comm, folder, "A.npy", np.ones((40, 30))), save(comm, folder, "B.npy",
                                                                  np.ones((30, 20)))
    monkeypatch.setattr(fileplan, "get_backend", _no_backend)
    with pytest.raises(ValueError, match="a device budget of 1 byte is too small for any"):
        files_module.multiply_files(pa, pb, str(folder / "C.npy"), comm, quiet=True,
                                    device_memory="1B")

