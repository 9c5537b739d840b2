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

import contextlib
import time
from collections import deque
from dataclasses import dataclass

from ..runtime.mpi import MPI
from .. import options
from ..precision import ozaki
from .algorithm import SummaStats
from ..planning.checks import check_layouts, check_operands, check_scalars
from ..runtime.faults import inject
from ..distribution.layout import narrowest_first, panel_schedule, split_panel_doubling
from ..distribution.matrix import DistMatrix
from .pipeline import local_parts, wait_for_panel
from ..planning.memory import TAIL_SHARE
from ..planning.planner import Machine, Plan, make_plan, restage
from ..planning.selection import grid_broadcasters
from ..host.storage import as_rows, copyable_rows, rows_shape
from .movers import CudaMover, HostMover
from .transpose import PanelForms, PanelsOfA, PanelsOfB
from ..runtime.watchdog import watch

__all__ = ["summa_out_of_core", "run_out_of_core", "prepared_sweep", "SweepOperands"]


@dataclass(frozen=True)
class SweepOperands:
    """The host-resident operands of one out-of-core product
    ``C <- alpha * A @ B + beta * C``.

    Attributes
    ----------
    A, B, C : DistMatrix
    own_copies : (ndarray, ndarray) or None
        This rank's rows of A with all of K and all of K of B for its
        columns, where every GPU uploads the parts it needs itself
        (:func:`summa_out_of_core`).
    """

    A: DistMatrix
    B: DistMatrix
    C: DistMatrix
    own_copies: tuple | None = None


@dataclass(frozen=True)
class _Cut:
    """How one rank's sweep cuts the product: its C tiles ``(i0, i1, j0,
    j1)`` and the panels of K (:func:`summa.distribution.layout.panel_schedule`)."""

    tiles: list
    panels: list


def summa_out_of_core(alpha, A: DistMatrix, B: DistMatrix, beta, C: DistMatrix, device,
                      device_budget: int, panel_width: int = 4096, lookahead: int = 1,
                      precision=None, progress=None, comm: str = "auto",
                      host_copies: str | None = None, fresh_c: bool = False,
                      own_copies=None) -> SummaStats:
    """``C <- alpha * A @ B + beta * C`` with A, B, C in host memory.

    Parameters
    ----------
    A, B, C : DistMatrix
        Host-resident operands (NumPy backend).
    device : Backend
        Where the GEMMs run (CuPy; NumPy for tests, where "device" arrays are
        host arrays and the budget still decides the tiling).
    device_budget : int
        Bytes of device memory this rank may use.
    lookahead : int
        Panel steps uploaded and broadcast ahead of the GEMMs.
    comm : str
        Broadcaster between the devices (``--comm``).
    host_copies : {"stage", "lock"}, optional
        How host blocks that are not page-locked reach the GPU (default
        ``SUMMA_HOST_COPIES``, else ``"stage"``; the plan settles it): ``"stage"``
        through a ring of page-locked chunks filled and drained by host
        threads (:mod:`summa.device.staging`; as many as the plan's
        ``copy_threads``; nothing to do before the first GEMM),
        or ``"lock"``: page-lock the whole blocks first, for as long as they
        live, and copy directly (pays once, for blocks multiplied again and
        again, as ``bench`` does). Page-locking A and B in the background
        instead, staging until then, measured slower on the H200 machine
        (N = 40960: 4.34 s against 3.13 s): locking stalls the other CUDA
        calls, and unlocking costs at the end. Blocks already page-locked are
        always copied directly.
    fresh_c : bool
        C's memory was never touched and its values do not matter (beta 0):
        host threads fault its pages in during the GEMMs, so that the
        product lands at the speed of touched memory.
    own_copies : (ndarray, ndarray), optional
        This rank's rows of A with all of K and all of K of B for its
        columns (views into node-shared arrays, :mod:`summa.host.shared`): then
        every GPU uploads the panel parts it needs itself, over its own
        host link, and nothing is broadcast. For GPUs without peer access
        (PCIe cards), where forwarding a panel from its owner's GPU would
        pass through host memory again.

    Plans the sweep (:func:`summa.planning.make_plan` to `device_budget`,
    :func:`prepared_sweep`), then runs it (:func:`run_out_of_core`).

    Returns
    -------
    SummaStats
        With ``extra`` holding the tile shape and counts, transfer bytes and
        the Plan run (``extra["plan"]``, :meth:`summa.planning.Plan.as_dict`).
    """
    _check_sweep(alpha, A, B, beta, C, device, precision)
    # (the grid's node: the copy threads share its cores with its other ranks)
    plan = make_plan((A.shape[0], B.shape[1], A.shape[1]), C.dtype,
                     Machine(device.name, C.grid.size, ranks_on_node=C.grid.local_size),
                     grid=C.grid.shape, out_of_core=True,
                     device_memory=int(device_budget), panel_width=panel_width,
                     lookahead=lookahead, precision=precision, broadcaster=comm,
                     host_copies=host_copies)
    operands = SweepOperands(A, B, C, own_copies)
    plan, broadcasters = prepared_sweep(plan, operands, device)
    return run_out_of_core(plan, operands, device, alpha=alpha, beta=beta, progress=progress,
                           fresh_c=fresh_c, broadcasters=broadcasters)


