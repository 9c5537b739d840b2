"""Out-of-core SUMMA and the memory planner, on the NumPy backend (the "device"
is host memory there, but the budget still decides the tiling)."""

import io
import re
import tracemalloc

import numpy as np
import pytest

import summa
from helpers import gemm_scaled_error, held_plan, random_array, use_fake_cupy
from summa import cli
from summa.execution.algorithm import summa as summa_in_memory
from summa.device.backend import NumpyBackend
from summa.distribution.grid import ProcessGrid
from summa.distribution.matrix import DistMatrix
from summa.execution import movers
from summa.execution.outofcore import SweepOperands, summa_out_of_core
from summa.planning import sweepsetup
from summa.planning.memory import Execution, memory_plan, parse_bytes
from summa.planning.memorycheck import check_memory

#: Each test's subject is the process grid's shape: ./run test runs them on every
#: rank count (the others on a few: pyproject.toml's markers).
pytestmark = pytest.mark.grid


def _held(grid, a, b) -> tuple:
    """``(A, B, C)``: `a` and `b` and a zero C of their product's shape and
    dtype as DistMatrix blocks of `grid` on the NumPy backend (host-held)."""
    host = NumpyBackend()
    A, B = (DistMatrix.from_global(x, grid, host) for x in (a, b))
    return A, B, DistMatrix.zeros((a.shape[0], b.shape[1]), a.dtype, grid, host)


def test_own_copies_multiply_without_broadcasts_and_of_the_wrong_shape_are_refused(rng):
    """Where every rank holds its own rows of A and columns of B with all of
    K (`own_copies`: the ``"host"`` broadcaster's node-shared operands) the
    sweep reads them instead of broadcasting; copies of another shape are
    refused in one sentence."""
    from mpi4py import MPI
    m, n, k = 30, 20, 24
    a, b = random_array(rng, (m, k), "float64"), random_array(rng, (k, n), "float64")
    host = NumpyBackend()
    with ProcessGrid(MPI.COMM_SELF) as grid:
        A, B, C = _held(grid, a, b)
        plan = held_plan(A, B, C, host, device_memory=4000, panel_width=8)
        stats = summa_out_of_core(plan, SweepOperands(A, B, C, (a, b)), host)
        assert gemm_scaled_error(C.gather(), a, b) <= 1
        assert stats.comm == "own uploads (host-resident)"
        with pytest.raises(ValueError, match="own_copies must be this rank's 30 rows of A"):
            summa_out_of_core(plan, SweepOperands(A, B, C, (a[:, :8], b)), host)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("budget_tiles", [1, 3, 10])
@pytest.mark.parametrize("dtype", ["float64", "complex64"])
def test_out_of_core_matches_reference_with_many_tiles(comm, rng, budget_tiles, dtype):
    m, n, k = 90, 70, 50
    a, b, c0 = (random_array(rng, s, dtype) for s in ((m, k), (k, n), (m, n)))
    host = NumpyBackend()
    with ProcessGrid(comm) as grid:
        A, B, C = (DistMatrix.from_global(x, grid, host) for x in (a, b, c0))
        ml, nl = C.local.shape
        item = np.dtype(dtype).itemsize
        # a budget that holds about 1/budget_tiles of the local C plus its chunks
        side = max(4, int(np.sqrt(ml * nl / budget_tiles)))
        budget = (side * side + 4 * side * 8) * item
        plan = held_plan(A, B, C, host, device_memory=budget, panel_width=8)
        stats = summa_out_of_core(plan, SweepOperands(A, B, C), host, alpha=1.5, beta=-0.5)
        c = C.gather()
    assert stats.extra["device_bytes_planned"] <= budget
    tiles = stats.extra["tiles"][0] * stats.extra["tiles"][1]
    if budget_tiles > 1 and ml * nl > 0:
        assert tiles > 1, "a small budget must force several tiles"
    if comm.rank == 0:
        assert gemm_scaled_error(c, a, b, c0, 1.5, -0.5) <= 1


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("lookahead", [0, 2])
@pytest.mark.parametrize("transpose_a", ["no", "yes"])
@pytest.mark.parametrize("head", [2, None])
def test_out_of_core_split_first_panel_and_strips_of_the_last(comm, rng, monkeypatch,
                                                               lookahead, transpose_a, head):
    # The GPU's schedule (first panel in pieces, or whole with K's remainder
    # first; last panel in row strips, each written back at once) run with
    # host copies: the same steps, checkable here; with A's parts transposed,
    # the strips are rows of a column-major copy.
    from summa.planning import memory
    monkeypatch.setenv("SUMMA_TRANSPOSE_A", transpose_a)
    monkeypatch.setattr(movers.HostMover, "overlaps", True)
    monkeypatch.setattr(memory, "HEAD_FIRST", head)  # the plan's pieces of 2, 2, 4 columns
    m, n, k = 77, 61, 45
    a, b, c0 = (random_array(rng, s, "float64") for s in ((m, k), (k, n), (m, n)))
    host = NumpyBackend()
    with ProcessGrid(comm) as grid:
        A, B, C = (DistMatrix.from_global(x, grid, host) for x in (a, b, c0))
        plan = held_plan(A, B, C, host, device_memory=6000, panel_width=8, lookahead=lookahead)
        stats = summa_out_of_core(plan, SweepOperands(A, B, C), host, beta=2.0)
        c = C.gather()
    assert stats.panels == len(range(0, k, 8)) + (2 if head else 0) or grid.size > 1
    assert stats.extra["tiles"][0] * stats.extra["tiles"][1] > 1  # several tiles
    assert stats.extra["transposed_a"] == (transpose_a == "yes")
    if comm.rank == 0:
        assert gemm_scaled_error(c, a, b, c0, 1.0, 2.0) <= 1


def test_float64_on_int8_keeps_its_first_panel_whole_and_its_strips_wide():
    # each product of fp64-int8 reconstructs its whole C block: no narrow
    # pieces of K, no strips of a few rows (40 such products ran 41.3 TFLOP/s, the bare 58.2:
    # docs/benchmarks.md, "Measurements behind the defaults")
    from summa.execution import sweep
    from summa.distribution.layout import Layout, panel_schedule
    from summa.planning.memory import FP64_INT8_TAIL_SMALLEST
    plans = {p: memory_plan(40000, 40000, 40000, "float64", (1, 1), 16384,
                            Execution(1, "cupy", device_budget=24 << 30, out_of_core=True,
                                      precision=p)) for p in (None, "fp64-int8")}
    assert plans["fp64-int8"].head_first is None and plans[None].head_first >= 1
    assert plans["fp64-int8"].tail_smallest == FP64_INT8_TAIL_SMALLEST
    assert plans[None].tail_smallest < FP64_INT8_TAIL_SMALLEST
    panels = panel_schedule(Layout((64, 40000), (1, 1)).cols, Layout((40000, 64), (1, 1)).rows,
                            16384)
    pieces = sweep.head_pieces(panels, True, plans[None].head_first)
    assert len(pieces) > len(panels) and pieces[0].width == plans[None].head_first
    # whole, K's remainder (40000 - 2 x 16384) first: the same panels, the first upload shortest
    whole = sweep.head_pieces(panels, True, plans["fp64-int8"].head_first)
    assert [p.width for p in whole] == [40000 - 2 * 16384, 16384, 16384]
    assert sorted(whole, key=lambda p: p.k0) == panels
    assert sweep.head_pieces(panels, False, plans[None].head_first) == panels
    for rows in (2048, 5000, 16384, 40000):
        default = sweep._tail_strips(rows, True, plans[None].tail_smallest)
        wide = sweep._tail_strips(rows, True, plans["fp64-int8"].tail_smallest)
        for strips in (default, wide):  # the rows, in order, once
            assert strips[0][0] == 0 and strips[-1][1] == rows
            assert all(a[1] == b[0] for a, b in zip(strips, strips[1:]))
        assert min(r1 - r0 for r0, r1 in wide) >= min(rows, FP64_INT8_TAIL_SMALLEST)
        assert len(wide) < len(default) or rows <= FP64_INT8_TAIL_SMALLEST


