"""A plan as text: what ``str(plan)`` and ``summa plan`` print of a
:class:`summa.planning.plan.Plan` (the `plan` every function here takes):
the memory per rank, each decision, and where the plan carries one, the
model's prediction (:mod:`summa.planning.prediction`) with where its time
goes, what bounds it and what would move that. Decides and predicts nothing.
"""

from __future__ import annotations

import numpy as np

from ..host.storage import transposed
from ..precision import binaries
from ..device.traits import traits
from .memory import format_bytes, waited_write_backs
from .model import gemm_flops
from .profile import MEMCPY_TRAFFIC
from .prediction import SWEEP_STEP_SECONDS, SWEEP_TILE_SECONDS

__all__ = ["plan_lines"]

_GIB = 2.0**30  # bytes in the GiB the report counts in


def plan_lines(plan) -> list[str]:
    """What ``summa plan`` prints: the memory per rank, then each decision."""
    memory, (m, n, k), grid = plan.memory, plan.shape, plan.grid
    lines = [f"plan: {m} x {n} x {k} {plan.dtype} on {plan.ranks} rank"
             f"{'' if plan.ranks == 1 else 's'} (grid {grid[0]}x{grid[1]}), nb "
             f"{plan.panel_width}, lookahead {plan.lookahead}, {plan.backend} backend: "
             f"{memory.mode}", _peak_line(plan)]
    lines += _memory_lines(plan) + _fp64_int8_lines(plan) + _staging_lines(plan)
    if plan.predicted:
        lines += _prediction_lines(plan)
    return lines + _storage_lines(plan) + _integer_lines(plan) + _decision_lines(plan)


def _integer_lines(plan) -> list[str]:
    """Integer operands converted as they are staged (nothing for others)."""
    if not getattr(plan, "host_integers", None):
        return []
    a, b, c = plan.host_integers
    return [f"  integers converted as they are staged: A ({a}) and B ({b}) into "
            f"{plan.dtype} as the copy threads fill the page-locked chunks, the product "
            f"into {c} as they drain (no {plan.dtype} copy of them in host memory)"]


def _peak_line(plan) -> str:
    """The peak memory per rank: on GPUs the device's and the host's; CPU
    ranks have no device, their tiles (out of core) lie in host memory."""
    memory = plan.memory
    if traits(plan.backend).gpu:
        return (f"  peak per rank: device {memory.device_bytes / _GIB:.2f} GiB, host "
                f"{memory.host_bytes / _GIB:.2f} GiB")
    return (f"  peak per rank: host {memory.host_bytes / _GIB:.2f} GiB"
            + (f", and {format_bytes(memory.device_bytes)} of working tiles"
               if memory.device_bytes else ""))


def _memory_lines(plan) -> list[str]:
    """How the device memory counted in the peak is laid out: out of core
    its C tiles and panel slots, the staged and transposed panels."""
    memory, lines = plan.memory, []
    if memory.tile:
        lines.append(f"  C tiles of {memory.tile[0]} x {memory.tile[1]} ({memory.tiles[0]} x "
                     f"{memory.tiles[1]} per rank), panels of {memory.chunk} columns in "
                     f"{memory.slots} slots")
        if waited_write_backs(memory):
            lines.append("  one C tile on the device at a time (these tiles, fewer and larger "
                         "so that an operand crosses the host link fewer times, or asked for "
                         "by SUMMA_OOC_TILES, fit only so): each tile starts once the last "
                         "one's write-back is done")
    if any(memory.staged):
        lines.append("  copy-engine broadcasts (ipc) stage each slot's panel once more "
                     "(counted above; --comm nccl plans without)")
    if memory.transposed_a:
        lines.append("  A's panels are copied transposed for the GEMMs (one scratch panel "
                     "counted above; SUMMA_TRANSPOSE_A)")
    if memory.transposed_b:
        lines.append("  B's panels, which lie by columns, are copied row-major for the GEMMs "
                     "(one scratch panel counted above; SUMMA_TRANSPOSE_B)")
    return lines


