"""The out-of-core panel width: of the mode's default width and narrower
ones, the one whose C tiles under the device budget move fewest bytes
between host and GPU (:func:`out_of_core_memory`), a narrower one where none
of those fits (:func:`narrowest_that_fits`), and the refusal of a sweep cut
into too many tiny steps (:func:`check_sweep`).

:func:`summa.planning.planner.make_plan` and
:func:`summa.planning.planner.restage` ask these; the tiles under one width
are :func:`summa.planning.memory.memory_plan`'s.
"""

from __future__ import annotations

from dataclasses import replace

from ..device.traits import traits
from .memory import (Execution, MemoryPlan, format_bytes, host_traffic, memory_plan,
                     sweep_steps, waited_write_backs)
from .model import gemm_flops
from .tiling import TRAFFIC_GAIN
from .tuning import default_panel_width, is_width

__all__ = ["MIN_OOC_WIDTH", "MIN_OOC_WIDTH_INT8", "INT8_EVEN_SPLITS", "WIDTH_ALIGN",
           "LEAST_OOC_WIDTH", "MAX_SWEEP_GEMMS", "STEP_FLOPS", "out_of_core_memory",
           "ooc_widths", "even_width", "check_sweep", "too_fine", "narrowest_that_fits"]


#: Narrowest panel an out-of-core plan takes on GPUs to move fewer bytes:
#: GEMMs over 2048 terms still run near the GPU's peak.
MIN_OOC_WIDTH = 2048
#: ... and fp64-int8's: each panel's products fold the C tile again, so narrow
#: panels cost it more. ``summa.matmul(a, b, out=c, precision="fp64-int8")`` of
#: pageable 40960² arrays on one H200 with 24 GiB free (its products in row
#: chunks), two calls at each width in one process: 8192-wide panels 2.46-2.64 s
#: (2 x 2 tiles, 67 GB moved), 16384 2.71-2.86 s (3 x 2 tiles, 80.5 GB), 4096
#: 3.12-3.19 s (3 x 1 tiles, 67 GB; its products 2.9 s against 8192's 2.3)
#: (docs/benchmarks.md; ``benchmarks/fp64_int8_user_case.py --panel-width``).
MIN_OOC_WIDTH_INT8 = 8192
#: Even panel counts fp64-int8 tries out of core from the fewest its
#: default width takes (:func:`ooc_widths`). Each panel's products fold the C
#: tile again: in the h200 profile's samples a fold of a 16384² tile cost
#: about what 4200 terms of its INT8 products did (57.2 TFLOP/s with 8192
#: terms a product, 68.9 with 16384), and on one H100 40960³'s products took
#: 2.06 s in 3 panels a tile with the whole GPU, 2.40 s in 5 under 24 GiB
#: (``benchmarks/fp64_int8_user_case.py``, docs/benchmarks.md). Beyond a few
#: more panels than the fewest, one panel more or less weighs little.
INT8_EVEN_SPLITS = 4
#: Even panels' widths are rounded up to a multiple of this (INT8 GEMMs take
#: K in multiples of 4 and their tiles of 16 or 32).
WIDTH_ALIGN = 32
#: Narrowest panel any out-of-core plan takes (the NumPy backend's default
#: width): a budget too small for the tiles of panels this wide is refused,
#: not planned into thousands of tiny GEMMs (``summa bench --size 96
#: --device-memory 100B`` on a GPU ran one-element tiles for minutes).
LEAST_OOC_WIDTH = 256
#: Most GEMMs (C tiles x panels) an out-of-core sweep is planned with where
#: each is too small to hide a step's own cost (less than
#: :data:`STEP_FLOPS`): a budget that cuts C finer is refused, with the least
#: budget that does not. A step of tiny tiles costs ~90 us on one CPU rank
#: (2000 x 2000 x 300 under 40 KiB, a million steps of 1 x 8 tiles, took
#: 91 s) and on an H200 ~1.6 ms a step and ~3.1 ms a C tile
#: (:data:`summa.planning.prediction.SWEEP_STEP_SECONDS`; pageable float64
#: 8192³ under 16 MiB, 482 x 17 tiles x 4 panels, took 76 s), so this many
#: are seconds on a CPU and a few minutes on a GPU: slow, but a
#: budget or width the caller chose; ``summa plan --size 8192
#: --device-memory 100KiB`` had cut C into 8192 x 8192 one-element tiles.
MAX_SWEEP_GEMMS = 1 << 16
#: Real flops of a step's GEMM (complex: four real products) that hide the
#: step's own cost: ~90 us at 50 GFLOP/s on a CPU rank, ~1 ms at 70 TFLOP/s
#: on an H200. A sweep of steps this large is planned however many (float64
#: 100000 x 100000 x 1.2e6 under 2 GiB: 69148 steps of 1695 x 25000 x 4096,
#: 3.5e11 flops each).
STEP_FLOPS = {"cpu": 1 << 22, "gpu": 1 << 36}


