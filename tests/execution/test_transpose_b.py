"""B's panels that lie by columns multiplied from row-major copies
(summa.execution.transpose.PanelsOfB, SUMMA_TRANSPOSE_B): the copies, the
policy, the plan's room for them, and the products of every layout of B
against a float64 reference, in memory and out of core."""

import io

import numpy as np
import pytest

from helpers import gemm_scaled_error
from summa import cli, options
from summa.device.backend import NumpyBackend
from summa.execution.transpose import PanelForms, PanelsOfA, PanelsOfB
from summa.planning.memory import Execution, memory_plan
from summa.planning.planner import Machine, make_plan
from summa.planning.request import PlanRequest
from summa.planning.tuning import transposes_b

from test_layouts import LAYOUTS, operand


def test_panels_of_b_are_copied_row_major_into_one_buffer_conjugated_there(rng):
    be = NumpyBackend()
    t = rng.standard_normal((9, 20)) + 1j * rng.standard_normal((9, 20))
    b = t.T  # (20 x 9), column-major: B lying by columns
    panels = PanelsOfB(be, 5, 9, np.complex128, transpose=True)
    assert panels.buffer.size == 45
    for k0, k1, conj in ((0, 5, False), (5, 8, True), (8, 13, False)):
        copy, still = panels(b[k0:k1], conj)
        np.testing.assert_array_equal(copy, b[k0:k1].conj() if conj else b[k0:k1])
        assert copy.flags.c_contiguous and np.shares_memory(copy, panels.buffer)
        assert still is False  # the copy carries the conjugation
    rows = np.ascontiguousarray(b[:5])  # already row-major: as it is, its conj left to the GEMM
    assert panels(rows, True) == (rows, True)
    untouched = b[:5]
    assert PanelsOfB(be, 5, 9, np.complex128, transpose=False)(untouched) == (untouched, False)


def test_panel_forms_give_each_gemm_its_operands_and_what_it_still_conjugates(rng):
    be = NumpyBackend()
    a = rng.standard_normal((7, 5)) + 0j
    b = (rng.standard_normal((6, 5)) + 1j * rng.standard_normal((6, 5))).T  # 5 x 6 by columns
    forms = PanelForms(PanelsOfA(be, 7, 5, np.complex128, True),
                       PanelsOfB(be, 5, 6, np.complex128, True))
    fa, fb, conj = forms(a, b, (True, True))
    np.testing.assert_array_equal(fa, a)
    assert fa.flags.f_contiguous  # A column-major: the GEMM conjugates it (op C)
    np.testing.assert_array_equal(fb, b.conj())
    assert conj == (True, False)
    assert PanelForms(PanelsOfA(be, 7, 5, np.complex128, False),
                      PanelsOfB(be, 5, 6, np.complex128, False))(a, b, (False, True)) \
        == (a, b, (False, True))


def test_policy_follows_the_setting_and_the_measurements():
    for dtype in ("complex128", "float32"):  # 3-7 % faster from row-major copies
        assert transposes_b("cupy", dtype, columns=True)
        assert not transposes_b("cupy", dtype)  # B by rows: nothing to copy
    for dtype in ("float64", "complex64"):  # within 1-4 % either way: left as is
        assert not transposes_b("cupy", dtype, columns=True)
    assert not transposes_b("cupy", "float32", "tf32", columns=True)  # unmeasured
    assert not transposes_b("numpy", "complex128", columns=True)
    assert not transposes_b("cupy", "complex128", "fp64-int8", columns=True)
    assert not transposes_b("cupy", "complex128", schedule="strips", columns=True)
    with options.set(gemm="cublaslt"):  # its plans copy column-major operands anyway
        assert not transposes_b("cupy", "complex128", columns=True)
    with options.set(transpose_b="yes"):
        assert transposes_b("numpy", "float32", columns=True)
        assert not transposes_b("numpy", "float32")
    with options.set(transpose_b="no"):
        assert not transposes_b("cupy", "complex128", columns=True)