def _fp64_int8_lines(plan) -> list[str]:
    """fp64-int8's scratch: its moduli, the rows its products take at a
    time, the integer products its folds take a pass, a grid's panel sums."""
    memory, lines = plan.memory, []
    if plan.moduli is not None:
        lines.append(f"  fp64-int8: each panel product's int8 residues ({plan.moduli} moduli), "
                     "integer products and float64 sums counted above")
        # (docs/benchmarks.md, "float64 on INT8: the user's call": outside the
        # prediction, once a machine)
        lines.append(f"  {binaries.shipped()}; its first products of each new shape try "
                     "cuBLASLt's INT8 candidates (kept in SUMMA_CACHE_DIR)")
    if memory.int8_rows is not None:
        whole = "of a tile's" if memory.tile else "of C's"
        lines.append(f"  fp64-int8's products take C's rows {memory.int8_rows} at a time (B's "
                     f"residues made once): the scratch of all {whole} rows does not fit")
    if memory.int8_planes is not None:
        lines.append(f"  fp64-int8's folds take {memory.int8_planes} integer products a pass "
                     "over C's sums (the room left holds them; counted above)")
    if plan.panel_sums is not None:
        lines.append(f"  on this grid each rank sums its panels' INT8 products and folds C once "
                     f"where its device also holds the sums ({plan.panel_sums / _GIB:.2f} GiB "
                     "beside its blocks and panels); else a fold a panel, as counted above")
    return lines


def _staging_lines(plan) -> list[str]:
    """The page-locked chunks host copies pass through, and what host
    memory a call adds beside them."""
    if not plan.memory.staging_bytes:
        return []
    (m, n, _), threads = plan.shape, plan.copy_threads
    return [f"  host copies pass through {plan.memory.staging_bytes / 2**20:.0f} MiB of "
            f"page-locked chunks, filled and drained by {threads} copy "
            f"thread{'s' * (threads != 1)} a rank (SUMMA_COPY_THREADS); summa.matmul "
            "on NumPy arrays reads A and B where they lie, so its extra host "
            f"memory is C ({m * n * np.dtype(plan.dtype).itemsize / _GIB:.2f} GiB, or "
            "none with out=) and those chunks"]


def _decision_lines(plan) -> list[str]:
    """The decisions the lines above do not show, where the operands lie,
    and the plan's note."""
    decided = (f"  decided: {plan.schedule}, op(A) {plan.trans[0]}, op(B) {plan.trans[1]}, "
               f"broadcaster {plan.broadcaster}{_direct_copies(plan)}, "
               f"precision {plan.precision or 'default'}")
    if plan.out_of_core:
        decided += (f", device budget {plan.device_budget / _GIB:.2f} GiB"
                    if traits(plan.backend).gpu else
                    f", working tiles budget {format_bytes(plan.device_budget)}")
    if plan.host_copies:
        decided += f", host copies {plan.host_copies}"
    lines = [decided]
    if plan.placement.where != "host":
        lines.append(f"  {plan.placement}")
    if plan.note:
        lines.append(f"  {plan.note}")
    return lines


def _direct_copies(plan) -> str:
    """What ``auto`` settled on the operands for GPUs of a grid
    (``plan.copy_engines``): direct copies (ipc) between a node's GPUs, or
    none; nothing where it decides nothing or is not settled yet."""
    if plan.broadcaster != "auto" or plan.copy_engines is None or plan.ranks == 1 \
            or not traits(plan.backend).gpu:
        return ""
    if plan.copy_engines:
        return " (direct copies between a node's GPUs where they pass their self-test)"
    return " (no direct copies: the peers' blocks would open slower than the GEMMs hide)"


def _storage_lines(plan) -> list[str]:
    """How A and B are read where they lie, never by a transposing copy
    (nothing where both lie by rows)."""
    if tuple(plan.storage) == ("rows", "rows") and not any(plan.conj):
        return []
    lines = []
    for name, storage, conj in zip("AB", plan.storage, plan.conj):
        text = {"rows": "by rows, as it lies",
                "cols": "by columns: its transpose's rows, the GEMM's transposed operand",
                "strided rows": "strided: gathered by rows by the host copy threads",
                "strided cols": "strided: gathered by columns by the host copy threads, the "
                                "GEMM's transposed operand"}[storage]
        if conj:
            text += (", conjugated by the GEMM" if transposed(storage) else
                     ", conjugated before its GEMM (a copy on the device)")
        lines.append(f"  op({name}) {text}")
    return lines