def test_fp64_int8_first_panel_in_pieces_where_the_plan_says(monkeypatch):
    """FP64_INT8_HEAD_FIRST (what fp64_int8_user_case.py --head-first sets)
    reaches the plan, the sweep's pieces and the model's exposed upload."""
    from summa.execution import sweep
    from summa.distribution.layout import Layout, first_panel_width, panel_schedule
    from summa.planning import memory, prediction
    from summa.planning.planner import Machine, make_plan
    from summa.planning.request import PlanRequest

    def plan():
        return make_plan((40000,) * 3, "float64", Machine("cupy", 1),
                         PlanRequest(device_memory="24GiB", precision="fp64-int8"))
    whole = plan()
    monkeypatch.setattr(memory, "FP64_INT8_HEAD_FIRST", 4096)
    cut = plan()
    assert (whole.memory.head_first, cut.memory.head_first) == (None, 4096)
    width = cut.memory.chunk
    panels = panel_schedule(Layout((64, 40000), (1, 1)).cols, Layout((40000, 64), (1, 1)).rows,
                            width)
    pieces = sweep.head_pieces(panels, True, cut.memory.head_first)
    assert [p.width for p in pieces[:2]] == [4096, 4096] and sum(
        p.width for p in pieces) == 40000
    up = [prediction._head_tail(p, width, p.memory.tile)[0] for p in (whole, cut)]
    assert up[1] * first_panel_width(40000, width) == up[0] * 4096  # whole: the narrowest first


@pytest.mark.mpi(min_size=1)
def test_last_tile_goes_home_strip_by_strip_over_its_last_panels(comm, rng, monkeypatch):
    """The last tile's write-back has nothing but its own GEMMs to hide behind:
    its last `lookahead + 1` panels go strip by strip, each strip written back
    as soon as all of them are in it, the strips shrinking so that the last
    write-back is short; earlier tiles strip only their last panel."""
    from summa.execution import sweep
    from summa.planning import memory
    monkeypatch.setattr(movers.HostMover, "overlaps", True)
    monkeypatch.setattr(memory, "TAIL_SMALLEST", 3)  # the plan's
    events = []
    real_gemm, real_write = movers.HostMover.gemm, movers.HostMover.write_back
    monkeypatch.setattr(movers.HostMover, "gemm", lambda self, alpha, a, b, c, *rest: (
        events.append(("gemm", b.shape[0], c.shape[0])),
        real_gemm(self, alpha, a, b, c, *rest))[1])
    monkeypatch.setattr(movers.HostMover, "write_back", lambda self, host, c, buf: (
        events.append(("write", c.shape[0])), real_write(self, host, c, buf))[1])
    m, n, k = 60, 20, 48
    a, b = random_array(rng, (m, k), "float64"), random_array(rng, (k, n), "float64")
    host = NumpyBackend()
    with ProcessGrid(comm, (1, comm.Get_size())) as grid:
        A, B, C = _held(grid, a, b)
        # a budget for about two tiles of rows
        plan = held_plan(A, B, C, host, device_memory=9000, panel_width=8, lookahead=1)
        stats = summa_out_of_core(plan, SweepOperands(A, B, C), host)
        c = C.gather()
    if comm.rank == 0:
        assert gemm_scaled_error(c, a, b) <= 1
    tiles = stats.extra["tiles"][0] * stats.extra["tiles"][1]
    if tiles < 2 or C.local.shape[1] == 0:
        pytest.skip("this rank's share is too small for two tiles")
    kinds = "".join("w" if e[0] == "write" else "g" for e in events)
    rows = [i1 - i0 for i0, i1 in sweep.bounds(C.local.shape[0], stats.extra["tiles"][0])
            for _ in range(stats.extra["tiles"][1])]
    strips = [[r1 - r0 for r0, r1 in sweep._tail_strips(r, True, 3)] for r in rows]
    assert all(len(s) >= 3 and s[0] > s[-2] for s in strips)  # it does shrink here
    assert kinds.count("w") == sum(map(len, strips))
    # the last tile: two panels per strip, then that strip's write-back
    last = strips[-1]
    assert kinds.endswith("ggw" * len(last)), kinds
    assert [e[1] for e in events[-3 * len(last):] if e[0] == "write"] == last
    # an earlier tile: its last panel alone in strips, after whole-tile GEMMs
    first = kinds.index("w")
    assert kinds[first - 2:first + 2 * len(strips[0])] == "gg" + "wg" * len(strips[0]), kinds
    assert events[first - 2][2] > events[first - 1][2]


@pytest.mark.parametrize("budget,lead", [(10**7, 1), (20_000, 0)])
def test_uploads_run_a_step_ahead_of_their_broadcasts_where_a_slot_is_spare(
        rng, monkeypatch, budget, lead):
    """With room for one more panel slot than the lookahead needs, the owner
    uploads step j + 1 before it broadcasts step j, so its broadcast is ready
    when the receivers' is (they wait for the same GEMM); without, uploads go
    with their broadcasts. The product is the same."""
    from mpi4py import MPI

    events = []
    real_upload = movers.HostMover.upload
    monkeypatch.setattr(movers.HostMover, "upload", lambda self, dst, src: (
        events.append("u"), real_upload(self, dst, src))[1])

    class Logged:
        def __init__(self, bc):
            self.bc, self.name = bc, bc.name

        def ibcast(self, buf, root, slot=0, ready=None, own=False):
            events.append("s")
            return self.bc.ibcast(buf, root, slot, ready=ready)

        def take_seconds(self):
            return self.bc.take_seconds()
    real = sweepsetup.grid_broadcasters
    monkeypatch.setattr(sweepsetup, "grid_broadcasters", lambda *args, **kwargs: tuple(
        Logged(bc) for bc in real(*args, **kwargs)))
    m, n, k = 40, 30, 64
    a, b = random_array(rng, (m, k), "float64"), random_array(rng, (k, n), "float64")
    host = NumpyBackend()
    with ProcessGrid(MPI.COMM_SELF) as grid:
        A, B, C = _held(grid, a, b)
        memory = memory_plan(m, n, k, "float64", (1, 1), 8,
                             Execution(1, "numpy", device_budget=budget, out_of_core=True))
        assert memory.slots == 2 + lead
        plan = held_plan(A, B, C, host, device_memory=budget, panel_width=8, lookahead=1)
        summa_out_of_core(plan, SweepOperands(A, B, C), host)
        assert gemm_scaled_error(C.gather(), a, b) <= 1
    steps = len(events) // 4  # one rank owns both parts of every step: 2 uploads, 2 sends
    for j in range(steps):
        sent = [i for i, e in enumerate(events) if e == "s"][2 * j]  # step j's first send
        uploaded = events[:sent].count("u") // 2
        # the first two go out together; then step j + lead was uploaded first
        assert uploaded == min(steps, max(2, j + 1) + lead), (j, "".join(events))


