"""One rank's steps of an in-memory SUMMA run
(:func:`summa.execution.algorithm.run_in_memory`): which steps, in this
rank's order (K panels, column strips, or on a CPU rank alone strips of C's
rows, :func:`one_rank_steps`), and queuing them: one rank's GEMMs, column
strips (:mod:`summa.execution.strips`), or the grid's broadcasts and GEMMs
(:class:`summa.execution.pipeline.Pipeline`), with fp64-int8's panel sums
on a grid. The entry points and the run's set-up are
:mod:`summa.execution.algorithm`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from ..runtime.mpi import MPI
from ..distribution.matrix import DistMatrix
from ..precision.ozaki_gpu import Scheme
from ..precision.panel_sums import PanelSums, grid_exponents, panel_sums_apply
from .pipeline import Pipeline, PipelineReport, Product, in_place_parts, local_parts
from ..planning.schedule import HEAD_PIECES, make_schedule, order_panels, waits_first
from .strips import multiply_strips, strip_bounds
from ..device.traits import traits
from .transpose import PanelForms, PanelsOfA, PanelsOfB

__all__ = ["Call", "run_steps", "steps_of", "one_rank_steps", "RowStrip", "ONE_RANK_GEMM_FLOPS",
           "ONE_RANK_MIN_ROWS"]


@dataclass(frozen=True)
class Call:
    """The prepared pieces of one :func:`summa.execution.algorithm.summa` call
    that its loops read."""

    alpha: object
    A: DistMatrix
    B: DistMatrix
    C: DistMatrix
    precision: str | None
    progress: object
    lookahead: int
    row_bc: object
    col_bc: object
    direct: tuple  # (A's, B's) panels copied from the roots' blocks (ipc)
    conj: tuple = (False, False)  # one rank: (A's, B's) conjugated by the GEMMs
    transposed_a: bool = False  # A's panels read through a transposed copy (PanelsOfA)
    transposed_b: bool = False  # B's, lying by columns, through a row-major one (PanelsOfB)
    scheme: object = None  # fp64-int8: how its products run (the plan's; None: the default)
    sums: bool = False  # fp64-int8 on a grid: panel sums (the plan's)

def run_steps(call: Call, panels: list, first_beta, strips: bool, extra: dict) -> list:
    """Queue the SUMMA loop of `call`'s `panels` (steps) on this rank: one
    rank's GEMMs, column strips, or the grid's broadcasts and GEMMs; its
    reports go into `extra` (its run's
    :attr:`summa.execution.algorithm.SummaStats.extra`). Returns the GEMMs'
    event marks (start, end pairs)."""
    C, precision = call.C, call.precision
    backend, grid = C.backend, C.grid
    # Made inside the caller's compute stream: its copies go on the stream its
    # GEMMs run on. (K panels where an operand is read transposed; else column
    # or row strips)
    copied = call.transposed_a or call.transposed_b
    width = max((p.width for p in panels), default=0) if copied else 0
    forms = PanelForms(PanelsOfA(backend, C.local.shape[0], width, C.dtype, call.transposed_a),
                       PanelsOfB(backend, width, C.local.shape[1], C.dtype, call.transposed_b))
    sums = _panel_sums(call, strips, panels)
    if precision == "fp64-int8":  # (bench's records say which way it went)
        extra["panel_sums"] = sums is not None
    if grid.size == 1:
        return _one_rank(call, panels, forms, first_beta)
    if strips:
        marks = []
        multiply_strips(call, panels, marks, extra)
        return marks
    report = _on_grid(call, panels, forms, sums)
    extra.update(report.extra())
    return report.marks

def steps_of(call: Call, panels: list, strips: bool, width: int) -> list:
    """The steps of this call in this rank's order: K panels, or column
    strips (:func:`summa.execution.strips.strip_bounds`)."""
    grid, backend = call.C.grid, call.C.backend
    if grid.size == 1:
        # One rank: nothing to overlap, so the fewest GEMMs (panel by panel where
        # an operand is read transposed: a copy of all of it would take its room).
        if call.transposed_a or call.transposed_b:
            return panels
        return one_rank_steps(panels, call.C.local.shape, backend.name, call.A.shape[1])
    if strips:
        return strip_bounds(call.C.local.shape[1], width,
                            HEAD_PIECES if backend.is_gpu else 1)
    # The head splits on GPUs whatever the lookahead, so that the summation
    # order, and so the bits, never depend on it; but only where a rank has
    # no panel of its own to multiply while the first one is on its way.
    split = backend.is_gpu and _someone_waits_first(call, panels)
    return order_panels(panels, (grid.row, grid.col), call.direct, split)


def _someone_waits_first(call: Call, panels: list) -> bool:
    """Collective: does any rank's first GEMM wait for a broadcast
    (:func:`summa.planning.schedule.waits_first`)?"""
    grid = call.C.grid
    held = [a and b for a, b in in_place_parts(panels, grid, call.A, call.B, call.direct)]
    return grid.comm.allreduce(waits_first(held, call.lookahead), op=MPI.LOR)


def _one_rank(call: Call, steps: list, forms, first_beta) -> list:
    """One rank's GEMMs (one, a panel each where an operand is read
    transposed, `forms`, or on CPUs a strip of C's rows each,
    :func:`one_rank_steps`); returns their timing marks."""
    A, B, C = call.A, call.B, call.C
    backend, marks = C.backend, []
    for i, p in enumerate(steps):
        c, beta = C.local, first_beta if i == 0 else 1
        if isinstance(p, RowStrip):  # over all of K, straight into its rows of C
            a, b, c, beta = A.local[p.r0:p.r1], B.local, c[p.r0:p.r1], first_beta
        elif len(steps) > 1 or call.transposed_a or call.transposed_b:
            a, b = local_parts(A, B, p)
        else:
            a, b = A.local, B.local
        marks.append(backend.timing_mark())
        a, b, conj = forms(a, b, call.conj)
        backend.gemm(call.alpha, a, b, c, beta=beta, precision=call.precision, conj=conj,
                     scheme=call.scheme)
        marks.append(backend.timing_mark())
        if call.progress is not None:
            call.progress(i + 1, len(steps))
    return marks


def _on_grid(call: Call, panels: list, forms, sums) -> PipelineReport:
    """The SUMMA loop over `panels` (in this rank's order), each GEMM reading
    its operands as `forms` give them; with `sums` (fp64-int8) the panels' products
    go to them and C is folded once at the end."""
    A, B, C = call.A, call.B, call.C
    grid = C.grid
    schedule = make_schedule(panels, (grid.row, grid.col), call.direct,
                             in_place_parts(panels, grid, A, B, call.direct), call.lookahead)
    product = Product(call.alpha, C.backend, C.local, call.precision, forms, sums, call.scheme)
    report = Pipeline(A, B, C, schedule, (call.row_bc, call.col_bc), product, call.progress).run()
    if sums is not None:  # the one fold of C, alpha applied (beta already was)
        report.marks.append(C.backend.timing_mark())
        sums.finish(call.alpha, C.local, 1.0)
        report.marks.append(C.backend.timing_mark())
    return report


def _panel_sums(call: Call, strips: bool, panels: list):
    """fp64-int8 on a grid of several ranks: a :class:`summa.precision.panel_sums.PanelSums`
    for this rank's C block with the exponents of all of K
    (:func:`summa.precision.panel_sums.grid_exponents`), so the panels' INT8 products
    are summed and C folded once, not once a panel (a fold costs ~35 ms per
    2**29 elements of C on an H200: at 4096-wide panels a third of each
    rank's compute: docs/benchmarks.md, "Panel sums on a grid"), and the
    product is one GPU's whole one; else
    None: for complex128, strips, K past an int32 sum or of fewer than
    :data:`summa.precision.ozaki.K_NATIVE` terms (native float64 then), or
    where the plan said no (``call.sums``: its panel sums, where
    ``SUMMA_FP64_INT8_SUMS`` and the devices allow them). Collective."""
    A, C, precision = call.A, call.C, call.precision
    grid, k = C.grid, A.layout.shape[1]
    if precision != "fp64-int8" or strips or \
            not panel_sums_apply(C.dtype, grid.size, k, sums=bool(call.sums)):
        return None
    return _made_sums(call)


def _made_sums(call: Call):
    """The :class:`summa.precision.panel_sums.PanelSums` of `call`'s C block
    with the exponents of all of K (collective)."""
    A, B, C = call.A, call.B, call.C
    grid, k = C.grid, A.layout.shape[1]
    scheme = call.scheme or Scheme()
    exponents = grid_exponents(A.local, B.local, grid.row_comm, grid.col_comm, k, scheme)
    return PanelSums(*C.local.shape, k, exponents, C.backend, scheme)


#: Floating-point operations of one GEMM of a CPU rank that multiplies alone:
#: Ctrl-C (KeyboardInterrupt) is taken between GEMMs, so this bounds its wait
#: (0.7 s at 100 GFLOP/s, what two cores ran; one GEMM of 6000^3 made it 4.3 s).
ONE_RANK_GEMM_FLOPS = 2**36
#: ... but no fewer rows of C than this: float64 3000^3 on two cores ran
#: 512-row strips at 91 GFLOP/s, one GEMM at 90, 256-row strips at 86.
ONE_RANK_MIN_ROWS = 512


class RowStrip(NamedTuple):
    """Rows ``r0:r1`` of C: one GEMM over all of K of a CPU rank alone."""

    r0: int
    r1: int


def one_rank_steps(panels: list, c_shape, backend_name: str, k: int = 0) -> list:
    """The GEMMs of a rank that multiplies alone (`panels`: the K panels of
    its product, `k` its inner dimension): on GPUs one over all of K (the
    first panel stands for it; they queue, so more would not bound a wait);
    on CPUs strips of C's rows (:class:`RowStrip`), each a GEMM over all of K
    written straight into its rows (no product-sized temporary, which steps
    of K adding into C would each need) of about :data:`ONE_RANK_GEMM_FLOPS`
    (at least :data:`ONE_RANK_MIN_ROWS` rows), so that Ctrl-C is answered
    within one of them."""
    if traits(backend_name).gpu or not panels:
        return panels[:1]
    m, n = c_shape
    rows = max(ONE_RANK_MIN_ROWS, ONE_RANK_GEMM_FLOPS // max(1, 2 * n * k))
    return [RowStrip(r, min(r + rows, m)) for r in range(0, m, rows)] or panels[:1]