def test_the_plan_holds_the_copy_where_b_lies_by_columns_on_one_rank_or_out_of_core():
    nb, item = 50, 16
    cols = Execution(lookahead=1, backend="cupy", storage=("rows", "cols"))
    rows = Execution(lookahead=1, backend="cupy")
    one = memory_plan(400, 100, 300, "complex128", (1, 1), nb, cols)
    assert one.transposed_b
    assert one.device_bytes - memory_plan(400, 100, 300, "complex128", (1, 1), nb,
                                          rows).device_bytes == nb * 100 * item
    # a grid's blocks are made C-ordered on their devices: nothing to copy
    grid = memory_plan(400, 100, 300, "complex128", (2, 1), nb, cols)
    assert not grid.transposed_b
    assert grid.device_bytes == memory_plan(400, 100, 300, "complex128", (2, 1), nb,
                                            rows).device_bytes
    ooc = memory_plan(300, 200, 100, "complex128", (1, 1), 10,
                      Execution(1, "cupy", device_budget=40_000, out_of_core=True,
                                storage=("cols", "cols")))
    (tm, tn), slots = ooc.tile, ooc.slots
    assert ooc.transposed_b and not ooc.transposed_a
    assert ooc.device_bytes == (ooc.c_buffers * tm * tn + slots * tm * 10
                                + (slots + 1) * tn * 10) * item <= 40_000


def test_the_plan_command_says_so(monkeypatch):
    plan = make_plan((4096,) * 3, "complex128", Machine("cupy", 1),
                     PlanRequest(device_memory="1GiB"), host_held=True, storage=("cols", "cols"))
    assert plan.memory.transposed_b
    from summa.planning.report import plan_lines
    text = "\n".join(plan_lines(plan))
    assert "B's panels, which lie by columns, are copied row-major" in text
    with options.set(transpose_b="no"):
        plain = make_plan((4096,) * 3, "complex128", Machine("cupy", 1),
                          PlanRequest(device_memory="1GiB"), host_held=True,
                          storage=("cols", "cols"))
    assert "copied row-major" not in "\n".join(plan_lines(plain))
    monkeypatch.setenv("SUMMA_TRANSPOSE_B", "sideways")  # a usage error: exit status 2
    with pytest.raises(cli.UsageError, match="SUMMA_TRANSPOSE_B='sideways' is not one of auto"):
        cli.main(["plan", "--size", "1024", "--ranks", "1"], out=io.StringIO())


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("how", ["in memory", "out of core"])
def test_every_layout_of_b_multiplies_through_the_copies(rng, layout, how):
    from mpi4py import MPI

    import summa
    dtype = "complex128" if layout in ("op H", "op H of F") or rng.uniform() < 0.5 \
        else "float64"
    m, n, k = (7, 1, 85) if layout == "column of one" else (37, 23, 29)
    a, ta, xa = operand(rng, (m, k), dtype, "F")
    b, tb, xb = operand(rng, (k, n), dtype, layout)
    before = b.copy()
    stats = summa.SummaStats()
    kwargs = {"out_of_core": True, "device_memory": "12KiB"} if how == "out of core" else {}
    with options.set(transpose_b="yes"):
        c = summa.matmul(a, b, comm=MPI.COMM_SELF, trans_a=ta, trans_b=tb, alpha=-0.5,
                         panel_width=5, backend="numpy", stats=stats, **kwargs)
    assert gemm_scaled_error(c, xa, xb, alpha=-0.5) <= 1
    assert np.array_equal(b, before)
    storage = stats.extra["plan"]["storage"][1]
    # (in memory one NumPy rank reads a strided B where it lies, by neither)
    copied = storage == "cols" or (storage == "strided cols" and how == "out of core")
    assert stats.extra["transposed_b"] == copied, storage


@pytest.mark.parametrize("planned_on, run_on", [("F", "C"), ("C", "F")])
def test_a_matmul_run_on_arrays_of_another_layout_plans_their_copies(rng, planned_on, run_on):
    """In memory on one rank, a Matmul planned for B of one layout and run on
    B of another copies B's panels as a plan for the arrays it runs on
    counts them (planning.planner.restore): none for B by rows, the copy
    for B by columns; products right."""
    from mpi4py import MPI

    import summa
    a = operand(rng, (37, 29), "complex128", "C")[0]
    with options.set(transpose_b="yes"):
        m = summa.Matmul(a, operand(rng, (29, 23), "complex128", planned_on)[0],
                         comm=MPI.COMM_SELF, backend="numpy", panel_width=5)
        assert m.plan.memory.transposed_b == (planned_on == "F")
        b, _, xb = operand(rng, (29, 23), "complex128", run_on)
        c = m.execute(a, b)
    assert gemm_scaled_error(c, a, xb) <= 1
    copied = run_on == "F"
    assert m.stats.extra["transposed_b"] is copied
    assert m.stats.extra["plan"]["memory"]["transposed_b"] is copied
    assert m.stats.extra["plan"]["storage"][1] == ("cols" if copied else "rows")
    assert m.plan.memory.transposed_b == (planned_on == "F")  # the Matmul's own plan kept


