"""The printed plan (summa.planning.report) says only what the machine has."""

import pytest

from summa.planning.plan import Machine
from summa.planning.planner import make_plan
from summa.planning.request import PlanRequest


@pytest.mark.parametrize("out_of_core", [False, True])
def test_a_plan_made_for_cpus_speaks_of_no_device(out_of_core):
    # (a CPU plan for Matmul(..., workers=2) spoke of "device 0.16 GiB" and a "device budget")
    text = str(make_plan((500, 300, 400), "float64", Machine("numpy", 2),
                         PlanRequest(out_of_core=out_of_core)))
    assert "device" not in text.replace("working tiles", ""), text
    assert ("working tiles budget 1.0 GiB" in text) == out_of_core
