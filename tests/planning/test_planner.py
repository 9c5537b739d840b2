"""The planner (:mod:`summa.planning.planner`): one Plan with every decision, the
same decisions the entry points made before it, and ``summa plan`` printing
the Plan a run takes."""

import io
import itertools
import json
import math
from dataclasses import replace

import numpy as np
import pytest
from mpi4py import MPI

from summa import cli, options
from summa.device.backend import NumpyBackend
from summa.device.staging import copy_threads, ring_bytes
from summa.distribution.grid import grid_for
from summa.planning.profile import Profile, shipped_profile
from summa.planning.memory import Execution, host_traffic, memory_plan, parse_bytes
from summa.planning.plan import Machine, Plan
from summa.planning.planner import make_plan, restage
from summa.planning.request import PlanRequest
from summa.planning.tiling import TRAFFIC_GAIN
from summa.planning.widths import LEAST_OOC_WIDTH, MIN_OOC_WIDTH, MIN_OOC_WIDTH_INT8
from summa.planning.tuning import default_panel_width

SHAPES = [(1000, 1000, 1000), (100_000, 100_000, 100_000), (65536, 4096, 32768),
          (4096, 65536, 100), (37, 29, 50)]
DTYPES = ["float64", "float32", "complex128", "float16"]


class _FakeGpu:
    """Just enough of the CuPy backend for a live plan on one rank."""
    name, device, is_gpu = "cupy", 0, True

    def __init__(self, free):
        self.free = free

    def memory_free(self):
        return self.free

    def device_id(self):
        return "0000:01:00.0"


@pytest.mark.parametrize("ranks", [1, 2, 6, 8])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_plans_for_another_machine_decide_as_before(shape, dtype, ranks):
    """GPUs planned from afar, as ``summa plan`` does: the grid, the width
    and the memory plan (tiles, slots, staging) those functions give; out of
    core the default width or a narrower one (:func:`_ooc_widths`) that
    moves fewer bytes, refused only where none fits, and the copy threads
    of all the ranks on one node."""
    m, n, k = shape
    for budget, precision, staged in itertools.product(
            (None, "2GiB", "22GiB"), (None, "tf32", "fp64-int8"), ((False, False), (True, True))):
        if precision == "tf32" and dtype != "float32" or \
                precision == "fp64-int8" and dtype not in ("float64", "complex128"):
            continue
        grid = grid_for(ranks, m, n, "cupy", dtype)
        ooc = budget is not None
        widths = _ooc_widths(dtype, precision, k) if ooc else \
            [default_panel_width("cupy", dtype, precision)]
        wants = {}
        for width in widths:
            try:
                want = memory_plan(m, n, k, dtype, grid, width,
                                   Execution(1, "cupy",
                                             device_budget=parse_bytes(budget) if ooc else None,
                                             out_of_core=ooc, precision=precision, staged=staged,
                                             copy_threads=copy_threads(ranks)))
                wants[want.chunk if ooc else width] = want
            except ValueError as exc:
                assert "too small" in str(exc)
        if not wants:
            with pytest.raises(ValueError, match="too small"):
                make_plan(shape, dtype, Machine("cupy", ranks),
                          PlanRequest(device_memory=budget, precision=precision), staged=staged)
            continue
        plan = make_plan(shape, dtype, Machine("cupy", ranks),
                         PlanRequest(device_memory=budget, precision=precision), staged=staged)
        width = plan.memory.chunk if ooc else plan.panel_width
        assert plan.grid == grid and plan.memory == wants[width]
        assert plan.panel_width == (width if width < min(widths[0], k) else widths[0])
        moved = {w: host_traffic(x, shape, grid) for w, x in wants.items()} if ooc else {}
        assert all(moved[width] <= x for x in moved.values()) or \
            moved[width] <= min(moved.values()) / TRAFFIC_GAIN
        assert plan.out_of_core == ooc and plan.device_budget == (parse_bytes(budget) if ooc else None)
        assert plan.copy_threads == (copy_threads(ranks) if ooc else None)


