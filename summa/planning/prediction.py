"""What the performance model predicts of a plan: the time of a
:class:`summa.planning.plan.Plan` (the `plan` every function here takes)
by a calibration profile (:mod:`summa.planning.model`), where it goes (GEMMs,
host link, GPU links, exposed, disk), what bounds it and what would move
that. :func:`summa.planning.planner.make_plan` fills ``Plan.predicted`` with
:func:`predict_plan` where asked (``predict=True``); the model itself loads
only then. Decides nothing: a plan is timed as it was made.
"""

from __future__ import annotations

import numpy as np

from .memory import host_traffic, sweep_steps, waited_write_backs
from .model import BOUNDS, RunSetting, TimeSplit, gemm_flops, predict
from .profile import MEMCPY_TRAFFIC, Profile, shipped_profile
from .tuning import default_panel_width, is_width
from ..device import staging
from ..device.traits import traits
from ..distribution.layout import first_panel_width

__all__ = ["predict_plan", "NEXT_BOUND_SHARE", "SWEEP_STEP_SECONDS",
           "SWEEP_TILE_SECONDS"]


def predict_plan(plan, path=None, native=None) -> dict:
    """The model's time for `plan` by the profile at `path` (None: shipped):
    ``seconds`` and ``tflops`` as the split combines them, the ``split``
    (:meth:`summa.planning.model.TimeSplit.as_dict`), its ``bound`` and
    ``bound_share``, ``advice`` (what would move the bound), ``summa_seconds``
    (the SUMMA alone on data in GPU memory, what ``summa model`` predicts),
    and beside fp64-int8 the time of float64's `native` plan; or ``error``."""
    path = path or shipped_profile()
    out = {"profile": str(path), "shipped": str(path) == shipped_profile()}
    try:
        profile = Profile.load(path)
        split, details = _split(plan, profile)
        summa = predict(profile, *plan.shape, plan.dtype, plan.grid, _model_width(plan),
                        RunSetting(lookahead=plan.lookahead, precision=plan.precision))
    except (ValueError, KeyError) as exc:
        return {**out, "error": str(exc)}
    m, n, k = plan.shape
    flops = gemm_flops(plan.dtype, m, n, k)
    bound, worst = split.bound()
    parts = split.parts()
    runner = max((p for p in parts if p != bound), key=parts.get, default=None)
    following = runner if runner and parts[runner] >= NEXT_BOUND_SHARE * worst else None
    out.update(seconds=split.seconds, tflops=flops / split.seconds / 1e12,
               split=split.as_dict(), bound=bound, bound_share=worst / split.seconds,
               summa_seconds=summa.seconds, **details,
               advice=_advice(plan, profile, bound, details["host_link"]), next=following,
               next_advice=_advice(plan, profile, following, details["host_link"])
               if following else [])
    if native is not None and "seconds" in (native.predicted or {}):
        out.update(native_seconds=native.predicted["seconds"],
                   native_tflops=native.predicted["tflops"])
    return out


#: Seconds the host takes to issue one out-of-core step (a C tile's panel:
#: its uploads, events and GEMM) and one C tile (its start, its write-back
#: waited for) on a GPU, hidden behind the GPU's work and the host link
#: unless the steps are tiny. Fitted to pageable float64 sweeps on one H200
#: (docs/benchmarks.md, "Measurements behind the defaults"): 2048² x 262144
#: under 64 MiB (8 tiles of 128 panels) 1.61 s, 16384² x 2048 (1278 tiles
#: of one panel) 5.90 s, 8192³ (195 tiles of 4) 1.84 s and under 16 MiB
#: (8194 tiles of 4) 76.5 s; 1.6 ms a step and 3.1 ms a tile give 1.64,
#: 6.0, 1.85 and 78 s. A cost a step alone (2.5 ms) fitted the last two
#: and missed the first two by 60 % and 46 %.
SWEEP_STEP_SECONDS = 1.6e-3
SWEEP_TILE_SECONDS = 3.1e-3
#: A part of the time split at least this share of the bound's is named
#: beside it with what would move it too: it bounds the run once the bound
#: is halved.
NEXT_BOUND_SHARE = 0.5


def _model_width(plan) -> int:
    """The panel width the model predicts for (``"auto"``: the default)."""
    return plan.panel_width if is_width(plan.panel_width) else \
        default_panel_width(plan.backend, plan.dtype, plan.precision)


