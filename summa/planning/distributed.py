"""The Plan of ``summa`` and ``gemm`` on DistMatrix operands that already
lie on the devices, made before the run (:func:`plan_distributed`).

Every decision the in-memory executor
(:func:`summa.execution.algorithm.run_in_memory`) follows, from the
operands' metadata and, for ``"auto"``, a measurement: the panel width
(:func:`summa.planning.tuning.panel_width_for`, measured once per problem
through the form of A's panels the executors hand in), the transposed
copies of A's and B's panels (:func:`summa.planning.tuning.transposes_a`,
:func:`summa.planning.tuning.transposes_b`), and for fp64-int8 on a grid
whether its panels' products are summed (where every rank's device holds
the sums: :func:`summa.planning.memorycheck.panel_sums_fit`), and for
``auto`` on GPUs whether direct copies (ipc) pay for the operands'
blocks (:func:`summa.planning.selection.direct_copies_pay`, the Plan's
``copy_engines``). The broadcasters are made by the run, of the kind the
Plan names and as it chose. A Plan made without the operands (``make_plan``'s,
for arrays, files and the benchmark) has its width and that choice settled
on them before the run (:func:`settled_plan`). The operands' memory is
theirs already: the Plan's is counted
(:func:`summa.planning.memory.memory_plan`), not checked."""

from __future__ import annotations

from dataclasses import replace

from ..distribution.layout import panel_schedule
from .precision import asked_scheme, moduli_asked, panel_sums_apply, panel_sums_bytes
from .memory import Execution, memory_plan
from .memorycheck import panel_sums_fit
from .plan import Plan
from .request import PlanRequest
from .selection import direct_copies_pay
from .tuning import column_major, is_width, panel_width_for, transposes_a, transposes_b

__all__ = ["plan_distributed", "settled_width", "settled_plan"]


def plan_distributed(A, B, C, request: PlanRequest = PlanRequest(), *,
                     copies: tuple | None = None, panels_of_a=None) -> tuple:
    """``(Plan, measured)``: the in-memory Plan of ``C <- alpha A @ B + beta
    C`` on checked DistMatrix operands (:func:`summa.execution.algorithm.summa`'s),
    and whether an ``"auto"`` panel width was measured for it now (False:
    the default, given, or measured before for the same problem).
    Collective over C's grid, on its backend's device.

    Parameters
    ----------
    request : PlanRequest
        Its `panel_width`, `lookahead`, `broadcaster`, `precision` and
        `schedule`, as :func:`summa.execution.algorithm.summa` takes them
        (the others are the operands' own): a `panel_width` of None, the
        backend's default width; ``"auto"``, measured (under ``"strips"``,
        whose columns cost nothing to cut, the default).
    copies : tuple or None
        ``(A's, B's)``: whether the GEMMs read A's panels, and B's that lie
        by columns (one rank), from transposed copies; None: as
        :func:`summa.planning.tuning.transposes_a` and ``transposes_b`` say.
    panels_of_a : callable, optional
        How the multiply forms A's panels for their GEMMs, for the
        measurement (:func:`summa.planning.tuning.auto_panel_width`).
    """
    backend, grid = C.backend, C.grid
    panel_width, lookahead, precision = request.panel_width, request.lookahead, request.precision
    schedule, broadcaster = request.schedule, request.broadcaster
    strips = schedule == "strips" and grid.size > 1
    if strips and isinstance(panel_width, str) and panel_width == "auto":
        # "auto" times GEMMs of K panels; strips cut columns, which cost nothing
        # measurable on an H200: the default width serves.
        panel_width = None
    width, measured = panel_width_for(A, B, C, panel_width, precision, panels_of_a,
                                      asked_scheme(precision))
    if int(lookahead) < 0:
        raise ValueError(f"lookahead must be >= 0, got {lookahead}")
    runs = "strips" if strips else "panels"
    # (a grid's blocks lie by rows on the devices: only one rank's B may not)
    columns = grid.size == 1 and column_major(B.local)
    if copies is None:
        copies = (transposes_a(backend.name, C.dtype, precision, runs),
                  transposes_b(backend.name, C.dtype, precision, runs, columns))
    copies = (bool(copies[0]), bool(copies[1]) and columns)
    (m, k), n = A.shape, B.shape[1]
    memory = memory_plan(m, n, k, C.dtype, tuple(grid.shape), width, Execution(
        int(lookahead), backend.name, schedule=runs, precision=precision,
        storage=("rows", "cols" if columns else "rows")))
    memory = replace(memory, transposed_a=copies[0], transposed_b=copies[1])
    sums = _panel_sums(A, B, C, width, int(lookahead), precision, strips)
    # last of the planner's collectives, where the run asked it before its
    # broadcasters were made: the same order on every rank
    engines = _copy_engines(A, B, C, width, broadcaster, precision)
    plan = Plan((m, n, k), C.dtype.name, backend.name, grid.size, tuple(grid.shape),
                ("N", "N"), schedule, False, width, int(lookahead), precision,
                None,  # (moduli: each panel's product takes its own, as asked)
                None, memory, broadcaster,
                panel_sums=sums, storage=("rows", "cols" if columns else "rows"),
                # read once here (None: each panel's product its K's default)
                scheme_moduli=moduli_asked() if precision == "fp64-int8" else None,
                copy_engines=engines)
    return plan, measured