def out_of_core_memory(shape, dtype, grid, panel_width, execution: Execution) -> tuple:
    """``(MemoryPlan, note or None)``: the out-of-core MemoryPlan at the
    width asked, else at the mode's default or a half or quarter of it (not
    under :data:`MIN_OOC_WIDTH`), whichever tiles move fewest bytes between
    host and GPU (write-backs a tile waits for counted twice), the widest of
    equals; a sweep of too many tiny steps refused (:func:`check_sweep`).
    Under a tight
    budget narrower panels leave room for taller C tiles, so B crosses the
    link fewer times: float64 65536 x 8192 x 65536 under 8 GiB takes one tile
    with 2048-wide panels where 4096 takes 2 x 1. `execution`: the sweep
    as :func:`summa.planning.memory.memory_plan` counts it, to its device
    budget (out of core); fp64-int8 goes no narrower
    than :data:`MIN_OOC_WIDTH_INT8` (its products lose more to narrower
    panels than the bytes save). A budget too small for all of these takes
    the widest narrower width that fits, down to :data:`LEAST_OOC_WIDTH`
    (:func:`narrowest_that_fits`), the note saying so."""
    m, n, k = shape
    budget, precision, backend = execution.device_budget, execution.precision, execution.backend

    def plan_at(width: int, budget: int = budget) -> MemoryPlan:
        return memory_plan(m, n, k, dtype, grid, width, replace(execution, device_budget=budget))
    if is_width(panel_width):
        widths = [int(panel_width)]
    else:
        widths = ooc_widths(k, default_panel_width(backend, dtype, precision, out_of_core=True),
                            precision, traits(backend).gpu)

    def moved(memory: MemoryPlan) -> int:
        # (the write-backs a tile waits for count as moved twice: at equal
        # traffic, a width that fits two C tiles wins)
        return host_traffic(memory, shape, grid) + waited_write_backs(memory)

    def choose(given: int) -> tuple:  # the plan and note under `given` bytes
        return _choose(lambda w: plan_at(w, given), widths, moved, is_width(panel_width),
                       (given, k))
    memory, note = choose(budget)
    flops = gemm_flops(dtype, m, n, k)
    check_sweep(memory, k, (budget, traits(backend).gpu, flops), choose)
    return memory, note


