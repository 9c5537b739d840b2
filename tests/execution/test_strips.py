"""Column strips (summa.execution.strips) against a float64 reference, and their errors."""

import io

import numpy as np
import pytest

from helpers import (GEMM_SHAPES, check_against_reference, gemm_scaled_error,
                     random_array)
import summa
from summa import cli
from summa.execution.algorithm import SummaStats, gemm
from summa.distribution.grid import ProcessGrid
from summa.distribution.matrix import DistMatrix
from summa.planning.memory import Execution, memory_plan
from summa.execution.strips import strip_bounds
from summa.planning.checks import check_schedule

#: Each test's subject is the process grid's shape: ./run test runs them on every
#: rank count (the others on a few: pyproject.toml's markers).
pytestmark = pytest.mark.grid


def test_strip_bounds_cover_the_columns_once():
    for n, width, head in [(10, 3, 1), (10, 3, 4), (7, 100, 4), (1, 1, 4), (0, 4, 4),
                           (33, 8, 4), (9, 9, 2)]:
        bounds = strip_bounds(n, width, head)
        cols = [j for s0, s1 in bounds for j in range(s0, s1)]
        assert cols == list(range(n))
        assert all(s1 > s0 and s1 - s0 <= width for s0, s1 in bounds)
        if n > width and head > 1:  # the first strip comes in smaller pieces
            assert bounds[0][1] - bounds[0][0] < width


def test_check_schedule_names_what_is_wrong():
    assert check_schedule("panels", (2, 2)) == "panels"
    assert check_schedule("strips", (3, 1)) == "strips"
    with pytest.raises(ValueError, match="one column .* not 2x2; give --grid 4x1"):
        check_schedule("strips", (2, 2))
    with pytest.raises(ValueError, match="in device memory only"):
        check_schedule("strips", (2, 1), out_of_core=True)
    with pytest.raises(ValueError, match="schedule must be one of panels, strips"):
        check_schedule("diagonal", (2, 1))


def test_strips_plan_their_buffers(monkeypatch):
    # Strips hold all of K by the strip width; panels hold the width by all of N
    # (and here no transposed panel of A: test_transpose.py counts that one).
    monkeypatch.setenv("SUMMA_TRANSPOSE_A", "no")
    base = memory_plan(400, 100, 300, "float64", (2, 1), 50, Execution(lookahead=1))
    strips = memory_plan(400, 100, 300, "float64", (2, 1), 50,
                         Execution(lookahead=1, schedule="strips"))
    blocks = (200 * 300 + 150 * 100 + 200 * 100) * 8
    assert base.device_bytes == blocks + 2 * 50 * 100 * 8
    assert strips.device_bytes == blocks + 2 * 300 * 50 * 8
    # a strip never exceeds the columns there are
    wide = memory_plan(400, 100, 300, "float64", (2, 1), 4096,
                       Execution(lookahead=1, schedule="strips"))
    assert wide.device_bytes == blocks + 2 * 300 * 100 * 8


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("shape", GEMM_SHAPES)
@pytest.mark.parametrize("block", [None, (3, 3)])
def test_strips_match_the_reference(comm, backend, rng, shape, block):
    with ProcessGrid(comm, (comm.Get_size(), 1)) as grid:
        runs = check_against_reference(rng, grid, backend, shape, block, panel_width=4,
                                       schedule="strips")
    if comm.Get_size() > 1:
        heads = 4 if backend.name == "cupy" else 1
        for stats in runs:
            assert stats.extra["schedule"] == "strips"
            assert stats.panels == len(strip_bounds(shape[1], 4, heads))


@pytest.mark.mpi(min_size=1)
def test_strips_bits_do_not_depend_on_the_lookahead(comm, backend):
    with ProcessGrid(comm, (comm.Get_size(), 1)) as grid:
        A = DistMatrix.random((45, 38), "float64", grid, backend, seed=5)
        B = DistMatrix.random((38, 53), "float64", grid, backend, seed=6)
        results = [gemm(A, B, panel_width=8, lookahead=la, schedule="strips").gather()
                   for la in (0, 1, 3)]
        again = gemm(A, B, panel_width=8, lookahead=1, schedule="strips").gather()
    if comm.rank == 0:
        for r in results[1:] + [again]:
            assert np.array_equal(r, results[0])