def settled_width(plan, A, B, C, panels_of_a=None) -> tuple:
    """``(plan, measured)``: `plan` (an in-memory Plan made without the
    operands, :func:`summa.planning.make_plan`'s) with its panel width an
    integer, for the in-memory executor, which takes it as it is: an
    ``"auto"`` width measured now on the DistMatrix operands A, B, C
    (:func:`summa.planning.tuning.panel_width_for`: once per problem, A's
    panels formed by `panels_of_a`, fp64-int8 as the plan's scheme; on one
    rank the default), None the default; `plan` itself where its width is an
    integer already. `measured`: whether the width was measured in this
    call. The rest of the plan (its memory, its predictions) stays as it was
    planned. Collective over C's grid where it measures: call it at the same
    point on every rank, on C's backend's device."""
    if is_width(plan.panel_width):
        return plan, False
    with C.backend.on_device():
        width, measured = panel_width_for(A, B, C, plan.panel_width, plan.precision,
                                          panels_of_a, plan.scheme)
    return replace(plan, panel_width=width), measured


def settled_plan(plan, A, B, C, panels_of_a=None) -> tuple:
    """``(plan, measured)``: `plan` (an in-memory Plan made without the
    operands, :func:`summa.planning.make_plan`'s) with what the DistMatrix
    operands A, B, C decide settled before the in-memory executor takes
    it: its panel width (:func:`settled_width`; `measured` whether it was
    measured in this call), then whether ``auto`` may copy directly
    (``copy_engines``, :func:`summa.planning.selection.direct_copies_pay`)
    where the plan has not said. Collective over C's grid: call it at the
    same point on every rank, on C's backend's device."""
    plan, measured = settled_width(plan, A, B, C, panels_of_a)
    if plan.copy_engines is None:
        with C.backend.on_device():
            engines = _copy_engines(A, B, C, plan.panel_width, plan.broadcaster,
                                    plan.precision)
        plan = replace(plan, copy_engines=engines)
    return plan, measured


def _copy_engines(A, B, C, width: int, broadcaster: str, precision) -> bool:
    """May ``auto`` copy panels of `width` directly (ipc) for these
    operands (:func:`summa.planning.selection.direct_copies_pay`, over
    the multiply's K panels)? Collective where it decides."""
    panels = panel_schedule(A.layout.cols, B.layout.rows, width)
    return direct_copies_pay(A, B, C, panels, broadcaster, precision)


def _panel_sums(A, B, C, width: int, lookahead: int, precision, strips: bool) -> int | None:
    """Device bytes of fp64-int8's panel sums of this rank's block of C
    where its grid's panels' INT8 products are summed and C folded once
    (:class:`summa.precision.panel_sums.PanelSums`: float64 on several ranks,
    K of enough terms within an int32 sum, panels, unless
    ``SUMMA_FP64_INT8_SUMS=0``: :func:`summa.planning.precision.panel_sums_apply`;
    where every rank's device holds them beside the pipeline's panel
    buffers); else None.
    Collective where it asks the devices."""
    grid, k = C.grid, A.layout.shape[1]
    if precision != "fp64-int8" or strips or \
            not panel_sums_apply(C.dtype, grid.size, k):
        return None
    panels = panel_schedule(A.layout.cols, B.layout.rows, width)
    widest = max((p.width for p in panels), default=0)
    if not panel_sums_fit(C.local.shape, k, widest, lookahead, C.backend, grid.comm):
        return None
    return panel_sums_bytes(*C.local.shape, widest, k)
