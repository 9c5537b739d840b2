"""Out-of-core SUMMA: matrices in host memory, streamed through the device in tiles.

A rank's blocks of A, B and C stay in host memory. The device holds C tiles
(the same number of row and column tiles on every rank) and a few panel slots.
For each tile, SUMMA runs as in memory, except that a panel's owner first
uploads its part of the panel (the tile's rows of its A columns, the tile's
columns of its B rows) from host memory into a slot, and the device
broadcaster sends it on from there: within a node the GPUs' copy engines
(``ipc``, through a staging buffer per slot, which stays allocated with the
broadcaster for the next call), leaving every multiprocessor to the GEMMs;
NCCL otherwise. So host data crosses the host-device link once per tile on
its owner only, and the other ranks get it over the GPU interconnect.

Traffic per rank: its A block once per column of tiles, its B block once per
row of tiles, and C once each way (in only when ``beta != 0``). The broadcast
volume is that of in-memory SUMMA times the number of tiles in the other
direction. The planner (:func:`summa.planning.make_plan`) takes the fewest tiles
that fit the device budget.

Overlap, on a GPU: uploads run on a stream of their own, `lookahead` steps
ahead of the GEMMs; a finished tile goes back on another stream while the next
is computed; the last panel of every tile is multiplied in row strips that
shrink, each written back as soon as it is final, so the last tile's
write-back hides behind its own GEMMs but for a short last strip; and the first
panel goes in pieces that double from a narrow one, so the first GEMM starts
after a short upload and each next upload hides behind the GEMMs before it. The
copies and GEMMs go through a mover (:mod:`summa.execution.movers`): on the NumPy
backend (tests) the same steps run with plain copies.
"""

from __future__ import annotations

import time

import numpy as np

from ..runtime.mpi import MPI
from ..precision import ozaki
from .algorithm import SummaStats
from ..planning.checks import check_scalars
from ..distribution.layout import panel_schedule
from ..planning.plan import Plan
from ..planning.sweepsetup import (check_prepared, check_sweep_operands, check_sweep_plan,
                                   prepared_sweep)
from .movers import CudaMover, HostMover
from .sweep import Cut, Sweep, SweepOperands, bounds, head_pieces
from ..runtime.watchdog import watch

__all__ = ["summa_out_of_core", "run_out_of_core", "SweepOperands"]


def summa_out_of_core(plan: Plan, operands: SweepOperands, device, *, alpha=1.0, beta=0.0,
                      progress=None) -> SummaStats:
    """``C <- alpha * A @ B + beta * C`` with A, B, C in host memory, as `plan`
    (:func:`summa.planning.make_plan`, out of core, for these operands on
    `device`'s kind of backend) decided it: its tiles under its device
    budget, panel width, lookahead, precision, broadcaster and on GPUs its
    host copies (``"stage"`` or ``"lock"``, :attr:`summa.planning.Plan.host_copies`)
    and their threads. Collective over C's grid.

    Parameters
    ----------
    plan : Plan
        The out-of-core Plan of this product; checked against the operands.
    operands : SweepOperands
        Host-resident A, B, C (NumPy backend) and, where given, `own_copies`:
        this rank's rows of A with all of K and all of K of B for its
        columns (views into node-shared arrays, :mod:`summa.host.shared`),
        from which every GPU uploads the panel parts it needs itself, over
        its own host link, and nothing is broadcast (GPUs without peer
        access, where forwarding a panel from its owner's GPU would pass
        through host memory again).
    device : Backend
        Where the GEMMs run (CuPy; NumPy for tests, where "device" arrays are
        host arrays and the plan's budget still decides the tiling).

    Makes the plan's broadcasters and the plan final for them (the planning
    step :func:`summa.planning.sweepsetup.prepared_sweep`), then runs it
    (:func:`run_out_of_core`, which also takes a C never touched: ``fresh_c``).

    Returns
    -------
    SummaStats
        With ``extra`` holding the tile shape and counts, transfer bytes and
        the Plan run (``extra["plan"]``, :meth:`summa.planning.Plan.as_dict`).
    """
    _check_sweep(alpha, operands.A, operands.B, beta, operands.C, device, plan.precision,
                 plan.host_integers)
    plan, broadcasters = prepared_sweep(plan, operands, device)
    return run_out_of_core(plan, operands, device, alpha=alpha, beta=beta, progress=progress,
                           broadcasters=broadcasters)


def run_out_of_core(plan: Plan, operands: SweepOperands, device, *, broadcasters: tuple,
                    alpha=1.0, beta=0.0, progress=None, fresh_c: bool = False) -> SummaStats:
    """``C <- alpha * A @ B + beta * C`` as `plan` (:func:`summa.planning.make_plan`,
    out of core) says: its tiles, panel width, slots, lookahead, precision,
    broadcaster, and on GPUs its host copies and their threads. `operands`
    (:class:`SweepOperands`): A, B, C and where given `own_copies`;
    `broadcasters`: ``(row, column)``, those `plan` was made final for
    (:func:`summa.planning.sweepsetup.prepared_sweep`, a planning step; a plan
    not made final for them is refused: nothing is decided here); `fresh_c`:
    C's memory was never touched and its values do not matter (beta 0): host
    threads fault its pages in during the GEMMs, so that the product lands at
    the speed of touched memory. The rest as for :func:`summa_out_of_core`."""
    with device.on_device():  # its GPU, whatever the caller's current one
        return _run(plan, operands, device, (alpha, beta), progress, fresh_c, broadcasters)