def _prediction_lines(plan) -> list[str]:
    """The model's time for the plan, where it goes, what bounds it and
    what would move that, with what it assumes."""
    pred = plan.predicted
    if "error" in pred:
        return [f"  no prediction from {pred['profile']}: {pred['error']}"]
    where = " (the profile shipped with summa: 2 H200s; calibrate yours)" if pred["shipped"] \
        else ""
    lines = [f"  predicted by the model: {pred['seconds']:.2f} s, {pred['tflops']:.1f} "
             f"TFLOP/s{where}",
             f"  where the time goes, a {'GPU' if traits(plan.backend).gpu else 'rank'} (A and "
             "B start in host memory, C ends there):"]
    lines += _split_lines(plan)
    split = pred["split"]
    if plan.out_of_core:
        combined = ("max(GEMMs, host link, host memory, GPU links) + exposed: out of core they "
                    "overlap")
        if plan.precision == "fp64-int8":
            # its tiles fold C once per panel and make their own residues (docs/benchmarks.md,
            # "float64 on INT8: speed", out of core: 59 against 77 TFLOP/s in memory): the
            # calibrated rate of a product of the panel's width counts both
            combined += ("; fp64-int8's products timed a panel at a time, at the profile's "
                         "rate for the panel's width (each product folds the tile again and "
                         "makes its residues)")
        else:
            combined += (" (measured 0.86-0.99 of in-memory on one H200 where the host link "
                         "keeps up with the GEMMs)")
    else:
        combined = ("max(host link, host memory) + max(GEMMs, GPU links) + exposed: in memory "
                    "the copies come before and after the SUMMA (none for data made on the "
                    "GPUs, as bench's)")
    lines += [f"  combined: {combined}", _bound_line(pred),
              "  would move it: " + "; ".join(pred["advice"])]
    if pred.get("steps_seconds", 0.0) > split[pred["bound"]]:
        tiles = plan.memory.tile_count
        lines.append(f"  most of the time is the sweep's {pred['steps']} steps over {tiles} C "
                     f"tiles, each issued by the host, ~{SWEEP_STEP_SECONDS * 1e3:.1f} ms a step "
                     f"and ~{SWEEP_TILE_SECONDS * 1e3:.1f} ms a tile on an H200 however small: "
                     "more device memory cuts fewer, larger tiles")
    if pred.get("next"):
        lines.append(f"  next bound, {_bound_name(pred['next'], pred)} at "
                     f"{split[pred['next']]:.1f} s: " + "; ".join(pred["next_advice"]))
    if "native_seconds" in pred:
        native = pred["native_seconds"]
        lines.append(f"  native {plan.dtype} by the same profile: {native:.2f} s, "
                     f"{pred['native_tflops']:.1f} TFLOP/s ({native / pred['seconds']:.2f}x "
                     "fp64-int8's time)")
    return lines


#: Parts named beside the largest after the bound: those within this share
#: of it (the host link and the host memory of one copy, estimated, can come
#: near each other: a near tie is no ranking).
NEAR_RUNNER = 0.75


def _bound_line(pred: dict) -> str:
    """The bound, its share of the time, and the next largest parts (those
    within :data:`NEAR_RUNNER` of the largest of them) with their time."""
    split = pred["split"]
    others = sorted(((value, name) for name, value in split.items()
                     if name in _PART_NAMES and name != pred["bound"] and value is not None),
                    reverse=True)
    named = [(v, name) for v, name in others if others and v >= NEAR_RUNNER * others[0][0]]
    beside = ", ".join(f"{_bound_name(name, pred)} {v:.1f} s" for v, name in named[1:])
    return (f"  bound by: {_bound_name(pred['bound'], pred)}, {pred['bound_share'] * 100:.0f} % "
            "of the time" + (f"; {_bound_name(named[0][1], pred)} would take "
                             f"{named[0][0]:.1f} s" if named else "")
            + (f", {beside}" if beside else ""))


#: The parts of a time split as ``summa plan`` names them.
_PART_NAMES = {"gemm": "the GEMMs", "host_link": "the host link",
               "host_memory": "the node's host memory", "gpu_links": "the GPU links"}