@pytest.mark.mpi(min_size=1)
def test_out_of_core_is_bit_identical_when_one_tile_holds_everything(comm):
    host = NumpyBackend()
    with ProcessGrid(comm) as grid:
        A = DistMatrix.random((64, 40), "float64", grid, host, seed=1)
        B = DistMatrix.random((40, 48), "float64", grid, host, seed=2)
        C1 = DistMatrix.zeros((64, 48), "float64", grid, host)
        C2 = DistMatrix.zeros((64, 48), "float64", grid, host)
        # one rank multiplies in a single GEMM in memory: give it one panel out of core too
        width = 8 if grid.size > 1 else 40
        summa_in_memory(1.0, A, B, 0.0, C1, panel_width=width, lookahead=0)
        plan = held_plan(A, B, C2, host, device_memory=1 << 30, panel_width=width)
        summa_out_of_core(plan, SweepOperands(A, B, C2), host)
        assert np.array_equal(C1.local, C2.local)


@pytest.mark.mpi(min_size=1)
def test_numpy_arrays_out_of_core(comm, rng):
    a, b = random_array(rng, (50, 30), "float32"), random_array(rng, (30, 20), "float32")
    c = summa.matmul(a if comm.rank == 0 else None, b if comm.rank == 0 else None,
                     device_memory="20KiB", panel_width=8, alpha=2.0)
    if comm.rank == 0:
        assert gemm_scaled_error(c, a, b, alpha=2.0) <= 1


@pytest.mark.mpi(min_size=1)
def test_bench_out_of_core_and_auto(comm):
    out = io.StringIO()
    assert cli.main(["bench", "--size", "96", "--check", "--device-memory", "16KiB",
                     "--repeat", "1", "--no-ideal"], comm, out) == 0
    if comm.rank == 0:
        assert "out of core" in out.getvalue() and " ok" in out.getvalue()
    with pytest.raises(cli.UsageError, match="too small"):
        cli.main(["bench", "--size", "96", "--device-memory", "100B"], comm, io.StringIO())
    with pytest.raises(cli.UsageError, match="expected a size like 16GiB"):
        cli.main(["bench", "--size", "96", "--device-memory", "lots"], comm, io.StringIO())


@pytest.mark.mpi(min_size=1)
def test_planned_host_peak_matches_measured(comm):
    """The planner's host bytes (NumPy backend, in memory) against tracemalloc's peak."""
    host = NumpyBackend()
    m = n = k = 480
    with ProcessGrid(comm) as grid:
        # a first multiply makes what every later one reuses (broadcasters, their
        # self-test): alone in a run, this test measured that too (+24 %)
        warm = DistMatrix.zeros((8, 8), "float64", grid, host)
        summa_in_memory(1.0, warm, warm, 0.0, warm.copy(), panel_width=4)
        tracemalloc.start()
        A = DistMatrix.random((m, k), "float64", grid, host, seed=1)
        B = DistMatrix.random((k, n), "float64", grid, host, seed=2)
        C = DistMatrix.zeros((m, n), "float64", grid, host)
        tracemalloc.reset_peak()
        summa_in_memory(1.0, A, B, 0.0, C, panel_width=64, lookahead=1)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        plan = memory_plan(m, n, k, "float64", grid.shape, 64, Execution(1, "numpy"))
    # the largest rank's share is planned; this rank's may be smaller by a row or two
    assert 0.9 * plan.host_bytes <= peak * (plan.host_bytes / max(peak, 1)) <= 1.1 * plan.host_bytes
    assert abs(peak - plan.host_bytes) <= 0.1 * plan.host_bytes, (peak, plan.host_bytes)