def _run(plan: Plan, operands: SweepOperands, device, scalars: tuple, progress,
         fresh_c: bool, broadcasters) -> SummaStats:
    """:func:`run_out_of_core` on the device's GPU."""
    (alpha, beta), (A, B, C) = scalars, (operands.A, operands.B, operands.C)
    _check_sweep(alpha, A, B, beta, C, device, plan.precision, plan.host_integers)
    check_sweep_plan(plan, A, B, C, device)
    grid = C.grid
    check_prepared(plan, broadcasters)
    row_bc, col_bc = broadcasters
    memory = plan.memory
    ml, nl = C.local.shape
    tiles = [(i0, i1, j0, j1) for i0, i1 in bounds(ml, memory.tiles[0])
             for j0, j1 in bounds(nl, memory.tiles[1])]
    if fresh_c and beta != 0:
        raise ValueError("fresh_c needs beta == 0: C's old values would be lost")
    mover = (CudaMover(device, np.dtype(plan.dtype), plan.host_copies, plan.copy_threads)
             if device.is_gpu else HostMover(device, np.dtype(plan.dtype)))
    panels = panel_schedule(A.layout.cols, B.layout.rows, plan.panel_width)
    panels = head_pieces(panels, mover.overlaps, memory.head_first)
    stats = SummaStats(panels=len(panels), panel_width=plan.panel_width,
                       comm=f"{row_bc.name} (host-resident)", lookahead=plan.lookahead)
    t0 = time.perf_counter()
    if beta != 0 and beta != 1:
        C.local *= beta
    elif beta == 0 and not panels:
        C.local.fill(0)  # k == 0; otherwise tiles start from zero on the device
    t_pin = time.perf_counter()
    locked = all([mover.pin(M.local) for M in (A, B, C)])
    if fresh_c:
        mover.touch(C.local)
    stats.extra = {"pin_seconds": time.perf_counter() - t_pin, "host_locked": locked}
    try:
        with device.checked_later() as checks:  # float64 on INT8: asked once, below
            Sweep(plan, (alpha, beta != 0), operands, Cut(tiles, panels), (row_bc, col_bc),
                   mover).run(progress)
            # GPU streams may wait on peers' broadcasts (NCCL kernels, ipc events)
            with watch("the queued GPU work of the out-of-core sweep (uploads, broadcasts, "
                       "GEMMs, write-backs)"):
                mover.finish()
    finally:
        mover.close()
    if not grid.comm.allreduce(checks.finite(), op=MPI.LAND):
        raise ValueError(ozaki.NOT_FINITE)
    stats.seconds = time.perf_counter() - t0
    _sweep_stats(stats, plan, mover, row_bc, col_bc)
    return stats


def _check_sweep(alpha, A, B, beta, C, device, precision, integers=None) -> None:
    """Refuse operands and scalars the sweep cannot take (the same on every
    rank); `integers`: the plan's staged integers' dtypes (computed in float64)."""
    check_sweep_operands(A, B, C, integers)
    check_scalars(alpha, beta, np.dtype(np.float64) if integers else C.dtype, precision,
                  device)


def _sweep_stats(stats: SummaStats, plan: Plan, mover, row_bc, col_bc) -> None:
    """The sweep's timings, transfers and plan into `stats`."""
    memory = plan.memory
    head, between, tail = mover.phases()
    stats.compute = mover.compute_seconds()
    stats.wait = max(0.0, stats.seconds - stats.compute)
    stats.comm_seconds = row_bc.take_seconds() + col_bc.take_seconds()
    # Copy-engine broadcasters stage slots in memory of their own, beside the pool.
    staging = sum(getattr(bc, "staging_bytes", lambda: 0)() for bc in {row_bc, col_bc})
    stats.extra.update({"out_of_core": True, "transposed_a": memory.transposed_a,
                        "transposed_b": memory.transposed_b,
                        "tile": list(memory.tile), "tiles": list(memory.tiles),
                        "chunk": memory.chunk, "device_budget": plan.device_budget,
                        "device_bytes_planned": memory.device_bytes,
                        "transfer_bytes": mover.moved, "staged_copies": mover.staged,
                        "staging_bytes": staging,
                        "head_seconds": head, "between_seconds": between,
                        "tail_seconds": tail,
                        # False: perhaps NaN/Inf (every element finite where True)
                        "product_finite": mover.product_finite,
                        "plan": plan.as_dict()})