def _split(plan, profile) -> tuple:
    """``(TimeSplit, details)`` of `plan` by `profile`, per rank.

    The model (:func:`summa.planning.model.predict`) times one C tile's SUMMA (in
    memory: the whole block), times the number of tiles: its GEMMs, its
    broadcasts, and what of its time is neither (the exposed rest). Out of
    core without peer access each GPU uploads its own panel parts, so
    nothing goes between GPUs (``broadcaster="auto"`` of
    :func:`summa.api.multiply.matmul_arrays`). The host
    link moves :func:`_host_bytes`; out of core its copies overlap the
    GEMMs but for the first upload and the last write-back, in memory they
    come before and after the SUMMA. The disk is timed beside, not in it."""
    (m, n, k), (pr, pc) = plan.shape, plan.grid
    itemsize = np.dtype(plan.dtype).itemsize
    rows, cols = plan.memory.tiles if plan.out_of_core else (1, 1)
    tile = plan.memory.tile if plan.out_of_core else (-(-m // pr), -(-n // pc))
    own = plan.out_of_core and pr * pc > 1 and not profile.peer_access
    width = _model_width(plan)
    one = predict(profile, tile[0] * pr, tile[1] * pc, k, plan.dtype, plan.grid, width,
                  RunSetting(lookahead=plan.lookahead, precision=plan.precision))
    gemm = rows * cols * (_sweep_gemms(profile, plan, tile, plan.memory.chunk)
                          if plan.out_of_core and pr * pc == 1 else
                          one.panels * one.panel_compute)
    if own:
        links = 0.0
        summa = rows * cols * one.panels * (one.panel_compute + profile.panel_overhead(pr * pc))
    else:
        links, summa = rows * cols * one.received * one.panel_comm, rows * cols * one.seconds
    exposed = max(0.0, summa - max(gemm, links))
    # CPU ranks multiply where the data lie: nothing crosses a host link
    up, down = _host_bytes(plan, own) if traits(plan.backend).gpu else (0, 0)
    host = profile.host_seconds(up, down) if up else 0.0
    memory, node = _host_memory(plan, profile, up, down)
    if up and host is not None and plan.out_of_core:
        exposed += profile.host_seconds(*_head_tail(plan, width, tile)) + \
            _behind_a_narrow_head(plan, profile, width, tile, gemm / (rows * cols))
    floor, steps = _sweep_floor(plan, k)
    exposed += max(0.0, floor - max(gemm, links, host or 0.0, memory or 0.0) - exposed)
    split = TimeSplit(gemm, host, links, exposed, BOUNDS if plan.out_of_core else
                      ("gemm", "gpu_links"),
                      profile.disk_seconds((m * k + k * n) * itemsize, m * n * itemsize),
                      memory)
    return split, {"host_bytes": [up, down], "own_uploads": own, "comm": one.comm,
                   "host_link": profile.host_link(), "host_memory": node, "steps": steps,
                   "steps_seconds": floor}


def _sweep_gemms(profile, plan, tile, width: int) -> float:
    """Seconds of one rank's out-of-core GEMMs of one C `tile`: a GEMM a
    panel of `width` terms (and K's remainder), each at the profile's rate
    of its shape, where :func:`summa.planning.model.predict` times one rank's
    product as one GEMM over all of K. fp64-int8 folds the tile once a
    product, so its rate rises with the panel's width: in the h200
    profile 57.5 TFLOP/s for a 20480² tile's 8192-wide panels against 70.3
    over all of 40960; 40960³ under 24 GiB on one H200 took 2.3 s of
    products in 8192-wide panels (``benchmarks/fp64_int8_user_case.py
    --panel-width``), predicted 2.39 s so, 1.96 over all of K."""
    k = plan.shape[2]
    seconds = 0.0
    for count, terms in ((k // width, width), (1, k % width)):
        if count and terms:
            rate = profile.gemm_rate(tile[0], tile[1], terms, plan.dtype, plan.precision)
            seconds += count * 2.0 * tile[0] * tile[1] * terms / rate
    return seconds


#: Bytes of host memory traffic each byte a host copy moves costs: staged,
#: a copy thread's memcpy into a page-locked chunk (three:
#: :data:`summa.planning.profile.MEMCPY_TRAFFIC`) and the GPU's DMA reading
#: it from there (down: the DMA writes the chunk, a memcpy takes it to the
#: array; :mod:`summa.device.staging`); from page-locked blocks (host
#: copies ``lock``) the DMA alone reads or writes it.
TRAFFIC_A_BYTE = {"stage": 1 + MEMCPY_TRAFFIC, "lock": 1}


def _host_memory(plan, profile, up: int, down: int) -> tuple:
    """``(seconds, details)``: the node's host memory carrying what all its
    ranks' host copies read and write (`up` and `down` bytes a rank, each
    :data:`TRAFFIC_A_BYTE` times, and a new C's pages, which the kernel
    zeroes before the first write), shared by the node's copy threads
    (:meth:`summa.planning.profile.Profile.host_memory_seconds`). ``(None,
    None)`` where the profile has no ``host_memory`` or nothing is copied."""
    section = profile.host_memory()
    if section is None or not up + down:
        return None, None
    ranks = _node_ranks(plan, profile)
    threads = plan.copy_threads or staging.copy_threads(ranks, profile.cores)
    each = TRAFFIC_A_BYTE[plan.host_copies or "stage"] * (up + down) + \
        (0 if plan.placement.into_out else down)
    traffic, copiers = ranks * each, ranks * threads
    measured = profile.link_gpus()
    in_link = measured is not None and ranks <= measured
    details = {"traffic": traffic, "ranks": ranks, "copiers": copiers,
               "copy_gbs": profile.host_copy_gbs(copiers),
               "estimate": bool(section.get("estimate")), "in_link": measured if in_link else None}
    # Where the link's rates were measured with as many of the node's GPUs
    # copying at once, its staged copies already ran through this memory:
    # on one H100 host summa calibrate's staged rate (37.4 GB/s up) was its
    # memcpy rate (37.9), so the term, counting 4/3 of a memcpy a staged
    # byte, bounded float64 16384³ under 24 GiB at 0.25 s where a call took
    # 0.206 and the link says 0.18 (benchmarks/sweep_trace.py).
    return (None if in_link else profile.host_memory_seconds(traffic, copiers)), details


def _node_ranks(plan, profile) -> int:
    """Ranks of `plan` on one node of `profile`'s machine: its GPUs a node
    (its ``gpus`` over its ``nodes``), at most all of the plan's; all of
    them where it does not count GPUs."""
    per_node = -(-profile.gpus // profile.nodes) if profile.gpus else plan.ranks
    return max(1, min(plan.ranks, per_node))


def _sweep_floor(plan, k: int) -> tuple[float, int]:
    """``(seconds, steps)``: the least an out-of-core sweep on a GPU takes,
    its steps' and tiles' issuing (:data:`SWEEP_STEP_SECONDS`,
    :data:`SWEEP_TILE_SECONDS`), and its steps; ``(0.0, 0)`` in memory or
    on CPUs."""
    if not (plan.out_of_core and traits(plan.backend).gpu):
        return 0.0, 0
    steps = sweep_steps(plan.memory, k)
    tiles = plan.memory.tile_count
    return steps * SWEEP_STEP_SECONDS + tiles * SWEEP_TILE_SECONDS, steps


def _host_bytes(plan, own: bool) -> tuple[int, int]:
    """``(up, down)``: bytes one rank moves from host memory to its GPU and
    back, A and B starting in host memory and C ending there (beta 0). In
    memory: its blocks of A and B once up, of C once down. Out of core its
    C block comes down once; where every GPU uploads its own panel parts
    (`own`), all it needs (:func:`summa.planning.memory.host_traffic`),
    else the parts it owns: its A block once per column of C tiles, its B
    block once per row."""
    (m, n, k), (pr, pc) = plan.shape, plan.grid
    itemsize = np.dtype(plan.dtype).itemsize
    ml, nl = -(-m // pr), -(-n // pc)
    if own:
        return (host_traffic(plan.memory, plan.shape, plan.grid) - ml * nl) * itemsize, \
            ml * nl * itemsize
    rows, cols = plan.memory.tiles if plan.out_of_core else (1, 1)
    return (ml * -(-k // pc) * cols + -(-k // pr) * nl * rows) * itemsize, ml * nl * itemsize


def _head_tail(plan, width: int, tile) -> tuple[int, int]:
    """``(up, down)``: the bytes out of core that nothing hides: the first
    panel's first piece (a panel whole: the narrowest) goes up before the
    first GEMM, and the last tile's
    last row strip comes down after its GEMM (:mod:`summa.execution.outofcore`);
    with one C tile on the device at a time, every other tile's write-back
    too (the next tile waits for it; counted whole, though its first strips
    go while the last strips multiply)."""
    itemsize, memory = np.dtype(plan.dtype).itemsize, plan.memory
    # None: the first panel whole, the narrowest first (K's remainder, if any)
    first = min(memory.head_first, plan.shape[2]) if memory.head_first else \
        first_panel_width(plan.shape[2], width)
    last = min(memory.tail_smallest, tile[0])
    waited = waited_write_backs(plan.memory)
    return first * (tile[0] + tile[1]) * itemsize, (last * tile[1] + waited) * itemsize


def _behind_a_narrow_head(plan, profile, width: int, tile, tile_gemm: float) -> float:
    """Seconds the GPU waits for the second panel where the first goes whole
    and is the narrowest (K's remainder, :func:`_head_tail`): the first
    GEMM, `tile_gemm` seconds' share of the first panel's terms, hides only
    that much of a full panel's upload."""
    k = plan.shape[2]
    first = first_panel_width(k, width)
    if plan.memory.head_first or first == min(width, k):  # pieces, or no narrower panel
        return 0.0
    full = profile.host_seconds(width * sum(tile) * np.dtype(plan.dtype).itemsize, 0)
    return max(0.0, full - tile_gemm * first / k)


def _advice(plan, profile, bound: str, link) -> list[str]:
    """What would move the bound `bound` of `plan` (a part's name)."""
    if bound == "gpu_links":
        return ["GPUs that read each other's memory (NVLink, peer access), fewer ranks in a "
                "grid row or column, or wider panels (--nb) where the broadcasts' latency weighs"]
    if bound == "gemm":
        advice = []
        native = plan.precision is None
        if native and plan.dtype in ("float64", "complex128") and _rates(profile, plan,
                                                                         "fp64-int8"):
            advice.append("--precision fp64-int8 (float64 from exact INT8 tensor-core products, "
                          f"{_rates(profile, plan, 'fp64-int8'):.1f}x this profile's float64 "
                          "GEMM rate here; summa.freivalds checks the product)")
        if native and plan.dtype == "float32" and _rates(profile, plan, "tf32"):
            advice.append("--precision tf32 (float32 on tensor cores, "
                          f"{_rates(profile, plan, 'tf32'):.1f}x this profile's rate here)")
        return advice + ["more GPUs (each takes its share of the GEMMs)"]
    if bound == "host_memory":
        return _host_memory_advice(plan)
    rows, cols = plan.memory.tiles if plan.out_of_core else (1, 1)
    advice = [] if plan.out_of_core else [
        "out of core (--device-memory; summa.matmul on NumPy arrays runs so by itself): the "
        "copies then overlap the GEMMs"]
    if rows * cols > 1:
        advice.append(f"more device memory per GPU: fewer C tiles than {rows} x {cols} (B "
                      f"crosses the link once per row of tiles, A once per column)")
    if link and link.get("pinned_h2d_gbs"):
        advice.append("operands in page-locked memory (copied directly, "
                      f"{link['pinned_h2d_gbs']:g} GB/s against {link['h2d_gbs']:g} staged "
                      "from pageable memory)")
    if plan.out_of_core:  # a new result's pages are faulted in beside the copies
        advice.append("a result array used before (summa.matmul(..., out=c)): float64 16384³ "
                      "on an H200 took 0.20 s into one against 0.29-0.97 s into a new one")
    return advice + ["more GPUs, each on a link of its own (each moves its share)"]


def _host_memory_advice(plan) -> list[str]:
    """What would move a bound of the node's host memory: fewer bytes
    through it, or fewer ranks sharing it."""
    rows, cols = plan.memory.tiles if plan.out_of_core else (1, 1)
    advice = [] if plan.out_of_core else [
        "out of core (--device-memory): the copies then overlap the GEMMs"]
    if rows * cols > 1:
        advice.append(f"more device memory per GPU: fewer C tiles than {rows} x {cols} (fewer "
                      "bytes through the link and the host memory alike)")
    if (plan.host_copies or "stage") == "stage":
        advice.append("operands in page-locked memory, or SUMMA_HOST_COPIES=lock (the GPUs "
                      "read them where they lie: a quarter of the staged copies' traffic)")
    return advice + ["fewer GPUs a node, or more nodes (each node's memory carries its own "
                     "GPUs' copies)", "a host with more memory channels filled"]


def _rates(profile, plan, precision: str) -> float | None:
    """How many times faster the profile rates `precision`'s GEMMs than the
    plan's at its block shape, each at its default width (None: no samples)."""
    (m, n, _), (pr, pc) = plan.shape, plan.grid
    ml, nl = -(-m // pr), -(-n // pc)
    try:
        faster = profile.gemm_rate(ml, nl, default_panel_width(plan.backend, plan.dtype,
                                                               precision), plan.dtype, precision)
        now = profile.gemm_rate(ml, nl, _model_width(plan), plan.dtype, plan.precision)
    except ValueError:
        return None
    return faster / now if faster > now else None