def _ooc_widths(dtype, precision, k: int) -> list:
    """The default out-of-core width first, then the narrower ones tried:
    its half and quarter; fp64-int8's K cut into even panels (widths a
    multiple of 32), as few as the default takes and up to three more, and
    as many as its half takes, none under MIN_OOC_WIDTH_INT8."""
    widest = default_panel_width("cupy", dtype, precision, out_of_core=True)
    if precision != "fp64-int8":
        return [widest] + [w for w in (widest // 2, widest // 4) if w >= MIN_OOC_WIDTH]
    fewest = math.ceil(k / widest)
    counts = {fewest, fewest + 1, fewest + 2, fewest + 3, math.ceil(k / (widest // 2))}
    even = {math.ceil(math.ceil(k / count) / 32) * 32 for count in counts}
    return [widest] + sorted((w for w in even if MIN_OOC_WIDTH_INT8 <= w < widest), reverse=True)


def test_a_tight_budget_takes_narrower_panels_where_taller_tiles_move_fewer_bytes():
    """float64 65536 x 8192 x 65536 under 8 GiB: 2048-wide panels leave room
    for C whole (B crosses the link once) where 4096 took 2 x 1."""
    shape = (65536, 8192, 65536)
    plan = make_plan(shape, "float64", Machine("cupy", 1), PlanRequest(device_memory="8GiB"))
    wide = memory_plan(*shape, "float64", (1, 1), 4096,
                       Execution(1, "cupy", device_budget=8 << 30, out_of_core=True))
    assert (plan.panel_width, plan.memory.tiles, wide.tiles) == (2048, (1, 1), (2, 1))
    assert host_traffic(plan.memory, shape, (1, 1)) < TRAFFIC_GAIN * host_traffic(wide, shape, (1, 1))
    whole = make_plan(shape, "float64", Machine("cupy", 1), PlanRequest(device_memory="60GiB"))
    assert (whole.panel_width, whole.memory.tiles) == (4096, (1, 1))  # nothing to gain


@pytest.mark.parametrize("dtype, precision", [("float16", None), ("complex128", "fp64-int8")])
def test_a_budget_too_small_for_the_preferred_widths_takes_a_narrower_one(dtype, precision):
    """A budget that fits 256-wide panels' tiles but not the preferred
    widths' (all of K here): the plan takes the widest of K halved that
    fits, down to LEAST_OOC_WIDTH, not a refusal (the randomized sweep's tiny budgets on a GPU);
    a width the caller asked for is kept, and refused."""
    shape = (12, 13, 1348)

    def fits(width, budget):
        try:
            return memory_plan(*shape, dtype, (1, 1), width,
                               Execution(1, "cupy", device_budget=budget, out_of_core=True,
                                         precision=precision))
        except ValueError:
            return None
    budget = next(b for b in range(1 << 10, 1 << 30, 1 << 10) if fits(256, b))
    assert fits(shape[2], budget) is None
    plan = make_plan(shape, dtype, Machine("cupy", 1),
                     PlanRequest(device_memory=budget, precision=precision))
    halved = (shape[2] // 2, shape[2] // 4, LEAST_OOC_WIDTH)  # as the planner goes
    assert plan.panel_width == next(w for w in halved if fits(w, budget))
    assert plan.memory == fits(plan.panel_width, budget)
    assert f"{plan.panel_width}-wide panels" in plan.note and "KiB" in plan.note
    assert f"{plan.panel_width}-wide panels" in str(plan)  # what summa plan prints
    with pytest.raises(ValueError, match="too small"):  # not even the least width's tiles
        make_plan(shape, dtype, Machine("cupy", 1),
                  PlanRequest(device_memory=budget - (1 << 10), precision=precision))
    with pytest.raises(ValueError, match="too small"):
        make_plan(shape, dtype, Machine("cupy", 1),
                  PlanRequest(device_memory=budget, precision=precision, panel_width=shape[2]))


def test_a_budget_that_cuts_c_into_too_many_tiles_is_refused_with_one_that_does_not():
    """float64 8192³ under 100 KiB would take one-element tiles (2**28
    GEMMs): refused, naming the least power-of-two budget that plans at
    most MAX_SWEEP_GEMMS: that budget is taken, half of it refused.
    Steps of large GEMMs are planned however many (K = 1.2e6 under 2 GiB). 1-wide
    panels of K = 70000 are too many on any budget: refused, naming a
    width."""
    import re
    from summa.planning.widths import MAX_SWEEP_GEMMS
    with pytest.raises(ValueError, match="too small to finish") as refused:
        make_plan((8192,) * 3, "float64", Machine("cupy", 1), PlanRequest(device_memory="100KiB"))
    assert "100.0 KiB" in str(refused.value) and "8192 x 8192 tiles" in str(refused.value)
    enough = re.search(r"at least ([\d.]+ \w+)", str(refused.value)).group(1).replace(" ", "")
    plan = make_plan((8192,) * 3, "float64", Machine("cupy", 1),
                     PlanRequest(device_memory=enough))
    rows, cols = plan.memory.tiles
    assert 1 < rows * cols * -(-8192 // plan.panel_width) <= MAX_SWEEP_GEMMS
    half = f"{parse_bytes(enough) // 2}B"
    with pytest.raises(ValueError, match="too small to finish"):
        make_plan((8192,) * 3, "float64", Machine("cupy", 1), PlanRequest(device_memory=half))
    big = make_plan((100000, 100000, 1200000), "float64", Machine("cupy", 1),
                    PlanRequest(device_memory="2GiB"))
    (rows, cols), width = big.memory.tiles, big.panel_width
    assert rows * cols * -(-1200000 // width) > MAX_SWEEP_GEMMS
    # panels so narrow that no budget would do: the width named, not a budget
    with pytest.raises(ValueError, match=r"take wider panels \(--nb; at least \d+ columns"):
        make_plan((70000,) * 3, "float64", Machine("cupy", 1),
                  PlanRequest(device_memory="1GiB", panel_width=1))


def _two_at_a_time(shape, dtype, budget, width):
    """The fewest tiles whose sweep fits `budget` with two C tiles."""
    from summa.planning import tiling
    ml, nl, k = shape
    item = np.dtype(dtype).itemsize
    return tiling.ooc_tiles(ml, nl, parse_bytes(budget) // item,
                            tiling.SweepPanels(min(width, k), 2, copies=(True, False)))


def test_where_the_host_link_bounds_one_c_tile_at_a_time_moves_fewer_bytes():
    """float64 32768³ under 8 GiB is bound by the host link: one C tile at
    a time leaves room for 2 x 1 tiles (B up twice) where two at a time
    take 3 x 1 or more; what it moves, its waited write-back counted twice,
    is less than any two-buffered width's."""
    from summa.planning.memory import waited_write_backs
    shape = (32768, 32768, 32768)
    plan = make_plan(shape, "float64", Machine("cupy", 1), PlanRequest(device_memory="8GiB"))
    assert (plan.memory.tiles, plan.memory.c_buffers) == ((2, 1), 1)
    assert plan.memory.device_bytes <= 8 << 30
    cost = host_traffic(plan.memory, shape, (1, 1)) + waited_write_backs(plan.memory)
    assert waited_write_backs(plan.memory) == 16384 * 32768
    for width in (4096, 2048):
        rows, cols = _two_at_a_time(shape, "float64", "8GiB", width)
        assert rows * cols > 2
        assert cost < TRAFFIC_GAIN * (32768 ** 2 * (cols + rows + 1))
    assert "one C tile on the device at a time" in str(plan)


@pytest.mark.parametrize("storage", [("rows", "rows"), ("cols", "cols")])
def test_at_equal_bytes_fewer_c_tiles_one_at_a_time_win(storage):
    """float64 65536 x 16384 x 32768 under 8 GiB (link-bound): 2 x 1 tiles
    one at a time move what 3 x 1 two at a time move (B once more, against
    one waited write-back of half of C, counted twice); the fewer tiles win
    (the same cut, transposed, ran 1.39 s against 1.59 on an H200). By
    whatever way the operands lie: Fortran operands of a block this tall
    are cut by rows (they upload less)."""
    from summa.planning.tiling import moved_elements
    shape = (65536, 16384, 32768)
    plan = make_plan(shape, "float64", Machine("cupy", 1), PlanRequest(device_memory="8GiB"),
                     host_held=True, storage=storage)
    assert (plan.memory.tiles, plan.memory.c_buffers) == ((2, 1), 1)
    assert plan.memory.device_bytes <= 8 << 30
    two = _two_at_a_time(shape, "float64", "8GiB", 2048)
    assert two == (3, 1)
    assert moved_elements(shape, (2, 1), 1) == moved_elements(shape, two, 2)
    assert "one C tile on the device at a time" in str(plan)


@pytest.mark.parametrize("shape, dtype, budget", [
    ((65536, 65536, 65536), "float64", "24GiB"),  # GEMM-bound: tall tiles
    ((32768, 32768, 32768), "complex128", "8GiB"),  # 4 flops an element more
    ((32768, 32768, 4096), "float64", "2GiB"),  # short K: no taller tile fits
])
def test_two_c_tiles_stay_where_the_gemms_bound_or_one_saves_nothing(shape, dtype, budget):
    """Where the GEMMs do enough work per byte moved (at least
    HOST_LINK_BALANCE flops), a waited write-back would only expose time;
    where one C tile at a time fits no fewer tiles, it saves nothing:
    both keep two C tiles."""
    from summa.planning.tiling import HOST_LINK_BALANCE
    plan = make_plan(shape, dtype, Machine("cupy", 1), PlanRequest(device_memory=budget))
    rows, cols = plan.memory.tiles
    assert rows * cols > 1 and plan.memory.c_buffers == 2
    m, n, k = shape
    flops = (8 if dtype.startswith("complex") else 2) * m * n * k
    moved = host_traffic(plan.memory, shape, (1, 1)) * np.dtype(dtype).itemsize
    if flops < HOST_LINK_BALANCE * moved:  # link-bound: one at a time fits no fewer tiles
        from summa.planning import tiling
        budget_elements = parse_bytes(budget) // np.dtype(dtype).itemsize
        one = tiling.ooc_elements(-(-m // (rows * cols - 1)), n, 2, tiling.SweepPanels(
            plan.memory.chunk, plan.memory.slots, (True, False)), c_buffers=1)
        assert one > budget_elements


@pytest.mark.parametrize("budget, width", [("24GiB", 13664), ("21.6GiB", 10240)])
def test_fp64_int8_under_a_tight_budget_takes_the_fewest_even_panels_whose_tiles_fit(budget,
                                                                                     width):
    """fp64-int8 40960³ under 24 GiB: K in three even panels (13664 wide)
    leaves room for 2 x 2 tiles where 16384 took 3 x 2; under 21.6 GiB (a
    24 GiB GPU's default budget) three do not, four (10240) do: fewer folds
    of each tile than 8192's five, which fit as well; never 4096 (its
    products lose more than the bytes save). 32768³ under 24 GiB takes
    8192, whose 2 x 1 tiles move a quarter fewer bytes than 16384's 2 x 2
    (of fewer bytes the planner asks first)."""
    def plan(n, device_memory=budget):
        return make_plan((n, n, n), "float64", Machine("cupy", 1),
                         PlanRequest(device_memory=device_memory, precision="fp64-int8"))
    big, small = plan(40960), plan(32768, "24GiB")
    assert (big.panel_width, big.memory.tiles) == (width, (2, 2))
    assert (small.panel_width, small.memory.tiles) == (8192, (2, 1))
    narrower = memory_plan(40960, 40960, 40960, "float64", (1, 1), 8192,
                           Execution(1, "cupy", device_budget=parse_bytes(budget),
                                     out_of_core=True, precision="fp64-int8"))
    assert narrower.tiles == (2, 2)  # as few bytes: the fewer panels won
    wider = memory_plan(40960, 40960, 40960, "float64", (1, 1), width + 32,
                        Execution(1, "cupy", device_budget=parse_bytes(budget),
                                  out_of_core=True, precision="fp64-int8"))
    assert wider.tiles != (2, 2) or -(-40960 // (width + 32)) == -(-40960 // width)


def test_the_model_times_a_sweep_a_panel_at_a_time():
    """One rank out of core runs a product a panel: the model's GEMMs are
    each panel's at the profile's rate for its width (fp64-int8's rise with
    it: each product folds the tile), not one GEMM over all of K."""
    from summa.planning.prediction import predict_plan
    profile = Profile.load(shipped_profile())

    def gemms(width):
        plan = make_plan((40960,) * 3, "float64", Machine("cupy", 1),
                         PlanRequest(device_memory="24GiB", precision="fp64-int8",
                                     panel_width=width))
        tm, tn = plan.memory.tile
        assert plan.memory.tiles == (2, 2) and plan.memory.chunk == width
        want = 4 * (40960 // width) * 2 * tm * tn * width / profile.gemm_rate(
            tm, tn, width, "float64", "fp64-int8")
        return predict_plan(plan)["split"]["gemm"], want
    (narrow, narrow_want), (wide, wide_want) = gemms(8192), gemms(10240)
    assert narrow == pytest.approx(narrow_want) and wide == pytest.approx(wide_want)
    assert wide < narrow


@pytest.mark.parametrize("dtype", ["float64", "complex64"])
@pytest.mark.parametrize("budget", [None, 4000, 9000, 60_000, 1 << 20])
@pytest.mark.parametrize("shape", [(90, 70, 50), (300, 200, 100), (1, 500, 3)])
def test_live_plans_decide_as_before(shape, dtype, budget):
    """This machine on the NumPy backend, as choose_memory_mode decided
    before make_plan: out of core where asked for or capped (to the cap, or
    1 GiB), in memory otherwise; the tiles memory_plan cuts for the budget,
    or its error where none fits."""
    m, n, k = shape
    host = NumpyBackend()
    for out_of_core, width in itertools.product((None, True, False), (None, 8, 64)):
        ooc = bool(out_of_core) or budget is not None
        want_budget = (budget or 1 << 30) if ooc else None
        nb = width or default_panel_width("numpy", dtype, None, out_of_core=ooc)
        try:
            want = memory_plan(m, n, k, dtype, (1, 1), nb,
                               Execution(1, "numpy", device_budget=want_budget, out_of_core=ooc))
        except ValueError as exc:
            with pytest.raises(ValueError) as got:
                make_plan(shape, dtype, Machine.live(MPI.COMM_SELF, host),
                          PlanRequest(out_of_core=out_of_core, device_memory=budget,
                                      panel_width=width))
            assert str(got.value) == str(exc)
            continue
        plan = make_plan(shape, dtype, Machine.live(MPI.COMM_SELF, host),
                         PlanRequest(out_of_core=out_of_core, device_memory=budget,
                                     panel_width=width))
        assert (plan.device_budget, plan.memory, plan.panel_width) == (want_budget, want, nb)


def test_host_held_operands_stay_on_the_host_on_gpus_or_under_a_cap():
    """The rule of summa.matmul on NumPy arrays: out of core on GPUs (or
    under `device_memory`) with panels; in memory otherwise, the cap then
    ignored."""
    gpu, cpu = Machine("cupy", 2, free_device=80 << 30), Machine("numpy", 2)
    shape = (4096, 4096, 4096)
    assert make_plan(shape, "float64", gpu, host_held=True).out_of_core
    assert not make_plan(shape, "float64", cpu, host_held=True).out_of_core
    assert make_plan(shape, "float64", cpu, PlanRequest(device_memory="1MiB"),
                     host_held=True).out_of_core
    strips = make_plan(shape, "float64", gpu, PlanRequest(schedule="strips"), host_held=True)
    assert not strips.out_of_core and strips.grid == (2, 1)
    asked = make_plan(shape, "float64", cpu,
                      PlanRequest(out_of_core=False, device_memory="1MiB"), host_held=True)
    assert not asked.out_of_core and asked.device_budget is None


def test_free_memory_of_a_described_machine_decides_the_mode(monkeypatch):
    """A GPU figure: in memory where it fits, out of core to 90 % of it
    where not (with the note), and a too-small figure names the shortfall
    where in memory was asked for."""
    shape = (60_000, 60_000, 60_000)
    roomy = make_plan(shape, "float64", Machine("cupy", 1, free_device=200 << 30))
    assert not roomy.out_of_core and roomy.note is None
    tight = make_plan(shape, "float64", Machine("cupy", 1, free_device=24 << 30))
    assert tight.out_of_core and tight.device_budget == int(0.9 * (24 << 30))
    assert "does not fit" in tight.note and tight.memory.device_bytes <= tight.device_budget
    with pytest.raises(ValueError, match="use --device-memory"):
        make_plan(shape, "float64", Machine("cupy", 1, free_device=24 << 30),
                  PlanRequest(out_of_core=False))
    with pytest.raises(ValueError, match="from afar"):
        make_plan(shape, "float64", Machine("cupy", 1), PlanRequest(out_of_core=True))
    from summa.planning import memorycheck
    monkeypatch.setattr(memorycheck, "host_memory_total", lambda: 1 << 40)  # a 1 TiB node
    live = make_plan(shape, "float64", Machine.live(MPI.COMM_SELF, _FakeGpu(24 << 30)))
    assert live.memory == tight.memory and live.device_budget == tight.device_budget


def test_widths_grid_and_errors():
    """Widths per mode ("auto" measured in memory on a grid only), a grid
    given (checked against the ranks), and the schedule's refusals."""
    cpu = Machine("numpy", 4)
    assert make_plan((100, 100, 100), "float64", cpu,
                     PlanRequest(panel_width="auto")).panel_width == "auto"
    assert make_plan((100, 100, 100), "float64", Machine("numpy", 1),
                     PlanRequest(panel_width="auto")).panel_width == 256
    assert make_plan((100, 100, 100), "float64", cpu,
                     PlanRequest(panel_width="auto", schedule="strips",
                                 grid=(4, 1))).panel_width == 256
    assert make_plan((100, 100, 100), "float64", cpu,
                     PlanRequest(panel_width="auto", device_memory="1MiB")).panel_width == 256
    gpu = Machine("cupy", 2)
    assert make_plan((100, 100, 100), "float32", gpu).panel_width == 8192
    assert make_plan((100, 100, 100), "float32", gpu,
                     PlanRequest(device_memory="1GiB")).panel_width == 4096
    assert make_plan((100, 100, 100), "float64", cpu, PlanRequest(grid="1x4")).grid == (1, 4)
    with pytest.raises(ValueError, match="needs 6 ranks, but 4"):
        make_plan((100, 100, 100), "float64", cpu, PlanRequest(grid=(2, 3)))
    with pytest.raises(ValueError, match="one column"):
        make_plan((100, 100, 100), "float64", cpu,
                  PlanRequest(grid=(2, 2), schedule="strips"))
    with pytest.raises(ValueError, match="device memory only"):
        make_plan((100, 100, 100), "float64", cpu,
                  PlanRequest(schedule="strips", device_memory="1GiB"))
    with pytest.raises(ValueError, match="moduli applies"):
        make_plan((100, 100, 100), "float64", cpu, moduli=8)


def test_small_budgets_cut_more_tiles_and_restage_counts_staging():
    """Tighter budgets: more tiles, each plan within its budget; staging
    buffers for copy-engine broadcasts take room the plain plan has."""
    machine = Machine("cupy", 2)
    tiles = []
    for budget in ("40GiB", "8GiB", "2GiB"):
        plan = make_plan((65536,) * 3, "float64", machine, PlanRequest(device_memory=budget))
        assert plan.memory.device_bytes <= parse_bytes(budget)
        tiles.append(plan.memory.tiles[0] * plan.memory.tiles[1])
    assert tiles == sorted(tiles) and tiles[0] < tiles[-1]
    plain = make_plan((65536,) * 3, "float64", machine, PlanRequest(device_memory="8GiB"))
    staged = restage(plain, (True, True))
    assert staged.memory == make_plan((65536,) * 3, "float64", machine,
                                      PlanRequest(device_memory="8GiB"),
                                      staged=(True, True)).memory
    assert staged.memory.device_bytes <= parse_bytes("8GiB") and staged != plain
    assert restage(plain, (False, False)) is plain
    assert plain.grid == (1, 2)  # float64 on GPUs: tall blocks
    assert restage(plain, (False, True)) is plain  # a grid column of one rank stages nothing


def test_restage_narrows_panels_the_staging_leaves_no_room_for():
    """A budget whose tiles fit the plain plan's panels but not once the
    broadcasts stage them (a 2-rank GPU sweep's float16 case, 13 x 120 x
    1063 under 17.4 KiB): restage takes narrower panels, as the planner
    does for a budget too small, and says so, rather than refusing a call
    it planned."""
    shape, budget = (13, 120, 1063), 17768
    plain = make_plan(shape, "float16", Machine("cupy", 2),
                      PlanRequest(grid=(1, 2), device_memory=budget, lookahead=2), host_held=True)
    assert plain.memory.chunk == 1063
    staged = restage(plain, (True, True))
    assert staged.panel_width == staged.memory.chunk < 1063
    assert staged.memory.device_bytes <= budget and staged.memory.staged == (True, False)
    assert "staging buffers" in staged.note and f"{staged.panel_width}-wide" in staged.note
    assert staged.memory == make_plan(shape, "float16", Machine("cupy", 2),
                                      PlanRequest(grid=(1, 2), device_memory=budget, lookahead=2,
                                                  panel_width=staged.panel_width), host_held=True,
                                      staged=(True, True)).memory


def test_restage_refuses_a_sweep_its_staging_cuts_too_fine_naming_a_budget_that_is_not():
    """float64 4096³ under 4 MiB on a 1 x 2 grid plans 34816 steps; staged
    for ipc broadcasts its tiles halve (69632 tiny steps, minutes on a GPU):
    restage refuses it as the planner refuses such a sweep, naming the
    least budget whose staged sweep is not too fine, which restage then
    takes."""
    import re
    from summa.planning.memory import sweep_steps
    from summa.planning.widths import MAX_SWEEP_GEMMS

    def planned(budget):
        return make_plan((4096,) * 3, "float64", Machine("cupy", 2),
                         PlanRequest(grid=(1, 2), device_memory=budget), host_held=True)
    plain = planned("4MiB")
    assert sweep_steps(plain.memory, 4096) <= MAX_SWEEP_GEMMS
    with pytest.raises(ValueError, match="too small to finish") as refused:
        restage(plain, (True, True))
    enough = re.search(r"at least ([\d.]+ \w+)", str(refused.value)).group(1).replace(" ", "")
    staged = restage(planned(enough), (True, True))
    assert staged.memory.staged == (True, False)
    assert sweep_steps(staged.memory, 4096) <= MAX_SWEEP_GEMMS


def test_ipc_asked_for_is_planned_with_its_staging():
    """broadcaster="ipc" on GPUs: its staging buffers counted when planning
    (the width chosen for them), so the run's restage has nothing to change;
    auto learns it at the run."""
    shape, budget = (13, 120, 1063), 17768
    asked = PlanRequest(grid=(1, 2), device_memory=budget, lookahead=2)
    ipc_asked = replace(asked, broadcaster="ipc")
    ipc = make_plan(shape, "float16", Machine("cupy", 2), ipc_asked, host_held=True)
    assert ipc.memory == make_plan(shape, "float16", Machine("cupy", 2), asked,
                                   host_held=True, staged=(True, True)).memory
    assert ipc.memory.staged == (True, False) and restage(ipc, (True, True)) is ipc
    auto = make_plan(shape, "float16", Machine("cupy", 2), asked, host_held=True)
    assert auto.memory.staged == (False, False)
    assert make_plan(shape, "float64", Machine("numpy", 2), ipc_asked,
                     host_held=True).memory.staged == (False, False)  # no copy engines on CPUs


@pytest.mark.parametrize("dtype, shape, budget", [
    ("complex128", (32768, 32768, 32768), "8GiB"),   # two C tiles on the device
    ("float64", (32768, 32768, 32768), "8GiB"),      # one at a time (_one_at_a_time)
    ("complex128", (16384, 65536, 32768), "8GiB"),   # wider than tall
    ("complex128", (65536, 16384, 32768), "8GiB"),   # taller than wide
    ("float32", (20000, 50000, 30000), "2GiB")])
def test_operands_lying_by_columns_cut_c_as_the_transposed_product(dtype, shape, budget):
    """Out of core, op(A) and op(B) lying by columns (Fortran order) cut C as
    the C-ordered operands of the transposed product do, transposed: whole
    columns where the block is square (whole rows there: B, read again for
    each row of tiles, comes up in blocks; by columns it would come in
    pieces of a panel's width), else the way that uploads less. (B's
    row-major copy, SUMMA_TRANSPOSE_B, takes room of its own: left out.)"""
    with options.set(transpose_b="no"):
        _cut_as_the_transposed_product(dtype, shape, budget)


def _cut_as_the_transposed_product(dtype, shape, budget):
    m, n, k = shape
    machine = Machine("cupy", 1)

    def planned(shape, storage):
        return make_plan(shape, dtype, machine, PlanRequest(device_memory=budget), host_held=True,
                         storage=storage)
    by_cols = planned((m, n, k), ("cols", "cols"))
    transposed = planned((n, m, k), ("rows", "rows"))
    assert by_cols.storage == ("cols", "cols")
    assert by_cols.memory.tiles == transposed.memory.tiles[::-1] != (1, 1)
    assert by_cols.memory.tile == transposed.memory.tile[::-1]
    assert by_cols.memory.c_buffers == transposed.memory.c_buffers
    assert by_cols.panel_width == transposed.panel_width
    assert by_cols.memory.device_bytes <= parse_bytes(budget)
    by_rows = planned((m, n, k), ("rows", "rows")).memory.tiles
    if m == n:  # a tie of bytes: the way the operands lie
        assert by_cols.memory.tiles[0] == 1 < by_cols.memory.tiles[1]
        assert by_rows[1] == 1 < by_rows[0]
        for mixed in (("rows", "cols"), ("cols", "rows")):
            assert planned((m, n, k), mixed).memory.tiles == by_rows
    else:  # the way that uploads less, whatever the storage
        assert by_rows == by_cols.memory.tiles
        assert (by_rows[0] == 1) == (m < n)
    # a run whose broadcasters stage its panels plans again for the same storage
    two, held = PlanRequest(device_memory=budget, grid=(1, 2)), dict(host_held=True,
                                                                     storage=("cols", "cols"))
    plain = make_plan(shape, dtype, Machine("cupy", 2), two, **held)
    staged = make_plan(shape, dtype, Machine("cupy", 2), replace(two, panel_width=plain.panel_width),
                       staged=(True, True), **held)
    assert restage(plain, (True, True)).memory == staged.memory


@pytest.mark.parametrize("storage", [("rows", "rows"), ("cols", "cols")])
@pytest.mark.parametrize("grid, tiles", [((1, 2), (2, 1)), ((2, 1), (1, 3))])
def test_ranks_blocks_are_cut_the_way_that_uploads_less(storage, grid, tiles):
    """Each rank's block of C on a grid of two GPUs (as restage plans it at
    the run, for the ipc broadcasters it makes) is cut the way that reads
    its operands again least: float64 on 1 x 2 (blocks 32768 x 16384) by
    rows, complex128 on 2 x 1 (16384 x 32768) by columns, however the
    operands lie. Two H200s ran float64 Fortran's 1 x 2 column cut 1.2 x
    slower than rows; on 2 x 1 rows would broadcast B's panels again for
    each tile."""
    from summa.planning.tiling import upload_elements
    dtype = "float64" if grid == (1, 2) else "complex128"
    with options.set(transpose_b="no"):  # (its copy of B's panels takes room of its own)
        plan = restage(make_plan((32768,) * 3, dtype, Machine("cupy", 2),
                                 PlanRequest(device_memory="8GiB", grid=grid), host_held=True,
                                 storage=storage), (True, True))
    assert plan.memory.tiles == tiles
    ml, nl = 32768 // grid[0], 32768 // grid[1]
    assert upload_elements(ml, nl, tiles) < upload_elements(ml, nl, tiles[::-1])


def test_out_of_core_plans_on_gpus_settle_host_copies_and_their_threads(monkeypatch):
    """Out of core on GPUs the plan says how host blocks go up (as asked,
    else SUMMA_HOST_COPIES) and on how many threads a rank: copy_threads of
    the ranks on a node (all of a machine planned from afar), or
    SUMMA_COPY_THREADS; its page-locked ring is counted for those threads,
    also where restage plans again, and both are printed. CPUs and
    in-memory plans say neither."""
    from summa.device import staging
    monkeypatch.setattr(staging, "usable_cores", lambda: 16)  # 12 threads for one rank
    monkeypatch.delenv("SUMMA_COPY_THREADS", raising=False)
    monkeypatch.delenv("SUMMA_HOST_COPIES", raising=False)
    shape = (65536,) * 3

    def planned(machine, **kwargs):
        return make_plan(shape, "float64", machine, PlanRequest(device_memory="8GiB"), **kwargs)
    for machine, threads in ((Machine("cupy", 8, ranks_on_node=2), 6), (Machine("cupy", 1), 12),
                             (Machine("cupy", 8), 1), (Machine("cupy", 4, ranks_on_node=4), 3)):
        plan = planned(machine)
        assert (plan.host_copies, plan.copy_threads) == ("stage", threads)
        assert plan.memory.staging_bytes == ring_bytes(threads)
        assert plan.as_dict()["copy_threads"] == threads
        assert f"filled and drained by {threads} copy thread" in str(plan)
        assert "host copies stage" in str(plan)
    plan = planned(Machine("cupy", 2, ranks_on_node=2))
    staged = restage(plan, (True, True))
    assert staged.memory != plan.memory and staged.copy_threads == plan.copy_threads == 6
    assert staged.memory.staging_bytes == ring_bytes(6)
    with options.set(copy_threads=5, host_copies="lock"):
        plan = planned(Machine("cupy", 2, ranks_on_node=2))
        assert (plan.host_copies, plan.copy_threads) == ("lock", 5)
        assert plan.memory.staging_bytes == ring_bytes(5)
        assert planned(Machine("cupy", 2), host_copies="stage").host_copies == "stage"
    for other in (make_plan(shape, "float64", Machine("cupy", 2, free_device=1 << 40)),
                  planned(Machine("numpy", 2)), planned(Machine("numpy", 2), host_copies="lock")):
        assert (other.host_copies, other.copy_threads) == (None, None)
        assert "host copies" not in str(other)
    with pytest.raises(ValueError, match="host_copies must be stage or lock, got 'copy'"):
        planned(Machine("cupy", 2), host_copies="copy")


@pytest.mark.mpi(min_size=1)
def test_live_machines_count_the_ranks_on_their_node_as_the_grid_will(comm, monkeypatch):
    """A live machine's ranks on a node are its topology's (the one given:
    virtual nodes too), as the process grid that runs the plan sees them;
    its out-of-core plan takes their copy threads."""
    from summa.device import staging
    from summa.distribution.grid import ProcessGrid
    from summa.distribution.topology import Topology, topology_of
    from summa.planning import memorycheck
    monkeypatch.setattr(staging, "usable_cores", lambda: 16)
    monkeypatch.setattr(memorycheck, "host_memory_total", lambda: 1 << 40)  # a 1 TiB node
    gpu = _FakeGpu(24 << 30)
    on_node = topology_of(comm).local_size
    assert Machine.live(comm, gpu).ranks_on_node == on_node
    plan = make_plan((4096,) * 3, "float64", Machine.live(comm, gpu),
                     PlanRequest(device_memory="1GiB"))
    assert plan.copy_threads == staging.copy_threads(on_node)
    with Topology.virtual(comm, nodes=comm.size) as alone:  # a node a rank
        machine = Machine.live(comm, gpu, alone)
        with ProcessGrid(comm, topology=alone) as grid:
            assert machine.ranks_on_node == grid.local_size == 1
        assert make_plan((4096,) * 3, "float64", machine,
                         PlanRequest(device_memory="1GiB")).copy_threads == 12


def test_plan_prints_and_serialises():
    plan = make_plan((100_000,) * 3, "float64", Machine("cupy", 8),
                     PlanRequest(grid=(2, 4), device_memory="22GiB"), predict=True)
    text = str(plan)
    assert text.startswith("plan: 100000 x 100000 x 100000 float64 on 8 ranks (grid 2x4)")
    assert "C tiles of" in text and "predicted by the model" in text
    assert "device budget 22.00 GiB" in text
    data = json.loads(json.dumps(plan.as_dict()))
    assert data["memory"]["tiles"] == list(plan.memory.tiles)
    assert isinstance(plan, Plan)
    with pytest.raises(AttributeError):
        plan.panel_width = 1  # frozen


@pytest.mark.parametrize("args", [
    ["--size", "100000", "--ranks", "2", "--dtype", "float32", "--device-memory", "16GiB"],
    ["--size", "100000", "--grid", "2x1", "--nb", "4096", "--precision", "fp64-int8"],
    ["--m", "1000", "--n", "200", "--k", "3000", "--ranks", "2", "--schedule", "strips"],
    ["--size", "5000", "--ranks", "3", "--backend", "numpy", "--device-memory", "4MiB",
     "--comm", "mpi"],
])
def test_plan_command_prints_make_plan(args):
    """``summa plan`` prints make_plan's Plan for the same inputs."""
    out = io.StringIO()
    assert cli.main(["plan", *args], MPI.COMM_SELF, out) == 0
    from summa.cli.studies import planning_machine
    from summa.planning.profile import shipped_profile
    opts = cli.build_parser().parse_args(["plan", *args])
    ranks = opts.ranks or opts.grid[0] * opts.grid[1]
    ipc = opts.comm == "ipc" or (opts.comm == "auto" and opts.backend == "cupy")
    machine, _ = planning_machine(shipped_profile(), opts.backend, ranks)
    assert machine.free_device == (Profile.load(shipped_profile()).device_memory
                                   if opts.backend == "cupy" else None)
    request = PlanRequest(grid=opts.grid, device_memory=opts.device_memory, panel_width=opts.nb,
                          schedule=opts.schedule, broadcaster=opts.comm,
                          precision=None if opts.precision == "default" else opts.precision)
    plan = make_plan((opts.m or opts.size, opts.n or opts.size, opts.k or opts.size), opts.dtype,
                     machine, request, staged=(ipc, ipc), predict=True)
    hardware, printed = out.getvalue().split("\n", 1)
    assert hardware.startswith("hardware: ")  # which profile the prediction assumed
    assert printed == f"{plan}\n"


def _without_prediction(plan: dict) -> dict:
    return {key: value for key, value in plan.items() if key != "predicted"}


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("device_memory,dtype", [("64KiB", "float64"), ("20KiB", "complex128"),
                                                 (None, "float32")])
def test_the_plan_a_run_used_is_the_one_summa_plan_prints(comm, rng, tmp_path, device_memory,
                                                           dtype):
    """summa.matmul on NumPy arrays (host-resident under a device cap on
    CPUs, else in memory) records the Plan it ran; ``summa plan --json``
    for the same inputs writes the same Plan, and so does make_plan."""
    from helpers import random_array
    import summa
    from summa.execution.algorithm import SummaStats
    m, n, k = 90, 70, 50
    a, b = random_array(rng, (m, k), dtype), random_array(rng, (k, n), dtype)
    stats = SummaStats()
    c = summa.matmul(a if comm.rank == 0 else None, b if comm.rank == 0 else None, comm=comm,
                     backend="numpy", device_memory=device_memory, panel_width=8, stats=stats)
    if comm.rank == 0:
        np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-4)
    ran = stats.extra["plan"]
    assert ran["out_of_core"] == (device_memory is not None)
    path = tmp_path / f"plan-{comm.rank}.json"
    args = ["plan", "--m", str(m), "--n", str(n), "--k", str(k), "--dtype", dtype,
            "--ranks", str(comm.size), "--backend", "numpy", "--nb", "8", "--json", str(path)]
    assert cli.main(args + (["--device-memory", device_memory] if device_memory else []),
                    MPI.COMM_SELF, io.StringIO()) == 0
    printed = json.loads(path.read_text())
    assert _without_prediction(printed) == _without_prediction(ran)
    planned = make_plan((m, n, k), dtype, Machine("numpy", comm.size),
                        PlanRequest(device_memory=device_memory, panel_width=8), host_held=True)
    assert planned.as_dict() == ran
    if device_memory:  # the sweep ran the plan's tiles, within its budget
        assert stats.extra["tiles"] == list(planned.memory.tiles)
        assert stats.extra["device_bytes_planned"] <= planned.device_budget


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("device_memory", ["20KiB", None])
def test_matmul_plans_once_and_executes_many(comm, rng, device_memory):
    """summa.Matmul: the plan printed before any multiply is the one each
    execute runs; new operands of the planned shape reuse it and the grid;
    others, and calls after free, are refused on every rank."""
    from helpers import gemm_scaled_error, random_array
    import summa
    a, b = random_array(rng, (60, 40), "float64"), random_array(rng, (40, 30), "float64")
    a2 = random_array(rng, (60, 40), "float64")
    mine = (lambda x: x) if comm.rank == 0 else (lambda x: None)
    with summa.Matmul(mine(a), mine(b), comm=comm, backend="numpy", alpha=2.0,
                      device_memory=device_memory, panel_width=8) as m:
        assert m.plan == make_plan((60, 30, 40), "float64", Machine("numpy", comm.size),
                                   PlanRequest(device_memory=device_memory, panel_width=8),
                                   host_held=True)
        assert "plan: 60 x 30 x 40 float64" in str(m.plan)
        grid = m._product.grid
        for x in (a, a2, a):
            c = m.execute(*((mine(x), mine(b)) if x is not a else ()))
            assert m._product.grid is grid and m.stats.extra["plan"] == m.plan.as_dict()
            if comm.rank == 0:
                assert gemm_scaled_error(c, x, b, alpha=2.0) <= 1
        out = np.empty((60, 30)) if comm.rank == 0 else None
        assert m.execute(out=out) is out or comm.rank != 0
        with pytest.raises(ValueError, match="planned 60x30x40 float64"):
            m.execute(mine(b.T.copy()), mine(a.T.copy()))
        with pytest.raises(ValueError, match="must pass the array b"):
            m.execute(mine(a))
    assert "freed" in repr(m)
    with pytest.raises(RuntimeError, match="freed"):
        m.execute()


# -- fp64-int8's products in chunks of rows -------------------------------------------

def _int8_sweep_bytes(mem) -> int:
    """Device bytes the out-of-core sweep's own count gives float64
    fp64-int8 memory plan `mem`: its tiles, slots, C buffers, rows and folds."""
    from summa.planning import tiling
    rows, cols = mem.tiles
    return 8 * tiling.ooc_elements(*mem.tile, rows * cols, tiling.SweepPanels(
        mem.chunk, mem.slots, emulated=tiling.Int8Products(rows=mem.int8_rows,
                                                           planes=mem.int8_planes)),
        c_buffers=mem.c_buffers)


def _int8_plan(n: int, budget, dtype="float64", panel_width=None) -> Plan:
    return make_plan((n, n, n), dtype, Machine("cupy", 1),
                     PlanRequest(device_memory=budget, precision="fp64-int8",
                                 panel_width=panel_width))


def test_fp64_int8_products_in_chunks_of_rows_let_fewer_larger_tiles_fit():
    """float64 40960³ with 24 GiB free (a live plan takes FREE_SHARE of it),
    16384-wide panels: the scratch of whole tiles' products cut C in 3 x 3
    tiles; with the products taking C's rows in chunks (at least
    FP64_INT8_ROWS, fewer than a tile's) it takes fewer (3 x 2), fewer bytes
    over the host link. The
    device bytes are the sweep's own count with those rows, within the
    budget; the plan hands its GEMMs the rows (Plan.scheme) and says them."""
    from summa.planning import tiling
    from summa.planning.planner import FREE_SHARE
    from summa.precision.ozaki_gpu import PLANES, Scheme
    n = 40960
    budget = int(24 * 2**30 * FREE_SHARE)
    plan = _int8_plan(n, budget, panel_width=16384)
    mem = plan.memory
    tm, (rows, cols) = mem.tile[0], mem.tiles
    assert tiling.FP64_INT8_ROWS <= mem.int8_rows < tm
    assert plan.scheme == Scheme(rows=mem.int8_rows, planes=mem.int8_planes or PLANES)
    assert mem.device_bytes == _int8_sweep_bytes(mem) <= budget
    whole = tiling.ooc_tiles(n, n, budget // 8,
                             tiling.SweepPanels(mem.chunk, 2, emulated=tiling.Int8Products()))
    assert whole[0] * whole[1] > rows * cols
    assert host_traffic(mem, (n, n, n), (1, 1)) == (rows + cols + 1) * n * n < \
        (sum(whole) + 1) * n * n
    assert f"take C's rows {mem.int8_rows} at a time" in str(plan)
    roomy = _int8_plan(n, "139GiB")  # whole rows fit: none said
    assert roomy.memory.int8_rows is None and roomy.scheme.rows is None
    assert "at a time" not in str(roomy)
    assert make_plan((n, n, n), "float64", Machine("cupy", 1),
                     PlanRequest(device_memory=budget)).scheme is None


def test_fp64_int8_folds_take_more_integer_products_a_pass_where_room_is_left():
    """The room a budget leaves beside fp64-int8's tiles and rows goes to
    its folds: with the whole H200 all 15 integer products a pass (one pass
    over C's sums), under a budget between them the most that fit, under
    a tight one the default; always within the budget, the sweep's own
    count, and handed to the GEMMs (Plan.scheme)."""
    from summa.precision import ozaki_gpu
    n, count = 40960, ozaki_gpu.moduli_for(16384)
    whole = _int8_plan(n, "127GiB")
    assert whole.memory.int8_planes == count and whole.scheme.planes == count
    assert _int8_sweep_bytes(whole.memory) == whole.memory.device_bytes <= 127 * 2**30
    assert f"take {count} integer products a pass" in str(whole)
    short = whole.memory.device_bytes - 1  # one byte short of them: fewer, the tiles kept
    between = _int8_plan(n, short).memory
    assert between.tiles == whole.memory.tiles and between.int8_rows == whole.memory.int8_rows
    assert ozaki_gpu.PLANES < between.int8_planes < count
    assert _int8_sweep_bytes(between) <= short
    more = replace(between, int8_planes=between.int8_planes + 1)
    assert _int8_sweep_bytes(more) > short
    tight = _int8_plan(n, "8GiB")
    assert tight.memory.int8_planes is None and tight.scheme.planes == ozaki_gpu.PLANES
    assert "integer products a pass" not in str(tight)
    # complex: its four real products take them each, within the budget
    wide = _int8_plan(32768, "127GiB", "complex128").memory
    assert wide.int8_planes > ozaki_gpu.PLANES and wide.device_bytes <= 127 * 2**30


@pytest.mark.parametrize("dtype", ["float64", "complex128"])
@pytest.mark.parametrize("n", [32768, 40960])
def test_more_device_memory_never_gives_fp64_int8_more_tiles_or_uploads(n, dtype):
    """From 8 GiB to a whole H200: each budget's fp64-int8 plan moves no more
    bytes over the host link and cuts C in no more tiles than a smaller
    one's, its chunks of rows at least FP64_INT8_ROWS (or a tile's all)."""
    from summa.planning import tiling
    last = None
    for gib in (8, 12, 16, 21.6, 24, 32, 48, 64, 80, 100, 125, 139):
        mem = _int8_plan(n, f"{gib}GiB", dtype).memory
        assert mem.device_bytes <= gib * 2**30
        assert mem.int8_rows is None or tiling.FP64_INT8_ROWS <= mem.int8_rows < mem.tile[0]
        now = (host_traffic(mem, (n, n, n), (1, 1)), mem.tiles[0] * mem.tiles[1])
        assert last is None or (now[0] <= last[0] and now[1] <= last[1]), (gib, now, last)
        last = now


def test_fp64_int8_operands_on_the_gpu_take_rows_in_chunks_where_all_do_not_fit():
    """summa.matmul of GPU operands with fp64-int8: where the product's
    scratch for all of C's rows does not fit the free memory (or the cap
    beside the operands) its rows go in chunks and the GEMM stays where the
    operands lie, instead of their going through host memory; its memory is
    C and scratch_bytes' count for those rows."""
    from summa.planning import tiling
    from summa.planning.plan import Placement
    from summa.precision import ozaki_gpu
    n = 40960
    held = 2 * n * n * 8

    def plan(free, device_memory=None):
        return make_plan((n, n, n), "float64", Machine("cupy", 1, free_device=free),
                         PlanRequest(precision="fp64-int8", device_memory=device_memory),
                         placement=Placement("device", 0, held=held))
    whole = ozaki_gpu.scratch_bytes(n, n, n, ozaki_gpu.moduli_for(n)) + 8 * n * n
    roomy = plan(whole)
    assert roomy.placement.resident and roomy.memory.int8_rows is None
    assert roomy.memory.device_bytes == whole
    for free, cap in ((80 * 2**30, None), (whole, held + 64 * 2**30)):
        tight = plan(free, device_memory=cap)
        rows = tight.memory.int8_rows
        assert tight.placement.resident and tiling.FP64_INT8_ROWS <= rows < n
        room = free if cap is None else min(free, cap - held)
        planes = tight.memory.int8_planes or ozaki_gpu.PLANES
        assert tight.memory.device_bytes == 8 * n * n + ozaki_gpu.scratch_bytes(
            n, n, n, ozaki_gpu.moduli_for(n), planes, rows=rows) <= room
        assert tight.scheme.rows == rows and f"take C's rows {rows} at a time" in str(tight)
    fetched = plan(20 * 2**30)  # not even the least chunks fit: through host memory
    assert fetched.placement.fetched and "copied to host memory" in fetched.note