def _bound_name(bound: str, pred: dict) -> str:
    """The bound named for a person: the host link with its kind (PCIe),
    the host memory with its rate, said to be an estimate where the
    profile's is."""
    link = pred.get("host_link") or {}
    if bound == "host_link" and link.get("name"):
        return f"the host link ({link['name']})"
    node = pred.get("host_memory") or {}
    if bound == "host_memory" and node:
        return (f"{_PART_NAMES[bound]} ({node['copy_gbs']:g} GB/s of memcpy"
                + (", an estimate)" if node["estimate"] else ")"))
    return _PART_NAMES[bound]


def _split_lines(plan) -> list[str]:
    """One line a part of the plan's time split, with what it counts."""
    pred = plan.predicted
    split, link = pred["split"], pred.get("host_link")
    (m, n, k), ranks = plan.shape, plan.ranks
    gb = 1e9
    up, down = (b / gb for b in pred["host_bytes"])
    flops = gemm_flops(plan.dtype, m, n, k) / ranks
    kind = plan.dtype + (" from INT8 products" if plan.precision == "fp64-int8" else "")
    rows = [("GEMMs", split["gemm"], f"{kind} at {flops / split['gemm'] / 1e12:.2f} TFLOP/s a "
             + ("GPU" if traits(plan.backend).gpu else "rank"))]
    moved = f"{up:.1f} GB up, {down:.1f} GB down"
    if not traits(plan.backend).gpu:
        moved = "none: CPU ranks multiply in host memory"
    elif link:
        moved = (f"{link.get('name', 'host <-> GPU')}: {moved} at {link['h2d_gbs']:g} / "
                 f"{link['d2h_gbs']:g} GB/s, staged from pageable memory")
    else:
        moved = f"the profile has no host_link rates ({moved})"
    rows.append(("host link", split["host_link"], moved))
    rows.append(("host memory", split.get("host_memory"), _host_memory_text(plan)))
    if ranks == 1:
        between = "one GPU"
    elif pred["own_uploads"]:
        between = "none: without peer access each GPU uploads its own panel parts"
    else:
        between = f"the panels each GPU receives, by {pred['comm']}"
    rows.append(("GPU links", split["gpu_links"], between))
    last = "the write-backs the next tile waits for" if waited_write_backs(plan.memory) \
        else "the last write-back"
    rows.append(("exposed", split["exposed"], "pipeline fill, per-panel (out of core: per-step) "
                 "overhead"
                 + (f", the first upload and {last}" if plan.out_of_core else "")))
    files = f"{(m * k + k * n) * np.dtype(plan.dtype).itemsize / gb:.1f} GB and writes " \
        f"{m * n * np.dtype(plan.dtype).itemsize / gb:.1f} GB"
    rows.append(("disk", split["disk"], f"only summa multiply on .npy files, beside the time "
                 f"above: reads {files}" if split["disk"] is not None else
                 f"the profile has no disk rate (summa multiply on .npy files reads {files})"))
    def value(seconds):  # (right-aligned in 22 columns with the name, a space between)
        return f"{seconds:.2f} s" if seconds is not None else "not counted"
    return [f"    {name} {value(seconds):>{21 - len(name)}}  {what}" for name, seconds, what in rows]


def _host_memory_text(plan) -> str:
    """What the host memory row counts: the node's ranks' copies, the
    traffic they make and the rate the node's copy threads reach."""
    node = plan.predicted.get("host_memory")
    if not traits(plan.backend).gpu:
        return "none: CPU ranks multiply where the data lie"
    if not node:
        return ("nothing crosses it" if not sum(plan.predicted["host_bytes"]) else
                "the profile has no host_memory rate (summa calibrate measures it)")
    if node.get("in_link"):
        gpus = node["in_link"]
        return (f"in the host link's rates, measured with {gpus} GPU{'s' * (gpus != 1)} of the "
                f"node copying at once ({node['traffic'] / 1e9:.0f} GB read and written)")
    return (f"{node['ranks']} GPU{'s' * (node['ranks'] != 1)} a node: {node['traffic'] / 1e9:.0f} "
            f"GB read and written at {MEMCPY_TRAFFIC * node['copy_gbs']:g} GB/s (memcpy "
            f"{node['copy_gbs']:g} GB/s on {node['copiers']} threads"
            + ("; an estimate)" if node["estimate"] else ")"))
