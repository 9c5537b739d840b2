"""A's panels multiplied from transposed copies (summa.execution.transpose,
SUMMA_TRANSPOSE_A): the GEMM operand layouts, the policy, the plan, and the
products against a float64 reference on every grid."""

import io

import numpy as np
import pytest

from helpers import (GEMM_SHAPES, check_against_reference, gemm_scaled_error,
                     random_array)
from summa import cli
from summa.execution.algorithm import SummaStats, gemm
from summa.device.backend import NumpyBackend, get_backend
from summa.device.cupy_backend import _operand
from summa.distribution.grid import ProcessGrid
from summa.distribution.matrix import DistMatrix
from summa.planning.memory import Execution, memory_plan
from summa.execution.transpose import PanelsOfA
from summa.planning.tuning import transposes_a

#: Each test's subject is the process grid's shape: ./run test runs them on every
#: rank count (the others on a few: pyproject.toml's markers).
pytestmark = pytest.mark.grid


def test_operands_are_read_in_place_row_or_column_major():
    x = np.arange(60.0).reshape(6, 10)
    view, ld, transposed = _operand(np, x[:, 2:7])  # a panel of columns: row-strided
    assert (ld, transposed) == (10, False) and np.shares_memory(view, x)
    view, ld, transposed = _operand(np, x.T)  # column-major: cuBLAS's transposed operand
    assert (ld, transposed) == (10, True) and np.shares_memory(view, x)
    view, ld, transposed = _operand(np, x.T[1:4])  # rows of a column-major matrix
    assert (ld, transposed) == (10, True) and view.shape == (3, 6)
    view, ld, transposed = _operand(np, x.T, transposable=False)  # cuBLASLt: copied
    assert (ld, transposed) == (6, False) and view.flags.c_contiguous
    np.testing.assert_array_equal(view, x.T)
    view, ld, transposed = _operand(np, x[::2, ::3])  # neither: copied to C order
    assert (ld, transposed) == (4, False) and not np.shares_memory(view, x)
    np.testing.assert_array_equal(view, x[::2, ::3])


def test_panels_of_a_are_copied_transposed_into_one_buffer():
    be = NumpyBackend()
    a = np.random.default_rng(0).uniform(-1, 1, (7, 20))
    panels = PanelsOfA(be, 7, 5, np.float64, transpose=True)
    for k0, k1 in ((0, 5), (5, 8), (8, 13)):
        t = panels(a[:, k0:k1])
        np.testing.assert_array_equal(t, a[:, k0:k1])
        assert t.flags.f_contiguous and np.shares_memory(t, panels.buffer)
    untouched = a[:, :5]
    assert PanelsOfA(be, 7, 5, np.float64, transpose=False)(untouched) is untouched
    assert panels.buffer.size == 35


def test_policy_follows_the_setting_and_the_measurements(monkeypatch):
    monkeypatch.delenv("SUMMA_TRANSPOSE_A", raising=False)
    assert transposes_a("cupy", "float64") and transposes_a("cupy", np.float32)
    assert not transposes_a("cupy", "float32", "tf32")  # not measured faster
    assert not transposes_a("cupy", "float16") and not transposes_a("numpy", "float64")
    assert not transposes_a("cupy", "float64", schedule="strips")
    monkeypatch.setenv("SUMMA_TRANSPOSE_A", "YES")
    assert transposes_a("numpy", "complex64") and transposes_a("cupy", "float16")
    assert not transposes_a("numpy", "float64", schedule="strips")
    monkeypatch.setenv("SUMMA_GEMM", "cublaslt")  # its plans take row-major operands
    assert not transposes_a("cupy", "float64") and transposes_a("numpy", "float64")
    monkeypatch.delenv("SUMMA_GEMM")
    monkeypatch.setenv("SUMMA_TRANSPOSE_A", "no")
    assert not transposes_a("cupy", "float64")
    monkeypatch.setenv("SUMMA_TRANSPOSE_A", "sometimes")
    with pytest.raises(ValueError, match="SUMMA_TRANSPOSE_A='sometimes' is not one of auto"):
        get_backend("numpy")