def prepared_sweep(plan: Plan, operands: SweepOperands, device) -> tuple:
    """``(plan, (row, column) broadcasters)`` of a sweep of `operands`: those
    made (:func:`_sweep_broadcasters`), `plan` made final for them
    (:func:`summa.planning.restage`: ipc stages each slot) before
    :func:`run_out_of_core`, which decides nothing. Checks first; collective."""
    A, B, C = operands.A, operands.B, operands.C
    _check_sweep_operands(A, B, C)
    _check_plan(plan, A, B, C, device)
    with device.on_device():
        bcs = _sweep_broadcasters(plan, operands, device)
    return restage(plan, tuple(bc.name == "ipc" for bc in bcs)), bcs


def run_out_of_core(plan: Plan, operands: SweepOperands, device, *, alpha=1.0, beta=0.0,
                    progress=None, fresh_c: bool = False, broadcasters=None) -> SummaStats:
    """``C <- alpha * A @ B + beta * C`` as `plan` (:func:`summa.planning.make_plan`,
    out of core) says: its tiles, panel width, slots, lookahead, precision,
    broadcaster, and on GPUs its host copies and their threads. `operands`
    (:class:`SweepOperands`): A, B, C and where given `own_copies`;
    `broadcasters`: those `plan` was made final for (:func:`prepared_sweep`),
    or None: made here so. The rest as for :func:`summa_out_of_core`."""
    with device.on_device():  # its GPU, whatever the caller's current one
        return _run(plan, operands, device, (alpha, beta), progress, fresh_c, broadcasters)