@pytest.mark.mpi(min_size=1)
def test_strips_with_transposes_and_every_broadcaster(comm, backend, rng):
    a, b = random_array(rng, (30, 26), "float64"), random_array(rng, (33, 30), "float64")
    with ProcessGrid(comm, (comm.Get_size(), 1)) as grid:
        A = DistMatrix.from_global(a, grid, backend)
        B = DistMatrix.from_global(b, grid, backend)
        # auto, not the name it resolves to: that is NCCL where ranks share a GPU too
        for broadcaster in ("mpi", "auto"):
            c = gemm(A, B, trans_a="T", trans_b="T", panel_width=5, schedule="strips",
                     broadcaster=broadcaster).gather()
            if comm.rank == 0:
                assert gemm_scaled_error(c, a, b, trans_a="T", trans_b="T") <= 1


@pytest.mark.mpi(min_size=2)
def test_strips_refuse_a_grid_of_several_columns_on_every_rank(comm, backend):
    p = comm.Get_size()
    with ProcessGrid(comm, (1, p)) as grid:
        A = DistMatrix.random((8, 8), "float64", grid, backend, seed=1)
        B = DistMatrix.random((8, 8), "float64", grid, backend, seed=2)
        with pytest.raises(ValueError, match="one column"):
            gemm(A, B, schedule="strips")
        with pytest.raises(ValueError, match="schedule must be one of"):
            gemm(A, B, schedule="rows")
        # nothing was left half-done: the grid still multiplies
        c = gemm(A, B).gather()
        a, b = A.gather(), B.gather()
    if comm.rank == 0:
        assert gemm_scaled_error(c, a, b) <= 1


@pytest.mark.mpi(min_size=2)
def test_cli_strips_usage_errors_and_a_checked_run(comm):
    p = comm.Get_size()
    with pytest.raises(cli.UsageError, match="one column"):
        cli.main(["bench", "--size", "40", "--schedule", "strips", "--grid", f"1x{p}"], comm,
                 io.StringIO())
    with pytest.raises(cli.UsageError, match="device memory only"):
        cli.main(["bench", "--size", "40", "--schedule", "strips", "--grid", f"{p}x1",
                  "--device-memory", "1MiB"], comm, io.StringIO())
    out = io.StringIO()
    assert cli.main(["bench", "--size", "40", "--schedule", "strips", "--grid", f"{p}x1",
                     "--nb", "8", "--check", "--repeat", "1", "--no-ideal"], comm, out) == 0
    if comm.rank == 0:
        assert "column strips" in out.getvalue() and " ok" in out.getvalue()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("lookahead", [0, 1, 3])
@pytest.mark.parametrize("block", [None, (3, 3)])
@pytest.mark.parametrize("shape", [(37, 23, 41), (6, 9, 1), (16, 40, 64)])
def test_strips_by_direct_reads_hide_the_connect(comm, rng, lookahead, block, shape,
                                                monkeypatch):
    """With a broadcaster that reads the owners' blocks (ipc on GPUs), strided
    strips are copied straight out of them; a rank's own rows of the first
    strip are multiplied before the peers' blocks are opened."""
    from summa.device.backend import get_backend
    from test_algorithm import use_window_readers
    backend = get_backend("numpy")
    m, n, k = shape
    with ProcessGrid(comm, (comm.Get_size(), 1)) as grid:
        _, calls, gemms = use_window_readers(grid, backend, monkeypatch)
        a, b = random_array(rng, (m, k), "float64"), random_array(rng, (k, n), "float64")
        A = DistMatrix.from_global(a, grid, backend, block=block)
        B = DistMatrix.from_global(b, grid, backend, block=block)
        results = [gemm(A, B, panel_width=8, lookahead=la, schedule="strips").gather()
                   for la in (lookahead, 0)]
        if comm.rank == 0:
            assert gemm_scaled_error(results[0], a, b) <= 1
            assert np.array_equal(results[0], results[1])
        assert calls.count("connect") == 2 == calls.count("release")  # one per multiply
        assert "ibcast" not in calls
        if B.local.shape[0]:  # this rank holds rows of B: their GEMM comes before connect
            assert gemms[0] <= calls.index("connect")