def test_the_plan_holds_the_transposed_panel(monkeypatch):
    monkeypatch.setenv("SUMMA_TRANSPOSE_A", "auto")
    blocks = (200 * 300 + 150 * 100 + 200 * 100) * 8
    base = memory_plan(400, 100, 300, "float64", (2, 1), 50, Execution(lookahead=1))
    assert base.device_bytes == blocks + 2 * 50 * 100 * 8 + 50 * 200 * 8  # + nb x ml
    tf32 = memory_plan(400, 100, 300, "float32", (2, 1), 50,
                       Execution(lookahead=1, precision="tf32"))
    assert tf32.device_bytes == (blocks + 2 * 50 * 100 * 8) // 2
    strips = memory_plan(400, 100, 300, "float64", (2, 1), 50,
                         Execution(lookahead=1, schedule="strips"))
    assert strips.device_bytes == blocks + 2 * 300 * 50 * 8
    one = memory_plan(400, 100, 300, "float64", (1, 1), 50,
                      Execution(schedule="strips"))  # panels there
    assert one.device_bytes == (400 * 300 + 300 * 100 + 400 * 100 + 50 * 400) * 8
    monkeypatch.setenv("SUMMA_TRANSPOSE_A", "no")
    assert memory_plan(400, 100, 300, "float64", (2, 1), 50).device_bytes \
        == blocks + 2 * 50 * 100 * 8


def test_plan_command_counts_it_and_refuses_a_bad_setting(monkeypatch):
    monkeypatch.setenv("SUMMA_TRANSPOSE_A", "no")
    out = io.StringIO()
    assert cli.main(["plan", "--size", "32768", "--ranks", "2", "--grid", "2x1"], out=out) == 0
    without = out.getvalue()
    monkeypatch.setenv("SUMMA_TRANSPOSE_A", "auto")
    out = io.StringIO()
    assert cli.main(["plan", "--size", "32768", "--ranks", "2", "--grid", "2x1"], out=out) == 0
    assert "14.50 GiB" in out.getvalue() and "14.00 GiB" in without
    assert "copied transposed" in out.getvalue() and "copied transposed" not in without
    monkeypatch.setenv("SUMMA_TRANSPOSE_A", "1")  # a usage error: exit status 2
    with pytest.raises(cli.UsageError, match="SUMMA_TRANSPOSE_A='1' is not one of auto, yes"):
        cli.main(["plan", "--size", "1024", "--ranks", "1"], out=io.StringIO())


def test_bench_refuses_a_bad_setting(monkeypatch):
    monkeypatch.setenv("SUMMA_TRANSPOSE_A", "on")
    with pytest.raises(cli.UsageError, match="SUMMA_TRANSPOSE_A='on' is not one of"):
        cli.main(["bench", "--size", "64", "--backend", "numpy"], out=io.StringIO())


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("shape", GEMM_SHAPES)
@pytest.mark.parametrize("block", [None, (3, 3)])
def test_transposed_panels_match_the_reference(comm, backend, rng, monkeypatch, shape, block):
    monkeypatch.setenv("SUMMA_TRANSPOSE_A", "yes")
    with ProcessGrid(comm) as grid:
        runs = check_against_reference(rng, grid, backend, shape, block, panel_width=4)
    assert all(stats.extra["transposed_a"] for stats in runs)