def _run(plan: Plan, operands: SweepOperands, device, scalars: tuple, progress,
         fresh_c: bool, broadcasters) -> SummaStats:
    """:func:`run_out_of_core` on the device's GPU."""
    (alpha, beta), (A, B, C) = scalars, (operands.A, operands.B, operands.C)
    _check_sweep(alpha, A, B, beta, C, device, plan.precision)
    _check_plan(plan, A, B, C, device)
    grid = C.grid
    if broadcasters is None:
        plan, broadcasters = prepared_sweep(plan, operands, device)
    row_bc, col_bc = broadcasters
    if restage(plan, (row_bc.name == "ipc", col_bc.name == "ipc")) is not plan:
        raise ValueError("the plan does not count its broadcasters' staging: prepared_sweep")
    memory = plan.memory
    ml, nl = C.local.shape
    tiles = [(i0, i1, j0, j1) for i0, i1 in _bounds(ml, memory.tiles[0])
             for j0, j1 in _bounds(nl, memory.tiles[1])]
    if fresh_c and beta != 0:
        raise ValueError("fresh_c needs beta == 0: C's old values would be lost")
    mover = (CudaMover(device, C.dtype, plan.host_copies, plan.copy_threads)
             if device.is_gpu else HostMover(device, C.dtype))
    panels = panel_schedule(A.layout.cols, B.layout.rows, plan.panel_width)
    panels = _head_pieces(panels, mover.overlaps, memory.head_first)
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
            _Sweep(plan, (alpha, beta != 0), operands, _Cut(tiles, panels), (row_bc, col_bc),
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


def _sweep_broadcasters(plan: Plan, operands: SweepOperands, device) -> tuple:
    """``(row, column)`` broadcasters of the sweep: none where every rank
    holds its own copies of the rows of A and columns of B it needs
    (`operands.own_copies`, checked here), else the plan's (``"host"``,
    which needs own copies, as ``"auto"``)."""
    C, k = operands.C, operands.A.shape[1]
    if operands.own_copies is None:
        return grid_broadcasters(C.grid, "auto" if plan.broadcaster == "host"
                                 else plan.broadcaster, device)
    a_rows, b_cols = operands.own_copies
    if a_rows.shape != (C.local.shape[0], k) or b_cols.shape != (k, C.local.shape[1]):
        raise ValueError(f"own_copies must be this rank's {C.local.shape[0]} rows of A and "
                         f"{C.local.shape[1]} columns of B with all {k} of K")
    none = _NoBroadcasts()
    return none, none


def _check_sweep(alpha, A, B, beta, C, device, precision) -> None:
    """Refuse operands and scalars the sweep cannot take (the same on every rank)."""
    _check_sweep_operands(A, B, C)
    check_scalars(alpha, beta, C.dtype, precision, device)


def _check_sweep_operands(A, B, C) -> None:
    """Refuse operands the sweep cannot take (the same on every rank)."""
    check_operands(A, B, C)
    check_layouts(A, B, C)
    if C.backend.is_gpu:
        raise ValueError("out-of-core operands must be host-resident (NumPy backend)")
    # A and B may lie any way (the plan's storage says how they are read); C
    # is written by rows.
    if any(M.local.ndim != 2 for M in (A, B, C)) or not copyable_rows(C.local):
        raise ValueError("out-of-core operands must be 2-D host arrays, C with contiguous rows")


def _check_plan(plan: Plan, A, B, C, device) -> None:
    """Refuse a plan made for another product, grid, dtype or device."""
    have = ((A.shape[0], B.shape[1], A.shape[1]), tuple(C.grid.shape), C.dtype.name,
            device.name)
    planned = (tuple(plan.shape), tuple(plan.grid), plan.dtype, plan.backend)
    if not plan.out_of_core:
        raise ValueError("the plan runs in memory, not out of core")
    if have != planned:
        raise ValueError(f"the plan is for (m, n, k), grid, dtype, device {planned}, "
                         f"not {have}")
    # make_plan settles both for GPUs; a plan without them was made otherwise
    if device.is_gpu and (plan.host_copies not in options.HOST_COPIES
                          or not plan.copy_threads):
        raise ValueError(f"a GPU's plan says how host copies go and on how many threads "
                         f"(make_plan), not host_copies={plan.host_copies!r}, "
                         f"copy_threads={plan.copy_threads!r}")


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


class _Sweep:
    """Every (tile, panel) step of this rank's out-of-core multiply, with
    `lookahead` steps broadcast ahead of the GEMMs and, where `slots` leaves
    room, uploads steps further ahead: a broadcast waits for its upload on
    the owner and for the GEMMs done with its slot on every rank, so with
    both ready at the same GEMM's end no rank's broadcast waits (NCCL: spins
    on SMs beside the GEMMs) for the other's.

    Parameters
    ----------
    plan : Plan
        The lookahead, slots, precision, how A and B lie (parts stored by
        columns go up as their transposes' rows, the GEMMs reading them
        transposed) and whether A's parts, and B's that lie by columns, are
        read from a transposed copy.
    scalars : tuple
        ``(alpha, load_c)``; load_c: C's tiles go up before their first GEMM
        (beta != 0).
    operands : SweepOperands
    cut : _Cut
        The tiles and panels.
    broadcasters : tuple
        ``(row_bc, col_bc)``.
    mover : CudaMover or HostMover
    """

    def __init__(self, plan: Plan, scalars: tuple, operands: SweepOperands, cut: _Cut,
                 broadcasters: tuple, mover):
        (self.alpha, self.load_c), (self.row_bc, self.col_bc) = scalars, broadcasters
        self.plan, self.operands, self.mover = plan, operands, mover
        self.tiles, self.panels = cut.tiles, cut.panels
        self.slots, C = plan.memory.slots, operands.C
        self.smallest = plan.memory.tail_smallest
        # Tile counts agree on all ranks (the plan); sizes are this rank's own,
        # and the same along a grid row (rows) or column (columns), as broadcasts need.
        tm = max((i1 - i0 for i0, i1, _, _ in self.tiles), default=0)
        tn = max((j1 - j0 for _, _, j0, j1 in self.tiles), default=0)
        width = max((p.width for p in self.panels), default=0)
        self.steps = [(t, i) for t in range(len(self.tiles)) for i in range(len(self.panels))]
        # lead: uploads run so far ahead of the broadcasts
        self.depth, self.lead = plan.lookahead + 1, max(0, self.slots - plan.lookahead - 1)
        xp, held = mover.xp, min(self.slots, len(self.steps))
        self.a_slots = [xp.empty(tm * width, dtype=C.dtype) for _ in range(held)]
        self.b_slots = [xp.empty(width * tn, dtype=C.dtype) for _ in range(held)]
        # One C buffer: each tile's GEMMs wait for the last one's write-back
        # (the mover's begin_tile waits for the buffer's last download).
        self.c_bufs = [xp.empty(tm * tn, dtype=C.dtype)
                       for _ in range(min(plan.memory.c_buffers, len(self.tiles)))]
        self.forms = PanelForms(
            PanelsOfA(mover.device, tm, width, C.dtype, plan.memory.transposed_a),
            PanelsOfB(mover.device, width, tn, C.dtype, plan.memory.transposed_b))
        # The last tile's write-back overlaps nothing but its own last GEMMs, so
        # there the last `tail` panels (all resident: tail <= depth) go strip by
        # strip, each strip home once final; earlier tiles' write-backs overlap the
        # next tile, and their last panel alone goes in strips.
        self.tail = min(self.depth, len(self.panels)) if mover.overlaps else 1

    def run(self, progress=None) -> None:
        """Every step; `progress(done, steps)` after each."""
        steps, ahead = len(self.steps), self.depth + self.lead
        staged = deque(self._upload(s) for s in range(min(ahead, steps)))
        inflight = deque(self._send(s, staged.popleft()) for s in range(min(self.depth, steps)))
        s = 0
        while s < steps:
            group = self._step(s, inflight)
            if progress is not None:
                progress(s + group, steps)
            for j in range(s, s + group):  # step j's slot is free once its GEMMs are done
                if j + ahead < steps:
                    staged.append(self._upload(j + ahead))
                if j + self.depth < steps:
                    inflight.append(self._send(j + self.depth, staged.popleft()))
            s += group

    def _gemm(self, a, b, c) -> None:
        self.mover.gemm(self.alpha, a, b, c, self.plan.precision, self.forms,
                        self.plan.conj, self.plan.scheme)

    def _upload(self, s: int) -> tuple:
        """The owners' parts of step s, from host memory into slot ``s % slots``
        (once the GEMMs of the step that used it are done)."""
        t, i = self.steps[s]
        i0, i1, j0, j1 = self.tiles[t]
        p, slot, (stored_a, stored_b) = self.panels[i], s % self.slots, self.plan.storage
        a = _slot_part(self.a_slots[slot], (i1 - i0, p.width), stored_a)
        b = _slot_part(self.b_slots[slot], (p.width, j1 - j0), stored_b)
        ops = self.operands
        parts = _host_parts(ops.A, ops.B, p, self.tiles[t], ops.C.grid, ops.own_copies)
        return (a, b, *(None if part is None else self.mover.upload(dev, as_rows(part, stored))
                        for dev, part, stored in zip((a, b), parts, self.plan.storage)))

    def _send(self, s: int, uploaded: tuple) -> tuple:
        """Step s's broadcasts of its uploaded parts: ``(op(A)'s part, op(B)'s
        part, their arrivals)``."""
        a, b, up_a, up_b = uploaded
        p = self.panels[self.steps[s][1]]
        slot, (stored_a, stored_b) = s % self.slots, self.plan.storage
        # A staged upload's event exists once its copies are queued: only a
        # broadcast to other ranks needs it now (a grid row or column of one
        # rank waits for it at its GEMM).
        ready_a = None if _alone(self.row_bc) else self.mover.event_of(up_a)
        ready_b = None if _alone(self.col_bc) else self.mover.event_of(up_b)
        # (the slots as they went up and over; the GEMMs read them as op(A)'s, op(B)'s parts)
        return (as_rows(a, stored_a), as_rows(b, stored_b),
                _Arrival(up_a, self.row_bc.ibcast(a, p.a_root, slot, ready=ready_a), self.mover),
                _Arrival(up_b, self.col_bc.ibcast(b, p.b_root, slot, ready=ready_b), self.mover))

    def _step(self, s: int, inflight: deque) -> int:
        """Step s's GEMMs, once its panel has arrived: with the last tile's
        last `tail` panels, those steps too. Returns how many steps it took."""
        t, i = self.steps[s]
        i0, i1, j0, j1 = self.tiles[t]
        host_tile = self.operands.C.local[i0:i1, j0:j1]
        buf = t % len(self.c_bufs)
        c = self.c_bufs[buf][: host_tile.size].reshape(host_tile.shape)
        if i == 0:
            self.mover.begin_tile(c, host_tile, buf, self.load_c)
        last_tile = t == len(self.tiles) - 1
        group = self.tail if last_tile and i == len(self.panels) - self.tail else 1
        arrived = [inflight.popleft() for _ in range(group)]
        if s <= 1 < s + group:
            inject("summa")
        for j, (_, _, ra, rb) in enumerate(arrived):
            wait_for_panel(i + j, self.panels[i + j], ra, rb, self.operands.C.grid,
                           f" for C tile {t} of {len(self.tiles)}")
        if i + group < len(self.panels):
            self._gemm(arrived[0][0], arrived[0][1], c)
        else:
            self._last_panels(arrived, c, host_tile, buf)
        return group

    def _last_panels(self, arrived: list, c, host_tile, buf: int) -> None:
        """A tile's last panels, `arrived`, in row strips, each strip going
        home once final (float64 on INT8 products make B's residues once for
        all strips where there is one panel; with several, a strip each)."""
        mover = self.mover
        with mover.device.same_b() if len(arrived) == 1 else contextlib.nullcontext():
            for r0, r1 in _tail_strips(c.shape[0], mover.overlaps, self.smallest):
                if r0 == r1:
                    continue
                for a, b, _, _ in arrived:
                    self._gemm(a[r0:r1], b, c[r0:r1])
                mover.write_back(host_tile[r0:r1], c[r0:r1], buf)


def _host_parts(A, B, p, tile: tuple, grid, own_copies) -> tuple:
    """The host parts of op(A) and op(B) this rank uploads for panel `p` of
    C tile `tile` ``(i0, i1, j0, j1)``: the panel's owners theirs (None on
    the others), or with `own_copies` (rows of A, columns of B with all of
    K, :func:`summa_out_of_core`) every rank its own, from host memory."""
    i0, i1, j0, j1 = tile
    if own_copies is not None:
        a_rows, b_cols = own_copies
        return a_rows[i0:i1, p.k0:p.k1], b_cols[p.k0:p.k1, j0:j1]
    a_host, b_host = local_parts(A, B, p)
    return (a_host[i0:i1] if grid.col == p.a_root else None,
            b_host[:, j0:j1] if grid.row == p.b_root else None)


def _slot_part(flat, shape: tuple, storage: str):
    """The part of a slot (the flat device buffer `flat`) that the host part
    of op(X) of `shape` is copied into, C-ordered: of its transpose's shape
    where X is stored by columns (:func:`summa.host.storage.as_rows` of it is
    then the part itself, column-major)."""
    return flat[: shape[0] * shape[1]].reshape(rows_shape(shape, storage))


class _NoBroadcasts:
    """Where every rank uploads its own panel parts: nothing to send."""

    name = "own uploads"

    class _Done:
        def wait(self) -> None:
            pass

    def ibcast(self, buf, root, slot=0, ready=None, own=False):
        return self._Done()

    def take_seconds(self) -> float:
        return 0.0


def _alone(broadcaster) -> bool:
    """Does `broadcaster` send nothing (one rank, or every rank its own parts)?"""
    if isinstance(broadcaster, _NoBroadcasts):
        return True
    comm = getattr(broadcaster, "comm", None)
    return comm is not None and comm.Get_size() == 1


class _Arrival:
    """A panel part's broadcast, and (on its owner) its upload, to wait for."""

    def __init__(self, uploaded, pending, mover):
        self.uploaded, self.pending, self.mover = uploaded, pending, mover

    def wait(self) -> None:
        self.pending.wait()
        self.mover.wait_event(self.uploaded)


def _head_pieces(panels: list, overlaps: bool, first: int | None) -> list:
    """`panels` ordered and cut so that the first GEMM waits for a short
    upload, where uploads overlap the GEMMs: the first cut in pieces that
    double from `first` columns (the plan's ``head_first``); where it goes
    whole (None: fp64-int8, whose every product folds the whole tile), the
    narrowest panel first (:func:`narrowest_first`): a sweep whose GEMMs are
    faster than their uploads would wait between panels behind a narrow
    first one, but pieces of K cost fp64-int8 a fold each, the order none
    (fp64-int8 40960³ with the whole H200: 2.31-2.35 s narrowest first against
    2.38-2.40 a full panel first, docs/benchmarks.md, "The matrix")."""
    if not panels or not overlaps:
        return panels
    if first is None:
        return narrowest_first(panels)
    return split_panel_doubling(panels[0], first) + panels[1:]


def _tail_strips(rows: int, overlaps: bool, smallest: int) -> list[tuple[int, int]]:
    """Row ranges a tile's last panels go in, each written back once final.

    The write-backs queue on one stream behind the strips' GEMMs: the first
    strip is a share of the rows (the write-back stream starts early), each
    next one that share of the rows left, so each write-back hides behind
    the next strip's GEMMs, down to a last strip of about `smallest` rows
    (the plan's ``tail_smallest``).
    """
    if not overlaps:
        return [(0, rows)]
    cuts = [0]
    while True:
        rest = rows - cuts[-1]
        take = int(rest * TAIL_SHARE)
        take = max(smallest, take // 64 * 64 if take >= 128 else take)  # GEMM-friendly
        if rest - take < smallest:
            return list(zip(cuts, cuts[1:] + [rows]))
        cuts.append(cuts[-1] + take)


def _bounds(size: int, parts: int) -> list[tuple[int, int]]:
    """`parts` near-equal ranges covering ``[0, size)`` (some empty when size < parts)."""
    cuts = [size * i // parts for i in range(parts + 1)]
    return list(zip(cuts[:-1], cuts[1:]))