@pytest.mark.mpi(min_size=1)
def test_plan_command_with_strips(comm):
    out = io.StringIO()
    assert cli.main(["plan", "--m", "1000", "--n", "200", "--k", "3000", "--ranks", "2",
                     "--grid", "2x1", "--nb", "100", "--schedule", "strips"], comm, out) == 0
    want = memory_plan(1000, 200, 3000, "float64", (2, 1), 100, Execution(schedule="strips"))
    if comm.rank == 0:
        assert f"device {want.device_bytes / 2**30:.2f} GiB" in out.getvalue()
    # without --grid, strips plan on the one grid they run on
    out = io.StringIO()
    assert cli.main(["plan", "--size", "100", "--ranks", "4", "--schedule", "strips",
                     "--hardware", "rtx3090x8"], comm, out) == 0
    assert comm.rank != 0 or "4x1" in out.getvalue()
    with pytest.raises(cli.UsageError, match="one column"):
        cli.main(["plan", "--size", "100", "--ranks", "4", "--grid", "2x2", "--schedule",
                  "strips", "--hardware", "rtx3090x8"], comm, io.StringIO())
    with pytest.raises(cli.UsageError, match="device memory only"):
        cli.main(["plan", "--size", "100", "--ranks", "2", "--grid", "2x1", "--schedule",
                  "strips", "--device-memory", "1GiB"], comm, io.StringIO())


@pytest.mark.mpi(min_size=1)
def test_strips_take_the_default_width_for_auto(comm, backend):
    from summa.planning.tuning import default_panel_width
    with ProcessGrid(comm, (comm.Get_size(), 1)) as grid:
        A = DistMatrix.random((30, 20), "float64", grid, backend, seed=1)
        B = DistMatrix.random((20, 40), "float64", grid, backend, seed=2)
        stats = SummaStats()
        gemm(A, B, panel_width="auto", schedule="strips", stats=stats)
    assert stats.panel_width == default_panel_width(backend.name, A.dtype, None)
    assert stats.extra["panel_width_measured"] is False


def test_strips_that_do_not_fit_are_refused_with_a_hint_that_applies(monkeypatch):
    from mpi4py import MPI
    from summa.planning import memorycheck
    from summa.planning.planner import Machine, make_plan
    from summa.planning.request import PlanRequest
    from test_outofcore import _FakeGpu  # 23.5 GiB free
    monkeypatch.setattr(memorycheck, "host_memory_total", lambda: 2**40)  # a 1 TiB node
    gpu = Machine.live(MPI.COMM_SELF, _FakeGpu())
    with pytest.raises(ValueError, match=r"GiB free; use --schedule panels \(which can run out "
                                         r"of core\) or more ranks"):
        make_plan((60_000,) * 3, "float64", gpu,
                  PlanRequest(panel_width=4096, schedule="strips"))
    # panels go out of core by themselves instead, unless in memory was asked for
    taken = make_plan((60_000,) * 3, "float64", gpu, PlanRequest(panel_width=4096))
    assert taken.device_budget and "running out of core" in taken.note
    with pytest.raises(ValueError, match="GiB free"):
        make_plan((60_000,) * 3, "float64", gpu,
                  PlanRequest(panel_width=4096, out_of_core=False))


@pytest.mark.mpi(min_size=2)
def test_matmul_refuses_strips_on_a_wide_grid_before_any_warning(comm, monkeypatch):
    # bad input is one message: here the core-share note (a rank bound to one
    # core, as Open MPI does for np <= 2) would come first, were the grid made first
    import warnings
    from summa.distribution import grid as grid_module
    monkeypatch.setattr(grid_module, "core_share", lambda *args: (1, 1, "bound to 1 core"))
    a = np.ones((8, 8)) if comm.rank == 0 else None
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with pytest.raises(ValueError, match="one column"):
            summa.matmul(a, a, comm=comm, grid=(1, comm.Get_size()), schedule="strips",
                         backend="numpy")
    assert not [w for w in seen if "bound to 1 core" in str(w.message)]


@pytest.mark.mpi(min_size=2)
def test_bench_refuses_strips_on_a_wide_grid_before_any_warning(comm, monkeypatch, capsys):
    from summa.distribution import grid as grid_module
    monkeypatch.setattr(grid_module, "core_share", lambda *args: (1, 1, "bound to 1 core"))
    for args, match in ((["--grid", f"1x{comm.Get_size()}"], "one column"),
                        (["--out-of-core"], "device memory only")):
        with pytest.raises(cli.UsageError, match=match):
            cli.main(["bench", "--backend", "numpy", "--size", "64", "--schedule", "strips"]
                     + args, comm, io.StringIO())
        assert "bound to 1 core" not in capsys.readouterr().err