def ooc_widths(k: int, widest: int, precision: str | None, gpu: bool) -> list[int]:
    """The widths :func:`out_of_core_memory` tries over an inner dimension
    `k`, widest first: the mode's default (`widest`), and on GPUs its half
    and quarter, not under :data:`MIN_OOC_WIDTH` (fp64-int8:
    :data:`MIN_OOC_WIDTH_INT8`). fp64-int8's widths cut K into even panels
    instead, as few as the widest takes and :data:`INT8_EVEN_SPLITS` - 1
    more, and as many as the half and quarter take (:func:`even_width`):
    its products fold the C tile once a panel, so where those widths' tiles
    move as many bytes, the fewest panels that fit win, and even panels
    leave a slot no wider than the panels need (40960 in three: 13664
    wide, not 16384, 16384 and 8192)."""
    if not gpu:
        return [widest]
    least = MIN_OOC_WIDTH_INT8 if precision == "fp64-int8" else MIN_OOC_WIDTH
    narrower = [w for w in (widest // 2, widest // 4) if w >= least]
    if precision != "fp64-int8":
        return [widest] + narrower
    fewest = -(-k // widest)
    counts = set(range(fewest, fewest + INT8_EVEN_SPLITS)) | {-(-k // w) for w in narrower}
    even = {even_width(k, count) for count in counts}
    return [widest] + sorted((w for w in even if least <= w < widest), reverse=True)


def even_width(k: int, count: int) -> int:
    """The width that cuts `k` into `count` even panels (or fewer), rounded
    up to a multiple of :data:`WIDTH_ALIGN`."""
    width = -(-k // count)
    return -(-width // WIDTH_ALIGN) * WIDTH_ALIGN


def _choose(plan_at, widths: list, moved, asked: bool, limits: tuple) -> tuple:
    """:func:`out_of_core_memory`'s choice, unchecked: ``(MemoryPlan, note or
    None)``, the plan (``plan_at(width)``) of `widths` that moves fewest
    bytes (``moved(plan)``), else a narrower one that fits. `asked`: the
    width was the caller's (refused where its tiles do not fit); `limits`:
    ``(device budget, K)``."""
    budget, k = limits
    best, refusal = None, None
    for width in widths:
        try:
            memory = plan_at(width)
        except ValueError as exc:  # too small for this width's tiles: maybe a narrower
            refusal = refusal or exc
            continue
        bytes_moved = moved(memory)
        if best is None or bytes_moved < TRAFFIC_GAIN * best[0] or \
                (bytes_moved <= best[0] and memory.c_buffers > best[1].c_buffers):
            best = (bytes_moved, memory)
    if best is not None:
        return best[1], None
    if asked:
        raise refusal
    narrowest = min(widths + [k])
    memory = narrowest_that_fits(plan_at, narrowest, min(LEAST_OOC_WIDTH, k), refusal)
    return memory, (f"a device budget of {format_bytes(budget)} holds no tiles with panels "
                    f"{narrowest} wide: {memory.chunk}-wide panels (narrower GEMMs, "
                    "slower; more device memory restores them)")


def too_fine(memory: MemoryPlan, k: int, gpu: bool, flops: int) -> bool:
    """Whether `memory`'s sweep of K takes more than :data:`MAX_SWEEP_GEMMS`
    steps, each fewer than :data:`STEP_FLOPS` (a GPU's or a CPU's) of the
    product's real `flops`."""
    gemms = sweep_steps(memory, k)
    return gemms > MAX_SWEEP_GEMMS and flops < STEP_FLOPS["gpu" if gpu else "cpu"] * gemms


def check_sweep(memory: MemoryPlan, k: int, limits: tuple, choose) -> None:
    """Refuse a sweep of too many small steps (:func:`too_fine`; `limits`:
    ``(device budget, on a GPU, the product's real flops)``), naming the
    least power of two of bytes from the budget up under which the
    planner's own choice (``choose(bytes)[0]``) is not, or, where panels
    that narrow are too many even for one tile, the width."""
    budget, gpu, flops = limits
    if not too_fine(memory, k, gpu, flops):
        return
    (rows, cols), (tm, tn), width = memory.tiles, memory.tile, memory.chunk
    cut = (f"cuts C into {rows} x {cols} tiles of {tm} x {tn} ({sweep_steps(memory, k)} "
           f"GEMMs with {width}-wide panels)")
    enough = 1 << (budget - 1).bit_length()
    for _ in range(64):  # more memory: fewer tiles, down to one (or the cut asked for)
        if not too_fine(choose(enough)[0], k, gpu, flops):
            raise ValueError(f"a device budget of {format_bytes(budget)} {cut}: too small to "
                             f"finish; give each rank at least {format_bytes(enough)} "
                             "(--device-memory, device_memory=)")
        enough *= 2
    # panels this narrow are too many whatever the budget: the width's fault
    raise ValueError(f"this plan {cut}: too many to finish; take wider panels (--nb; at least "
                     f"{-(-k * rows * cols // MAX_SWEEP_GEMMS)} columns with these tiles)")


def narrowest_that_fits(plan_at, width: int, least: int, refusal) -> MemoryPlan:
    """``plan_at(w)``, the out-of-core MemoryPlan at width w, for the widest
    of `width` halved, down to `least` (:data:`LEAST_OOC_WIDTH`), whose
    tiles fit a budget too small for the preferred widths: a slower plan,
    but the product where `refusal` would refuse a valid call. Raise
    `refusal` where none fits."""
    while width > least:
        width = max(width // 2, least)
        try:
            return plan_at(width)
        except ValueError:
            continue
    raise refusal