def test_plan_figures(monkeypatch):
    monkeypatch.delenv("SUMMA_TRANSPOSE_A", raising=False)
    plan = memory_plan(100_000, 100_000, 100_000, "float64", (2, 1), 4096, Execution(1, "cupy"))
    item = 8
    blocks = (50_000 * 100_000 + 50_000 * 100_000 + 50_000 * 100_000) * item
    # + one transposed panel of A (4096 x 50,000): float64 GEMMs read A column-major
    assert plan.mode == "in-memory" and plan.device_bytes == blocks + 2 * 4096 * 100_000 * item \
        + 4096 * 50_000 * item
    ooc = memory_plan(100_000, 100_000, 100_000, "float32", (2, 1), 4096,
                      Execution(1, "cupy", device_budget=parse_bytes("16GiB"), out_of_core=True))
    tm, tn = ooc.tile
    rows, cols = ooc.tiles
    assert ooc.device_bytes <= parse_bytes("16GiB")
    # two C tiles (one computed, one written back), slots of A and B panel parts,
    # and a transposed copy of an A part
    def planned(slots):
        return (2 * tm * tn + slots * (tm + tn) * ooc.chunk + tm * ooc.chunk) * 4
    assert ooc.device_bytes == planned(ooc.slots)
    # fewest tiles the way that uploads less: this rank's block is wider than
    # tall, so whole columns of C (A's panels uploaded once per column of tiles)
    assert rows == 1 and tm == 50_000 and cols == -(-100_000 // tn) and cols > 1
    assert ooc.slots in (2, 3) and planned(ooc.slots + 1) > parse_bytes("16GiB")  # no room
    one = memory_plan(100_000, 100_000, 100_000, "float32", (2, 1), 4096,
                      Execution(1, "cupy", device_budget=parse_bytes("64GiB"), out_of_core=True))
    assert one.tiles == (1, 1) and one.tile == (50_000, 100_000)
    assert one.slots == 3 and one.device_bytes == (50_000 * 100_000 + 3 * 150_000 * 4096
                                                   + 50_000 * 4096) * 4
    with pytest.raises(ValueError, match="too small"):
        memory_plan(1000, 1000, 1000, "float64", (1, 1), 256,
                    Execution(1, "cupy", device_budget=1000, out_of_core=True))


def test_copy_engine_broadcasts_plan_their_staging(monkeypatch):
    """ipc sends each slot's part through a staging buffer of its size: planned
    in the directions that have ranks to send to, and within the budget."""
    monkeypatch.setenv("SUMMA_TRANSPOSE_A", "no")
    budget = parse_bytes("16GiB")

    def plan(grid, staged):
        return memory_plan(100_000, 100_000, 100_000, "float32", grid, 4096,
                           Execution(1, "cupy", device_budget=budget, out_of_core=True,
                                     staged=staged))

    for grid, sends in (((2, 1), (False, True)), ((1, 2), (True, False)),
                        ((2, 2), (True, True)), ((1, 1), (False, False))):
        plain, staged = plan(grid, (False, False)), plan(grid, (True, True))
        assert staged.staged == sends and plain.staged == (False, False)
        tm, tn = staged.tile
        a_parts = staged.slots * (1 + sends[0])
        b_parts = staged.slots * (1 + sends[1])
        assert staged.device_bytes == (min(2, staged.tiles[0] * staged.tiles[1]) * tm * tn
                                       + a_parts * tm * 4096 + b_parts * tn * 4096) * 4
        assert staged.device_bytes <= budget
        if any(sends):  # more memory for the same tiles and slots, or less room
            assert staged.device_bytes > plain.device_bytes \
                or (staged.slots, *staged.tile) != (plain.slots, *plain.tile)
        else:
            assert staged == plain


@pytest.mark.mpi(min_size=2)
def test_out_of_core_plans_staging_for_copy_engine_broadcasters(comm, rng, monkeypatch):
    """The sweep plans with the broadcasters it got: ones named ipc (here the
    host-staged MPI ones under that name) have their staging counted."""
    real = sweepsetup.grid_broadcasters

    class Named:
        def __init__(self, inner):
            self.inner, self.name = inner, "ipc"

        def __getattr__(self, attr):
            return getattr(self.inner, attr)

    monkeypatch.setattr(sweepsetup, "grid_broadcasters",
                        lambda *args, **kw: tuple(Named(bc) for bc in real(*args, **kw)))
    m, n, k = 40, 36, 32
    a, b = (random_array(rng, s, "float64") for s in ((m, k), (k, n)))
    host = NumpyBackend()
    with ProcessGrid(comm) as grid:
        A, B, C = _held(grid, a, b)
        plan = held_plan(A, B, C, host, device_memory=1 << 20, panel_width=8)
        stats = summa_out_of_core(plan, SweepOperands(A, B, C), host)
        c = C.gather()
        pr, pc = grid.shape
    expected = memory_plan(m, n, k, "float64", (pr, pc), 8,
                           Execution(1, "numpy", device_budget=1 << 20, out_of_core=True,
                                     staged=(True, True)))
    assert expected.staged == (pc > 1, pr > 1)
    assert stats.extra["device_bytes_planned"] == comm.allreduce(expected.device_bytes,
                                                                 op=_max_op())
    assert stats.extra["staging_bytes"] == 0  # host-staged MPI stages nothing on a device
    if comm.rank == 0:
        assert gemm_scaled_error(c, a, b, np.zeros((m, n)), 1.0, 0.0) <= 1


@pytest.mark.mpi(min_size=1)
def test_the_sweeps_final_wait_is_a_watchdog_step(comm, rng, monkeypatch):
    """On a GPU the last synchronize waits for streams that wait on peers'
    broadcasts: the watchdog must be able to name it."""
    import summa.runtime.watchdog as wd
    steps = []
    monkeypatch.setattr(movers.HostMover, "finish",
                        lambda self: steps.append(wd._slot.active._step[0]))
    host = NumpyBackend()
    with ProcessGrid(comm) as grid, wd.Watchdog(60, comm):
        A, B = (DistMatrix.random(s, "float64", grid, host, seed=i)
                for i, s in enumerate(((30, 20), (20, 25))))
        C = DistMatrix.zeros((30, 25), "float64", grid, host)
        plan = held_plan(A, B, C, host, device_memory=1 << 20, panel_width=8)
        summa_out_of_core(plan, SweepOperands(A, B, C), host)
    assert steps == ["the queued GPU work of the out-of-core sweep (uploads, broadcasts, "
                     "GEMMs, write-backs)"]


def test_bench_rank_line_reports_the_staging_beside_the_pool():
    from summa.cli.bench import _rank_line
    from summa.transports.ipc import IpcBroadcaster

    class Slot:
        def __init__(self, nbytes):
            self.nbytes = nbytes

    bc = IpcBroadcaster.__new__(IpcBroadcaster)  # no GPU here: only its slots
    bc._slots = {0: Slot(3 << 30), 1: Slot(1 << 29)}
    assert bc.staging_bytes() == (3 << 30) + (1 << 29)
    rank = dict(rank=1, coords=[1, 0], compute=0.5, comm_seconds=0.1, wait=0.01,
                head_seconds=0.002, between_seconds=0.004, tail_seconds=0.003, memory_bytes=0,
                reserved_bytes=2 << 30,
                pool_growth_bytes=0, staging_bytes=bc.staging_bytes())
    line = _rank_line(rank)
    assert ("GPU idle 0.0020 s before the first GEMM, 0.0040 s between GEMMs, 0.0030 s "
            "after the last") in line
    assert "2.00 GiB pool" in line and line.endswith("3.50 GiB of broadcast staging")
    assert "staging" not in _rank_line(dict(rank, staging_bytes=0))
    # direct copies (ipc): how many peer blocks the multiply had to open, and how long it took
    assert "opened 0 peer blocks in 0.3 ms" in _rank_line(dict(rank, opened_blocks=0,
                                                                connect_seconds=3e-4))
    assert "opened" not in line


def _max_op():
    from mpi4py import MPI
    return MPI.MAX


@pytest.mark.parametrize("text,value", [("16GiB", 16 * 2**30), ("512MB", 512 * 10**6),
                                         ("2e9", 2 * 10**9), ("64 KiB", 64 * 1024)])
def test_parse_bytes(text, value):
    assert parse_bytes(text) == value


@pytest.mark.parametrize("text", ["", "lots", "-5GiB", "12XB"])
def test_parse_bytes_rejects(text):
    with pytest.raises(ValueError):
        parse_bytes(text)


class _FakeGpu:
    """Just enough of the CuPy backend for check_memory and a live make_plan."""
    name, device, is_gpu = "cupy", 1, True

    def memory_free(self):
        return int(23.5 * 2**30)

    def device_id(self):
        return "0000:01:00.0"


def test_check_memory_names_the_shortfall(monkeypatch):
    monkeypatch.delenv("SUMMA_TRANSPOSE_A", raising=False)
    from mpi4py import MPI
    plan = memory_plan(60_000, 60_000, 60_000, "float64", (1, 1), 4096, Execution(1, "cupy"))
    # A, B, C (80.5 GiB) and one transposed 4096-wide panel of A (1.8 GiB)
    with pytest.raises(ValueError, match=r"rank 0 needs 82\.3 GiB on GPU 1, 23\.5 GiB free; "
                                         r"use --device-memory"):
        check_memory(plan, _FakeGpu(), MPI.COMM_SELF)
    small = memory_plan(1000, 1000, 1000, "float64", (1, 1), 256, Execution(1, "cupy"))
    check_memory(small, _FakeGpu(), MPI.COMM_SELF)  # fits: no error


@pytest.mark.mpi(min_size=1)
def test_ranks_on_one_gpu_count_each_other(comm):
    """Ranks of a node on the same GPU count each other (they share its
    free memory); on the CPU backend, or where a rank is not counted, 1."""
    from mpi4py import MPI
    from summa.planning.memorycheck import ranks_on_device
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    size = node.Get_size()
    node.Free()
    assert ranks_on_device(_FakeGpu(), comm) == size  # every rank: one fake GPU
    assert ranks_on_device(NumpyBackend(), comm) == 1
    assert ranks_on_device(_FakeGpu(), comm, counted=False) == 1


@pytest.mark.mpi(min_size=1)
def test_plan_command(comm):
    out = io.StringIO()
    assert cli.main(["plan", "--size", "100000", "--ranks", "2", "--dtype", "float32",
                     "--device-memory", "16GiB"], comm, out) == 0
    if comm.rank == 0:
        assert "out-of-core" in out.getvalue()
        # each rank's block 50000 x 100000, wider than tall: whole columns upload less
        assert re.search(r"C tiles of 50000 x \d+ \(1 x [2-9] per rank\)", out.getvalue())
        assert "copy-engine broadcasts (ipc) stage" in out.getvalue()  # auto on GPUs
        # matmul on NumPy arrays: no second copy of A or B, only C and the chunks
        assert re.search(r"\d+ MiB of page-locked chunks.*extra host memory is C \(37\.25 GiB",
                         out.getvalue())
    nccl = io.StringIO()
    assert cli.main(["plan", "--size", "100000", "--ranks", "2", "--dtype", "float32",
                     "--device-memory", "16GiB", "--comm", "nccl"], comm, nccl) == 0
    if comm.rank == 0:
        assert "copy-engine broadcasts (ipc) stage" not in nccl.getvalue()
        assert "host copies stage" in nccl.getvalue()  # the host's, whatever the broadcasts
        peak = [float(re.search(r"device ([\d.]+) GiB", o.getvalue()).group(1))
                for o in (out, nccl)]
        width = [int(re.search(r"panels of (\d+) columns", o.getvalue()).group(1))
                 for o in (out, nccl)]
        # the staging buffers take room: more memory, or narrower panels to fit
        assert max(peak) <= 16 and (peak[1] < peak[0] or width[0] < width[1])
    with pytest.raises(cli.UsageError, match="does not hold"):
        cli.main(["plan", "--ranks", "4", "--grid", "3x1"], comm, io.StringIO())
    # without --grid, the grid bench and multiply would take for that shape and dtype
    for args, grid in ((["--dtype", "float64"], "1x2"), (["--dtype", "float32"], "2x1"),
                       (["--dtype", "float64", "--backend", "numpy"], "2x1"),
                       (["--m", "4000", "--n", "1000"], "2x1"), (["--m", "1000", "--n", "4000"],
                                                                 "1x2")):
        text = io.StringIO()
        assert cli.main(["plan", "--size", "1000", "--ranks", "2", *args], comm, text) == 0
        assert comm.rank != 0 or f"(grid {grid})" in text.getvalue(), (args, text.getvalue())


@pytest.mark.mpi(min_size=1)
def test_plan_larger_than_the_node_is_refused_before_allocating(comm, monkeypatch):
    from summa.planning import memorycheck
    monkeypatch.setattr(memorycheck, "host_memory_total", lambda: 2**30)  # a 1 GiB node
    out = io.StringIO()
    # 12000^2 float64: A, B, C alone are 3.2 GiB over the ranks of one node
    with pytest.raises(cli.UsageError, match=r"rank\(s\) on rank \d+'s node need \d+\.\d GiB "
                                             r"of host memory, and the node has 1\.0 GiB in "
                                             r"all; use more nodes"):
        cli.main(["bench", "--size", "12000", "--backend", "numpy"], comm, out)
    # what fits is let through
    assert cli.main(["bench", "--size", "64", "--backend", "numpy", "--repeat", "1"], comm,
                    out) == 0


@pytest.mark.mpi(min_size=1)
def test_out_of_core_cuts_columns_when_a_row_of_c_does_not_fit(comm, rng):
    m, n, k = 21, 300, 50
    a, b, c0 = (random_array(rng, s, "float64") for s in ((m, k), (k, n), (m, n)))
    host = NumpyBackend()
    with ProcessGrid(comm) as grid:
        A, B, C = (DistMatrix.from_global(x, grid, host) for x in (a, b, c0))
        # two C tiles of one full row (width >= 150) and two panel slots of 8 need more
        # than 2000 elements, so the columns are cut too
        plan = held_plan(A, B, C, host, device_memory=2000 * 8, panel_width=8)
        stats = summa_out_of_core(plan, SweepOperands(A, B, C), host, beta=1.0)
        c = C.gather()
        widest = -(-n // grid.shape[1])
    assert stats.extra["device_bytes_planned"] <= 2000 * 8
    if widest >= 150:
        assert stats.extra["tiles"][1] > 1
    if comm.rank == 0:
        assert gemm_scaled_error(c, a, b, c0, 1.0, 1.0) <= 1


def test_plan_and_model_take_the_rank_count_from_the_grid_and_model_needs_no_profile():
    from mpi4py import MPI
    out = io.StringIO()
    # the seed case, planned on a laptop for eight 24 GB GPUs
    assert cli.main(["plan", "--size", "100000", "--dtype", "float64", "--grid", "2x4",
                     "--device-memory", "22GiB", "--hardware", "rtx3090x8"],
                    MPI.COMM_SELF, out) == 0
    assert "on 8 ranks (grid 2x4)" in out.getvalue() and "out-of-core" in out.getvalue()
    assert re.search(r"predicted by the model: [\d.]+ s", out.getvalue())  # on the same screen
    # the first user's eight RTX 3090s (a profile written from their datasheet): float64 is
    # the wall there, minutes of GEMM
    from summa.planning.profile import shipped_profile
    gpus = io.StringIO()
    assert cli.main(["plan", "--size", "100000", "--dtype", "float64", "--grid", "2x4",
                     "--device-memory", "22GiB", "--profile",
                     shipped_profile().replace("h200.json", "rtx3090x8.json")],
                    MPI.COMM_SELF, gpus) == 0
    seconds = float(re.search(r"predicted by the model: ([\d.]+) s", gpus.getvalue()).group(1))
    assert 300 < seconds < 900
    # and model says the memory side on its screen too
    both = io.StringIO()
    assert cli.main(["model", "--size", "100000", "--dtype", "float64", "--grid", "2x4",
                     "--device-memory", "22GiB"], MPI.COMM_SELF, both) == 0
    assert re.search(r"predicted [\d.]+ s", both.getvalue())
    assert re.search(r"out of core, C tiles of \d+ x \d+ .* peak [\d.]+ GiB on the GPU",
                     both.getvalue())
    model = io.StringIO()
    assert cli.main(["model", "--size", "65536", "--dtype", "float64", "--grid", "2x4"],
                    MPI.COMM_SELF, model) == 0
    text = model.getvalue()
    assert "hardware: h200" in text and "no --hardware or --profile given" in text
    assert "on 8 ranks, grid 2x4" in text
    assert re.search(r"predicted [\d.]+ s", text)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("trans_a,trans_b", [("N", "N"), ("T", "H")])
def test_host_held_distmatrix_streams_through_a_device(comm, rng, trans_a, trans_b):
    # on the CPU the NumPy "device" stands in; the budget forces several tiles
    from summa.api.multiply import host_matmul
    a = random_array(rng, (37, 50) if trans_a == "N" else (50, 37), "complex64")
    b = random_array(rng, (50, 29) if trans_b == "N" else (29, 50), "complex64")
    host = NumpyBackend()
    with ProcessGrid(comm) as grid:
        A, B = DistMatrix.from_global(a, grid, host), DistMatrix.from_global(b, grid, host)
        stats = summa.SummaStats()
        whole = memory_plan(37, 29, 50, "complex64", grid.shape, 4,
                            Execution(1, "numpy", device_budget=1 << 40,
                                      out_of_core=True)).device_bytes
        C = summa.matmul(A, B, device=host, trans_a=trans_a, trans_b=trans_b, alpha=0.5,
                         device_memory=str(whole * 2 // 3), panel_width=4, stats=stats)
        c = C.gather()
        assert stats.extra["out_of_core"] and C.backend.name == "numpy"
        assert stats.extra["tiles"][0] * stats.extra["tiles"][1] > 1 or C.local.size == 0
        with pytest.raises(ValueError, match="host-held"):
            host_matmul(A, DistMatrix.from_global(b, grid, _NotHost()), host)
    if comm.rank == 0:
        assert gemm_scaled_error(c, a, b, alpha=0.5, trans_a=trans_a, trans_b=trans_b) <= 1
    with pytest.raises(TypeError, match="device applies"):
        summa.matmul(a, b, device=host)


class _NotHost(NumpyBackend):
    name = "cupy-like"
    is_gpu = True  # its blocks are not host memory


def test_the_model_says_what_float64_on_int8_gains_on_the_first_users_gpus():
    from mpi4py import MPI
    from summa.planning.profile import shipped_profile
    rtx = shipped_profile().replace("h200.json", "rtx3090x8.json")
    seconds = {}
    for precision in ("default", "fp64-int8"):
        out = io.StringIO()
        assert cli.main(["model", "--profile", rtx, "--size", "100000", "--dtype", "float64",
                         "--grid", "2x4", "--precision", precision], MPI.COMM_SELF, out) == 0
        seconds[precision] = float(re.search(r"predicted ([\d.]+) s", out.getvalue()).group(1))
    assert seconds["default"] > 10 * seconds["fp64-int8"]  # the arithmetic was the wall there


def test_the_model_of_float64_on_int8_needs_its_samples(tmp_path):
    """The H200 profile has calibrated INT8 samples (predicted near native
    there, as measured); a profile without them says so, not guesses."""
    import json
    from mpi4py import MPI
    from summa.planning.profile import shipped_profile
    seconds = {}
    for precision in ("default", "fp64-int8"):
        out = io.StringIO()
        assert cli.main(["model", "--size", "32768", "--dtype", "float64", "--grid", "1x1",
                         "--precision", precision], MPI.COMM_SELF, out) == 0
        seconds[precision] = float(re.search(r"predicted ([\d.]+) s", out.getvalue()).group(1))
    assert 0.5 < seconds["fp64-int8"] / seconds["default"] < 1.5
    profile = json.load(open(shipped_profile()))
    profile["gemm"] = [g for g in profile["gemm"] if g.get("precision") != "fp64-int8"]
    bare = tmp_path / "no-int8.json"
    bare.write_text(json.dumps(profile))
    with pytest.raises(ValueError, match="no GEMM samples for float64/fp64-int8"):
        cli.main(["model", "--profile", str(bare), "--size", "4096", "--precision", "fp64-int8"],
                 MPI.COMM_SELF, io.StringIO())


def test_plan_of_fp64_int8_counts_its_scratch_and_predicts_from_int8_rates():
    """On a laptop: the eight 3090s' case with float64 on INT8 tensor cores,
    planned (its residues and sums counted: more device memory than float64,
    fewer rows per tile) and predicted from the profile's INT8 rates."""
    from mpi4py import MPI
    from summa.planning.profile import shipped_profile
    args = ["plan", "--size", "100000", "--dtype", "float64", "--grid", "2x4",
            "--device-memory", "22GiB", "--nb", "4096", "--profile",
            shipped_profile().replace("h200.json", "rtx3090x8.json")]
    native, emulated = io.StringIO(), io.StringIO()
    assert cli.main(args, MPI.COMM_SELF, native) == 0
    assert cli.main(args + ["--precision", "fp64-int8"], MPI.COMM_SELF, emulated) == 0
    from summa.precision import ozaki_gpu
    count = ozaki_gpu.moduli_for(4096)
    assert f"fp64-int8: each panel product's int8 residues ({count} moduli)" in emulated.getvalue()
    # which GPUs load its kernels shipped and where a first call compiles them, said
    # beside the prediction, for fp64-int8 alone
    assert "fp64-int8's kernels come compiled for sm_75 to sm_120" in emulated.getvalue()
    assert "the first call on a machine compiles them" in emulated.getvalue()
    assert "compile" not in native.getvalue()

    def tile_rows(text):
        return int(re.search(r"C tiles of (\d+) x", text).group(1))
    assert tile_rows(emulated.getvalue()) < tile_rows(native.getvalue())
    t_native, t_emulated = (float(re.search(r"predicted by the model: ([\d.]+) s",
                                            x.getvalue()).group(1)) for x in (native, emulated))
    assert t_emulated < t_native / 5  # the card's INT8 rate: 24 s against 466
    # the fp64-int8 plan names the native time beside its own: the native plan's
    beside = re.search(r"native float64 by the same profile: ([\d.]+) s", emulated.getvalue())
    assert beside and float(beside.group(1)) == t_native
    # out of core, the screen says what each precision kept of in-memory's rate
    assert "host link keeps up" in native.getvalue()
    assert "fp64-int8's products timed a panel at a time" in emulated.getvalue()
    assert "folds C once" not in emulated.getvalue()  # out of core: a fold a panel
    # in memory on a grid, where they fit: the panel sums' memory, each rank's 32768 x 16384
    # of C a modulus, counted in its peak
    grid = io.StringIO()
    assert cli.main(["plan", "--size", "32768", "--grid", "1x2", "--nb", "4096", "--precision",
                     "fp64-int8"], MPI.COMM_SELF, grid) == 0
    sums = float(re.search(r"folds C once where its device also holds the sums \(([\d.]+) GiB",
                           grid.getvalue()).group(1))
    assert sums >= 4 * ozaki_gpu.moduli_for(32768) * 32768 * 16384 / 2**30 - 0.01
    peak = float(re.search(r"peak per rank: device ([\d.]+) GiB", grid.getvalue()).group(1))
    assert peak > sums


def test_tiles_asked_for_cut_c_so_and_still_multiply(rng, monkeypatch):
    """SUMMA_OOC_TILES=RxC: out of core, that many tiles per rank (to measure
    other cuts than the planner's fewest), the product still right; a cut
    that cannot be, or does not fit the budget, gets one clear error."""
    from mpi4py import MPI
    m, n, k = 45, 38, 64
    a, b = random_array(rng, (m, k), "float64"), random_array(rng, (k, n), "float64")
    host = NumpyBackend()
    monkeypatch.setenv("SUMMA_OOC_TILES", "3x2")
    plan = memory_plan(m, n, k, "float64", (1, 1), 8,
                       Execution(1, "numpy", device_budget=1 << 30, out_of_core=True))
    assert plan.tiles == (3, 2) and plan.tile == (15, 19)
    with ProcessGrid(MPI.COMM_SELF) as grid:
        A, B, C = _held(grid, a, b)
        plan = held_plan(A, B, C, host, device_memory=1 << 30, panel_width=8)
        stats = summa_out_of_core(plan, SweepOperands(A, B, C), host)
        assert stats.extra["tiles"] == [3, 2]
        assert gemm_scaled_error(C.gather(), a, b) <= 1
    for text, message in (("3", "expected RxC"), ("0x2", "do not cut"), ("3x39", "do not cut")):
        monkeypatch.setenv("SUMMA_OOC_TILES", text)
        with pytest.raises(ValueError, match=message):
            memory_plan(m, n, k, "float64", (1, 1), 8,
                        Execution(1, "numpy", device_budget=1 << 30, out_of_core=True))
    monkeypatch.setenv("SUMMA_OOC_TILES", "1x1")
    with pytest.raises(ValueError, match="1 x 1 tiles of 45 x 38 need"):
        memory_plan(m, n, k, "float64", (1, 1), 8,
                    Execution(1, "numpy", device_budget=8 * 2000, out_of_core=True))


def test_an_asked_cut_that_fits_one_c_tile_at_a_time_runs_so(rng, monkeypatch):
    """A cut asked for (SUMMA_OOC_TILES) whose two C tiles (one multiplied,
    one going home) do not fit the budget, but one does: the plan keeps one
    on the device (each tile waits for the last one's write-back), the sweep
    makes one buffer, and the product is right; with room for two, two."""
    from mpi4py import MPI
    from summa.execution import sweep
    from summa.planning import tiling
    m, n, k, nb = 45, 38, 64, 8
    a, b = random_array(rng, (m, k), "float64"), random_array(rng, (k, n), "float64")
    monkeypatch.setenv("SUMMA_OOC_TILES", "3x2")
    monkeypatch.setenv("SUMMA_UPLOAD_LEAD", "0")
    one = 8 * tiling.ooc_elements(15, 19, 6, tiling.SweepPanels(nb, 2), c_buffers=1)
    made = []
    real_init = sweep.Sweep.__init__

    def spy(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        made.append(len(self.c_bufs))
    monkeypatch.setattr(sweep.Sweep, "__init__", spy)
    host = NumpyBackend()
    for budget, buffers in ((one, 1), (one + 8 * 15 * 19, 2)):
        plan = memory_plan(m, n, k, "float64", (1, 1), nb,
                           Execution(1, "numpy", device_budget=budget, out_of_core=True))
        assert (plan.tiles, plan.c_buffers) == ((3, 2), buffers)
        assert plan.device_bytes <= budget
        with ProcessGrid(MPI.COMM_SELF) as grid:
            A, B, C = _held(grid, a, b)
            plan = held_plan(A, B, C, host, device_memory=budget, panel_width=nb)
            summa_out_of_core(plan, SweepOperands(A, B, C), host)
            assert gemm_scaled_error(C.gather(), a, b) <= 1
        assert made[-1] == buffers


def test_summa_plan_says_one_c_tile_at_a_time_and_counts_its_write_backs(monkeypatch):
    """`summa plan` of a cut that fits one C tile at a time says so, and its
    model counts each earlier tile's write-back as exposed (the next tile
    waits for it); a cut that fits two tiles (with narrower panels) does
    neither."""
    from mpi4py import MPI

    def plan_text(tiles):
        monkeypatch.setenv("SUMMA_OOC_TILES", tiles)
        out = io.StringIO()
        assert cli.main(["plan", "--size", "32768", "--ranks", "1", "--backend", "cupy",
                         "--device-memory", "8GiB"], MPI.COMM_SELF, out) == 0
        return out.getvalue()
    two, one = plan_text("3x1"), plan_text("2x1")
    assert "one C tile on the device at a time" in one and "one C tile" not in two
    assert "the write-backs the next tile waits for" in one
    assert "the last write-back" in two and "waits for" not in two
    exposed = [float(re.search(r"exposed\s+([\d.]+) s", t).group(1)) for t in (two, one)]
    rate = float(re.search(r"down at [\d.]+ / ([\d.]+) GB/s", one).group(1))
    one_tile = 16384 * 32768 * 8 / 1e9  # GB: the first of two tiles, waited for
    assert exposed[1] >= exposed[0] + 0.95 * one_tile / rate, (exposed, rate)


@pytest.mark.parametrize("budget_gib", [12, 24])
def test_fp64_int8_cuts_c_both_ways_to_upload_least(budget_gib):
    """fp64-int8's scratch grows with a tile's rows plus columns: its cut is
    the one that fits and uploads least (B once per row of tiles, A once per
    column), not whole rows of C; other precisions keep whole rows."""
    from summa.planning import tiling
    ml = nl = k = 32768
    budget = parse_bytes(f"{budget_gib}GiB") // 8
    int8 = tiling.Int8Products(rows=tiling.FP64_INT8_ROWS)  # as memory_plan searches

    def fits(r, c, emulated):
        tm, tn = -(-ml // r), -(-nl // c)
        return tiling.ooc_elements(tm, tn, r * c,
                                   tiling.SweepPanels(16384, 2, emulated=emulated)) <= budget
    rows, cols = tiling.ooc_tiles(ml, nl, budget, tiling.SweepPanels(16384, 2, emulated=int8))
    assert fits(rows, cols, int8)
    least = min(r * nl + c * ml for r in range(1, 65) for c in range(1, 65)
                if fits(r, c, int8))
    assert rows * nl + cols * ml == least
    whole = tiling.ooc_tiles(ml, nl, budget, tiling.SweepPanels(16384, 2))
    assert whole[1] == 1  # native: whole rows while they fit
    plan = memory_plan(ml, nl, k, "float64", (1, 1), 16384,
                       Execution(1, "cupy", out_of_core=True, device_budget=budget * 8,
                                 precision="fp64-int8"))
    assert plan.tiles == (rows, cols) and plan.device_bytes <= budget * 8


def test_fp64_int8_never_streams_c_as_one_tile_where_it_has_rows_to_cut():
    """A tile's first panel goes up whole before its first fp64-int8 product:
    where all of C would fit one tile, fp64-int8 still cuts it in two rows of
    tiles (the least upload beyond one tile), native precisions take one;
    a C of one row stays one tile."""
    from summa.planning import tiling
    budget = parse_bytes("200GiB") // 8
    int8 = tiling.Int8Products()
    native, emulated = tiling.SweepPanels(16384, 3), tiling.SweepPanels(16384, 3, emulated=int8)
    assert tiling.ooc_tiles(32768, 32768, budget, native) == (1, 1)
    assert tiling.ooc_tiles(32768, 32768, budget, emulated) == (2, 1)
    assert tiling.ooc_tiles(1, 32768, budget, emulated) == (1, 1)



class _HostAsGpu(NumpyBackend):
    """The NumPy backend under a GPU's name: the sweep takes its GPU branch
    (a GPU's plan, its mover) while the arrays stay NumPy's (one rank: the
    broadcasters of several would copy "device" buffers as CuPy's)."""
    name, is_gpu = "cupy", True


def test_the_sweep_copies_on_the_threads_and_in_the_way_its_plan_says(rng, monkeypatch):
    """The GPU's mover gets the plan's host copies and copy threads, not what
    the options or the cores say when the sweep runs (the mover here: host
    copies under a recording stand-in); a GPU's plan without them is refused."""
    from dataclasses import replace
    from mpi4py import MPI
    from summa import options
    from summa.device import staging
    from summa.execution import outofcore
    from summa.planning.planner import Machine, make_plan
    from summa.planning.request import PlanRequest
    m, n, k = 40, 36, 24
    a, b = random_array(rng, (m, k), "float64"), random_array(rng, (k, n), "float64")
    host, device = NumpyBackend(), _HostAsGpu()
    made = []

    def mover(device, dtype, host_copies, threads):
        made.append((host_copies, threads))
        return movers.HostMover(device, dtype)
    monkeypatch.setattr(outofcore, "CudaMover", mover)
    with ProcessGrid(MPI.COMM_SELF) as grid:
        A, B = DistMatrix.from_global(a, grid, host), DistMatrix.from_global(b, grid, host)
        with options.set(copy_threads=3, host_copies="lock"):
            plan = make_plan((m, n, k), "float64", Machine("cupy", 1, ranks_on_node=1),
                             PlanRequest(out_of_core=True, device_memory=1 << 20, panel_width=8))
        assert (plan.host_copies, plan.copy_threads) == ("lock", 3)
        # what the sweep would find if it decided again when it runs
        monkeypatch.setattr(staging, "usable_cores", lambda: 64)
        monkeypatch.setattr(staging, "copy_threads", lambda ranks_on_node=1: 97)
        C = DistMatrix.zeros((m, n), "float64", grid, host)
        operands = outofcore.SweepOperands(A, B, C)
        with options.set(copy_threads=5, host_copies="stage"):
            final, broadcasters = sweepsetup.prepared_sweep(plan, operands, device)
            stats = outofcore.run_out_of_core(final, operands, device,
                                              broadcasters=broadcasters)
        assert made == [("lock", 3)] and stats.extra["plan"]["copy_threads"] == 3
        assert gemm_scaled_error(C.gather(), a, b) <= 1
        for wrong in (dict(host_copies=None), dict(copy_threads=None)):
            with pytest.raises(ValueError, match="host copies go and on how many threads"):
                outofcore.run_out_of_core(replace(final, **wrong), operands, device,
                                          broadcasters=broadcasters)


class _Int8AsGpu(_HostAsGpu):
    """:class:`_HostAsGpu` whose fp64-int8 products are summa.precision.ozaki_gpu's
    on the CPU stand-in for CuPy (tests/fake_cupy_kernels.py), each GEMM's
    scheme noted."""

    def __init__(self):
        super().__init__()
        import fake_cupy_kernels
        self.int8, self.schemes = fake_cupy_kernels.Backend(), []

    def has_int8_tensor_cores(self) -> bool:
        return True

    def gemm(self, alpha, a, b, c, beta=1.0, precision=None, conj=(False, False), scheme=None):
        from summa.precision import ozaki_gpu
        assert precision == "fp64-int8" and not any(conj)
        self.schemes.append(scheme)
        ozaki_gpu.gemm(alpha, a, b, c, beta, backend=self.int8, scheme=scheme)


def _fp64_int8_sweep(rng, monkeypatch, device_memory: int) -> tuple:
    """float64 120 x 40 x 96 out of core in 48-wide panels under
    `device_memory`, its fp64-int8 products made on the CPU stand-in for
    CuPy's kernels: ``(plan, the device that ran them, the product's scaled
    error)``."""
    from mpi4py import MPI
    from summa.execution import outofcore
    from summa.planning.planner import Machine, make_plan
    from summa.planning.request import PlanRequest
    use_fake_cupy(monkeypatch)
    monkeypatch.setattr(outofcore, "CudaMover",
                        lambda device, dtype, copies, threads: movers.HostMover(device, dtype))
    m, n, k = 120, 40, 96
    a, b = random_array(rng, (m, k), "float64"), random_array(rng, (k, n), "float64")
    plan = make_plan((m, n, k), "float64", Machine("cupy", 1, ranks_on_node=1),
                     PlanRequest(out_of_core=True, device_memory=device_memory, panel_width=48,
                                 precision="fp64-int8"))
    device = _Int8AsGpu()
    with ProcessGrid(MPI.COMM_SELF) as grid:
        A, B, C = _held(grid, a, b)
        operands = outofcore.SweepOperands(A, B, C)
        final, broadcasters = sweepsetup.prepared_sweep(plan, operands, device)
        outofcore.run_out_of_core(final, operands, device, broadcasters=broadcasters)
        return plan, device, gemm_scaled_error(C.gather(), a, b)


def test_the_sweep_hands_its_fp64_int8_products_the_plans_rows(rng, monkeypatch):
    """Where a tile's products do not fit whole, the plan's chunks of rows
    (Plan.scheme) reach every GEMM of the sweep, which then makes its
    product within the gauge in chunks of that many rows of each tile or
    strip (FP64_INT8_ROWS made small so that small tiles take chunks)."""
    from summa.planning import tiling
    from summa.precision import ozaki_gpu
    monkeypatch.setattr(tiling, "FP64_INT8_ROWS", 16)
    plan, device, error = _fp64_int8_sweep(rng, monkeypatch, 260_000)
    assert (plan.memory.tile, plan.memory.int8_rows) == ((60, 40), 30)  # 2 chunks a tile
    assert error <= 1
    assert device.schemes and all(s == plan.scheme for s in device.schemes)
    # each GEMM (a tile's panel, whole: its rows make one strip) in 2 chunks
    assert device.int8.gemms == 2 * len(device.schemes) * ozaki_gpu.moduli_for(48)


def test_the_sweep_folds_every_integer_product_in_one_pass_where_room_is_left(
        rng, monkeypatch):
    """With room beside its tiles (MemoryPlan.int8_planes), every GEMM of
    the sweep folds all its integer products in one pass over the sums
    (Plan.scheme) and the product stays within the gauge."""
    from summa.precision import ozaki_gpu
    plan, device, error = _fp64_int8_sweep(rng, monkeypatch, 2_000_000)
    count = ozaki_gpu.moduli_for(48)
    assert plan.memory.int8_planes == count > ozaki_gpu.PLANES
    assert error <= 1
    assert device.schemes and all(s.planes == count for s in device.schemes)
