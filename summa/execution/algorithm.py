"""The public ``summa`` and ``gemm`` entry points on DistMatrix, and the
in-memory executor they run (:func:`run_in_memory`, set up ahead by
:func:`prepare`).

For each panel of the inner dimension the grid column owning A's panel
broadcasts it along the grid rows, the grid row owning B's panel broadcasts it
along the grid columns, and every rank accumulates ``C_local += alpha * A_p @ B_p``.
With lookahead ``L`` the broadcasts of the next ``L`` panels are in flight while
the current panel's GEMM runs. Broadcasts start in the same order on every
rank; a rank multiplies the panels it holds first where that lets all its
receives start at once, and with direct copies (ipc): :mod:`summa.planning.schedule`
decides the steps, :class:`summa.execution.pipeline.Pipeline` queues them;
:mod:`summa.execution.steps` orders and queues each rank's.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

from ..runtime.mpi import MPI
from .. import options
from ..precision import ozaki
from ..planning.checks import check_layouts, check_operands, check_schedule, check_scalars
from ..distribution.layout import Distribution, Layout, panel_schedule
from ..distribution.matrix import DistMatrix
from ..precision.ozaki_gpu import check_moduli
from ..planning.selection import export_blocks, grid_broadcasters, planned_copy_engines
from .steps import Call, run_steps, steps_of
from .transpose import PanelsOfA
from ..planning.distributed import plan_distributed
from ..planning.request import PlanRequest
from ..planning.tuning import column_major, planned_width
from ..planning.precision import asked_moduli
from ..runtime.watchdog import watch

__all__ = ["summa", "gemm", "run_in_memory", "SummaStats"]


@dataclass
class SummaStats:
    """What one SUMMA call spent, on this rank.

    Attributes
    ----------
    seconds : float
        Wall time of the whole loop on this rank.
    compute : float
        Time spent in GEMMs (device time on GPUs).
    wait : float
        ``seconds - compute``: time not spent computing, i.e. exposed
        communication and overheads.
    comm_seconds : float
        Time the broadcasts took (device time for NCCL; on MPI paths the host
        time spent in broadcast calls).
    panels : int
        Number of SUMMA steps.
    panel_width : int
        Requested panel width.
    """

    seconds: float = 0.0
    compute: float = 0.0
    wait: float = 0.0
    comm_seconds: float = 0.0
    panels: int = 0
    panel_width: int = 0
    comm: str = ""
    lookahead: int = 0
    extra: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)


def summa(alpha, A: DistMatrix, B: DistMatrix, beta, C: DistMatrix, panel_width=None,
          lookahead: int = 1, broadcaster: str = "auto", precision: str | None = None,
          progress=None, schedule: str = "panels", conj: tuple = (False, False),
          copies: tuple | None = None) -> SummaStats:
    """``C <- alpha * A @ B + beta * C`` in place, by SUMMA.

    Parameters
    ----------
    alpha, beta : scalar
        Scale factors; ``beta == 0`` ignores C's old values (NaNs included).
    A, B, C : DistMatrix
        Operands on one grid, with A's rows laid out like C's rows and B's
        columns like C's columns. A's columns and B's rows may differ.
    panel_width : int or "auto", optional
        Width of the inner-dimension panels (default per backend); ``"auto"``
        measures the GEMM rate of candidate widths once per problem
        (:func:`summa.planning.tuning.auto_panel_width`).
    lookahead : int
        Panels whose broadcasts run ahead of the GEMM (0 disables overlap).
    broadcaster : str
        Broadcaster: ``"auto"``, ``"ipc"``, ``"nccl"``, ``"cuda-aware"`` or ``"mpi"``.
    precision : {None, "tf32"}
        ``"tf32"`` lets float32/complex64 GEMMs use TF32 tensor cores (GPU).
    progress : callable, optional
        Called as ``progress(steps_done, steps_total)`` after each panel is queued.
    schedule : {"panels", "strips"}
        ``"strips"`` (grids of one column): B assembled in column strips of
        `panel_width` (``"auto"``: the default), each GEMM over all of K
        (:mod:`summa.execution.strips`).
    conj : tuple
        One rank: ``(A's, B's)`` whether its GEMMs conjugate that operand
        (op H of an operand that lies by rows of its transpose: cuBLAS's op
        C, no copy). A grid's panels are broadcast as they are: its
        operands come conjugated.

    Returns
    -------
    SummaStats
        This rank's timings.
    """
    if any(conj) and C.grid.size > 1:
        raise ValueError("conj applies to one rank; a grid's operands come conjugated")
    if copies is not None and len(copies) != 2:
        raise ValueError(f"copies must be (A's, B's) or None, got {copies!r}")
    check_operands(A, B, C)
    check_layouts(A, B, C)
    check_scalars(alpha, beta, C.dtype, precision, C.backend)
    check_schedule(schedule, C.grid.shape)
    # the planner's decisions first ("auto" measured there), then the run
    with C.backend.on_device():  # its GPU, whatever the caller's current one
        asked = PlanRequest(panel_width=panel_width, lookahead=lookahead,
                            broadcaster=broadcaster, precision=precision, schedule=schedule)
        plan, measured = plan_distributed(A, B, C, asked, copies=copies, panels_of_a=PanelsOfA)
    stats = run_in_memory(plan, A, B, C, alpha=alpha, beta=beta, conj=conj, progress=progress)
    stats.extra["panel_width_measured"] = measured
    return stats


def run_in_memory(plan, A: DistMatrix, B: DistMatrix, C: DistMatrix, *, alpha=1.0, beta=0.0,
                  conj: tuple = (False, False), progress=None) -> SummaStats:
    """The in-memory executor: ``C <- alpha A @ B + beta C`` by SUMMA as
    `plan` (a :class:`summa.planning.Plan`) decided it, on its operands'
    blocks on the devices: its panel width, lookahead, broadcaster,
    precision, schedule, transposed copies, fp64-int8's scheme (rows and
    planes) and panel sums. Decides nothing, reads no free memory (the
    plan's memory is what the run may draw: :class:`summa.device.account.Account`)
    but the broadcasters of the kind it names.

    Parameters
    ----------
    plan : summa.planning.Plan
        An in-memory plan of this product, settled on these operands (an integer
        width, ``copy_engines`` said: :func:`summa.planning.distributed.settled_plan`).
    A, B, C : DistMatrix
        The operands as :func:`summa` takes them.
    alpha, beta : scalar
    conj : tuple
        One rank: whether its GEMMs conjugate (A's, B's) panels.
    progress : callable, optional
        ``progress(steps_done, steps_total)``.

    Returns
    -------
    SummaStats
        This rank's timings.
    """
    check_scalars(alpha, beta, C.dtype, plan.precision, C.backend)
    strips = plan.schedule == "strips" and C.grid.size > 1
    copies = (plan.memory.transposed_a, plan.memory.transposed_b)
    extras = _Extras(progress, conj, copies, plan.scheme, plan.panel_sums is not None,
                     planned_copy_engines(plan.copy_engines))
    with C.backend.on_device():  # (the moduli: the plan's scheme hands them on)
        return _run(alpha, (A, B, C), beta, strips, (plan.panel_width, plan.lookahead,
                                                  plan.broadcaster, plan.precision), extras)


@dataclass(frozen=True)
class _Extras:
    """What a plan's run takes beside its operands and settings: `progress`;
    one rank's `conj`; the plan's transposed `copies` (A's, B's), fp64-int8's
    `scheme`, whether it sums a grid's panels (`sums`), its `copy_engines`."""

    progress: object = None
    conj: tuple = (False, False)
    copies: tuple = (False, False)
    scheme: object = None
    sums: bool = False
    copy_engines: bool = True


def _run(alpha, operands: tuple, beta, strips: bool, asked: tuple, extras: "_Extras"):
    """A checked plan's run (:func:`run_in_memory`) on its backend's GPU: its stats."""
    call, panels, stats = _prepared(alpha, operands, strips, asked, extras)
    C = operands[2]
    backend, grid = C.backend, C.grid
    t0 = time.perf_counter()
    first_beta = _first_beta(C, beta, panels)
    with backend.checked_later() as checks, backend.compute_stream():
        marks = run_steps(call, panels, first_beta, strips, stats.extra)
    with watch("the queued GPU work of the SUMMA loop (broadcasts and GEMMs)"):
        backend.synchronize()
    # float64 on INT8: inputs checked for Inf/NaN as the products went, asked once here
    if not grid.comm.allreduce(checks.finite(), op=MPI.LAND):
        raise ValueError(ozaki.NOT_FINITE)
    stats.seconds = time.perf_counter() - t0
    stats.compute = sum(backend.elapsed(a, b) for a, b in zip(marks[::2], marks[1::2]))
    stats.wait = max(0.0, stats.seconds - stats.compute)
    stats.comm_seconds = call.row_bc.take_seconds() + call.col_bc.take_seconds()
    return stats


def _prepared(alpha, operands: tuple, strips: bool, asked: tuple, extras: tuple) -> tuple:
    """``(call, steps, stats)`` of a plan's checked run: its broadcasters
    (of the kind the plan names) and exported blocks in a :class:`Call`,
    its steps in this rank's order, and the stats they start. `operands`:
    ``(A, B, C)``; `asked`: the plan's ``(panel_width, lookahead,
    broadcaster, precision)`` (an integer width: "auto" the planner's to
    settle); `extras`: an :class:`_Extras`."""
    (A, B, C), (panel_width, lookahead, broadcaster, precision) = operands, asked
    progress, conj, copies = extras.progress, extras.conj, extras.copies
    backend, grid = C.backend, C.grid
    panel_width = planned_width(panel_width)
    if int(lookahead) < 0:
        raise ValueError(f"lookahead must be >= 0, got {lookahead}")
    panels = panel_schedule(A.layout.cols, B.layout.rows, panel_width)
    row_bc, col_bc = grid_broadcasters(grid, broadcaster, backend,
                                       copy_engines=extras.copy_engines)
    schedule = "strips" if strips else "panels"
    # (a grid's blocks lie by rows on the devices: only one rank's B may not;
    # a plan's copy of B is made only where B does, as its PanelsOfB would)
    copies = (bool(copies[0]), bool(copies[1]) and grid.size == 1 and column_major(B.local))
    call = Call(alpha, A, B, C, precision, progress, int(lookahead), row_bc, col_bc,
                 export_blocks(grid, backend, row_bc, col_bc, A.local, B.local),
                 tuple(bool(x) for x in conj), *copies, extras.scheme, extras.sums)
    steps = steps_of(call, panels, strips, panel_width)
    stats = SummaStats(panels=len(steps), panel_width=panel_width,
                       comm=(col_bc if strips else row_bc).name, lookahead=call.lookahead,
                       extra={"panel_width_measured": False,  # (by the planner: its caller's)
                              "schedule": schedule,
                              "transposed_a": copies[0], "transposed_b": copies[1]})
    return call, steps, stats



def _first_beta(C: DistMatrix, beta, steps: list):
    """The beta of the first GEMM: one rank's applies beta itself (beta 0: C
    is not read), one pass over C fewer: 1-2 % of a one-GPU run at N = 16384
    (TF32, float16); elsewhere C is scaled here (zeroed for beta 0) and 1."""
    if C.grid.size == 1 and steps:
        return beta
    if beta == 0:
        C.local.fill(0)
    elif beta != 1:
        C.local *= beta
    return 1


def prepare(plan, A: DistMatrix, B: DistMatrix, C: DistMatrix) -> None:
    """Set up what :func:`run_in_memory` of `plan` (settled on these operands:
    :func:`summa.planning.distributed.settled_plan`) will use, so that it then
    times only the multiply: the broadcasters the plan names (made and
    self-tested once per grid), and with direct copies the peers' blocks
    opened. Collective."""
    row_bc, col_bc = grid_broadcasters(C.grid, plan.broadcaster, C.backend,
                                       copy_engines=planned_copy_engines(plan.copy_engines))
    # Direct copies (ipc): open the peers' blocks now; those that stay open
    # (summa/transports/ipc.py) the multiply then reads at once.
    direct = export_blocks(C.grid, C.backend, row_bc, col_bc, A.local, B.local)
    readers = [bc for bc, on in zip((row_bc, col_bc), direct) if on]
    for bc in readers:
        bc.connect()
    for bc in readers:
        bc.release()


_OPS = ("N", "T", "H")


def _check_op(name: str, op) -> str:
    op = str(op).upper()
    if op not in _OPS:
        raise ValueError(f"{name} must be one of N, T, H; got {op!r}")
    return op


def _operand(X: DistMatrix, op: str, outer: Distribution, inner_block,
             outer_axis: int) -> DistMatrix:
    """``op(X)`` with its outer dimension distributed as `outer` (C's rows for A,
    C's columns for B); a transposed operand is redistributed straight into it.
    An untransposed operand must already match (checked by :func:`gemm`)."""
    if op == "N":
        return X
    inner = Distribution(X.shape[0] if outer_axis == 0 else X.shape[1],
                         X.grid.shape[1 - outer_axis], inner_block)
    dists = (outer, inner) if outer_axis == 0 else (inner, outer)
    conj = op == "H" and X.dtype.kind == "c"
    return X.transpose(conj=conj, layout=Layout.from_distributions(*dists))


@options.entry_point
def gemm(A: DistMatrix, B: DistMatrix, C: DistMatrix | None = None, alpha=1.0, beta=0.0,
         trans_a: str = "N", trans_b: str = "N", panel_width=None, lookahead: int = 1,
         broadcaster: str = "auto", precision: str | None = None,
         stats: SummaStats | None = None, progress=None, schedule: str = "panels",
         moduli: int | None = None) -> DistMatrix:
    """``C <- alpha * op(A) @ op(B) + beta * C`` with op in N, T, H.

    Parameters
    ----------
    A, B : DistMatrix
        Operands on one grid. A transposed operand is redistributed first (one
        exchange of its blocks), straight into the layout the product needs.
    C : DistMatrix, optional
        Updated in place and returned. When None, a new matrix is returned whose
        rows are distributed like op(A)'s and columns like op(B)'s (beta ignored).
    alpha, beta : scalar
    trans_a, trans_b : {"N", "T", "H"}
        ``H`` is the conjugate transpose (the transpose for real dtypes).
    panel_width, lookahead, broadcaster, precision, progress, schedule
        See :func:`summa`.
    stats : SummaStats, optional
        Filled with this rank's timings.
    moduli : int, optional
        With ``precision="fp64-int8"``: INT8 products per float64 product
        (3-30; default :func:`summa.precision.ozaki.default_moduli`'s, 15 for panels
        up to 56391 wide); fewer is faster and keeps fewer bits.
    options : summa.options.Options, optional
        The settings (default: the current ones, from ``SUMMA_*`` variables
        read once here; docs/options.md). The backend's GEMM library is its
        own (:attr:`summa.device.backend.Backend.options`).

    Returns
    -------
    DistMatrix
        C.

    Examples
    --------
    >>> C = gemm(A, B, trans_a="T", alpha=2.0)  # doctest: +SKIP
    """
    op_a, op_b = _check_op("trans_a", trans_a), _check_op("trans_b", trans_b)
    # Everything below is checked before the transposes, so bad input never
    # starts communication.
    grid = A.grid
    m, n, _ = check_operands(A, B, C, op_a, op_b)
    check_scalars(alpha, beta, A.dtype, precision, A.backend)
    moduli = check_moduli(moduli, precision)
    check_schedule(schedule, grid.shape)
    if C is None:
        rows = A.layout.rows if op_a == "N" else Distribution(m, grid.shape[0], A.layout.cols.block)
        cols = B.layout.cols if op_b == "N" else Distribution(n, grid.shape[1], B.layout.rows.block)
    else:
        rows, cols = C.layout.rows, C.layout.cols
    for name, X, op, outer, axis in (("A", A, op_a, rows, 0), ("B", B, op_b, cols, 1)):
        have = X.layout.rows if axis == 0 else X.layout.cols
        if op == "N" and have != outer:
            raise ValueError(f"{name} is distributed as {have} along the dimension it "
                             f"shares with C, but C is distributed as {outer}")
    opA = _operand(A, op_a, rows, A.layout.rows.block, 0)
    opB = _operand(B, op_b, cols, B.layout.cols.block, 1)
    if C is None:
        layout = Layout.from_distributions(rows, cols)
        with A.backend.on_device():  # on its GPU, as the run that fills it
            local = A.backend.xp.zeros(layout.local_shape(grid.row, grid.col), dtype=A.dtype)
        C, beta = DistMatrix(grid, layout, local, A.backend), 0.0
    with asked_moduli(moduli):
        result = summa(alpha, opA, opB, beta, C, panel_width=panel_width, lookahead=lookahead,
                       broadcaster=broadcaster, precision=precision, progress=progress,
                       schedule=schedule)
    if stats is not None:
        for key, value in result.as_dict().items():
            setattr(stats, key, value)
    return C