@pytest.mark.mpi(min_size=1)
def test_transposed_panels_on_one_rank_go_panel_by_panel(comm, backend, monkeypatch):
    # One rank runs a single GEMM over all of K, unless A's panels are transposed:
    # then each panel is (a whole transposed A would take an A's room).
    with ProcessGrid(comm.Split(comm.rank, 0) if comm.Get_size() > 1 else comm) as grid:
        A = DistMatrix.random((30, 50), "float64", grid, backend, seed=3)
        B = DistMatrix.random((50, 20), "float64", grid, backend, seed=4)
        runs = {}
        for setting in ("no", "yes"):
            monkeypatch.setenv("SUMMA_TRANSPOSE_A", setting)
            C = DistMatrix.zeros((30, 20), "float64", grid, backend)
            stats = SummaStats()
            gemm(A, B, C, panel_width=16, stats=stats)
            runs[setting] = (stats.panels, C.gather())
        assert runs["no"][0] == 1 and runs["yes"][0] == 4
        np.testing.assert_allclose(runs["yes"][1], runs["no"][1], rtol=1e-12, atol=1e-12)


def test_out_of_core_plans_a_transposed_part(monkeypatch):
    monkeypatch.setenv("SUMMA_TRANSPOSE_A", "yes")
    plan = memory_plan(300, 200, 100, "float64", (1, 1), 10,
                       Execution(1, "numpy", device_budget=20_000, out_of_core=True))
    (tm, tn), slots = plan.tile, plan.slots
    assert plan.device_bytes == (plan.c_buffers * tm * tn + (slots + 1) * tm * 10
                                 + slots * tn * 10) * 8
    assert plan.device_bytes <= 20_000
    monkeypatch.setenv("SUMMA_TRANSPOSE_A", "no")
    plain = memory_plan(300, 200, 100, "float64", (1, 1), 10,
                        Execution(1, "numpy", device_budget=20_000, out_of_core=True))
    assert plain.tile[0] * plain.tile[1] >= tm * tn  # the copy takes room from the tiles


@pytest.mark.mpi(min_size=2)
def test_transposed_panels_with_lookahead_and_strips(comm, backend, rng, monkeypatch):
    monkeypatch.setenv("SUMMA_TRANSPOSE_A", "yes")
    a, b = random_array(rng, (33, 40), "float64"), random_array(rng, (40, 17), "float64")
    with ProcessGrid(comm, (comm.Get_size(), 1)) as grid:
        for lookahead, schedule in ((0, "panels"), (2, "panels"), (1, "strips")):
            A = DistMatrix.from_global(a, grid, backend)
            B = DistMatrix.from_global(b, grid, backend)
            C = DistMatrix.zeros((33, 17), "float64", grid, backend)
            stats = SummaStats()
            gemm(A, B, C, panel_width=6, lookahead=lookahead, schedule=schedule, stats=stats)
            c = C.gather()
            assert stats.extra["transposed_a"] == (schedule == "panels")  # strips: A as it is
            if comm.rank == 0:
                assert gemm_scaled_error(c, a, b) <= 1, (lookahead, schedule)


@pytest.mark.parametrize("command", [["plan", "--size", "64"], ["bench", "--size", "64"],
                                     ["info"]])
def test_a_bad_setting_is_one_message_and_exit_2(command):
    from test_cli import job
    p = job(2, *command, env={"SUMMA_TRANSPOSE_A": "sideways"})
    assert p.returncode == 2, p.stderr
    assert p.stderr.count("SUMMA_TRANSPOSE_A='sideways' is not one of auto, yes, no") == 1
    assert "Traceback" not in p.stderr


def test_ideal_times_the_column_major_gemm_too():
    from summa.cli.ideal import single_device_seconds
    best, row_major = single_device_seconds(NumpyBackend(), (64, 48, 80), np.dtype("float64"),
                                             None, repeat=2, transposed_a=True)
    assert 0 < best <= row_major
    plain, same = single_device_seconds(NumpyBackend(), (64, 48, 80), np.dtype("float64"),
                                         None, repeat=2)
    assert plain == same > 0
    assert single_device_seconds(NumpyBackend(), (0, 48, 80), np.dtype("float64"), None) \
        == (0.0, 0.0)