def test_a_plan_restored_for_another_layout_copies_only_where_it_fits():
    """restore: in memory the plan for the new layout where the devices
    hold it, else the old memory with the storage (run as it lies); out of
    core the cut and copies of a fresh plan for that layout at the same
    width and budget; the plan itself for its own layout."""
    from summa.planning.planner import restore
    with options.set(transpose_b="yes"):
        planned = make_plan((64, 48, 40), "complex128", Machine("cupy"),
                            PlanRequest(panel_width=8))
        room = planned.memory.device_bytes
        assert restore(planned, planned.storage) is planned
        roomy = restore(planned, ("rows", "cols"), Machine("cupy", free_device=2 * room))
        assert roomy.memory.transposed_b and roomy.memory.device_bytes > room
        tight = restore(planned, ("rows", "cols"), Machine("cupy", free_device=room))
        assert tight.memory == planned.memory and tight.storage == ("rows", "cols")
        assert restore(planned, ("rows", "cols")).memory == planned.memory  # nothing to ask
        # ("auto" on a grid, measured when the run starts: the memory at the default width)
        grid = Machine("cupy", ranks=2)
        auto = make_plan((64, 48, 40), "complex128", grid, PlanRequest(panel_width="auto"))
        assert auto.panel_width == "auto"
        assert restore(auto, ("rows", "cols"), grid).memory == auto.memory  # blocks by rows
        ooc = make_plan((3000, 200, 400), "float64", Machine("numpy"),
                        PlanRequest(out_of_core=True, device_memory="1MiB", panel_width=64))
        fresh = make_plan((3000, 200, 400), "float64", Machine("numpy"),
                          PlanRequest(out_of_core=True, device_memory="1MiB", panel_width=64),
                          storage=("cols", "cols"))
        assert fresh.memory.tiles != ooc.memory.tiles  # (else this shows nothing)
        assert restore(ooc, ("cols", "cols")).memory == fresh.memory


def test_the_low_level_call_copies_as_it_is_told(rng):
    """summa()'s `copies` (a plan's decision) overrides the setting both ways;
    B's copy is made only where B lies by columns; a malformed one is refused."""
    from mpi4py import MPI

    from summa.distribution.grid import ProcessGrid
    from summa.distribution.layout import Layout
    from summa.distribution.matrix import DistMatrix
    from summa.execution.algorithm import summa
    be = NumpyBackend()
    a = rng.standard_normal((13, 17))
    with ProcessGrid(MPI.COMM_SELF) as grid:
        for b, told, setting, made in ((rng.standard_normal((11, 17)).T, None, "yes", True),
                                       (rng.standard_normal((11, 17)).T, (0, 0), "yes", False),
                                       (rng.standard_normal((11, 17)).T, (0, 1), "no", True),
                                       (rng.standard_normal((17, 11)), (1, 1), "yes", False)):
            C = DistMatrix(grid, Layout((13, 11), (1, 1)), np.empty((13, 11)), be)
            A = DistMatrix(grid, Layout((13, 17), (1, 1)), a, be)
            B = DistMatrix(grid, Layout((17, 11), (1, 1)), b, be)
            with options.set(transpose_b=setting):
                stats = summa(1.0, A, B, 0.0, C, panel_width=5, copies=told)
            assert stats.extra["transposed_b"] is made, (told, setting)
            assert stats.extra["transposed_a"] is (told is not None and bool(told[0]))
            assert gemm_scaled_error(C.local, a, b) <= 1
        with pytest.raises(ValueError, match="copies must be"):
            summa(1.0, A, B, 0.0, C, copies=(True,))
