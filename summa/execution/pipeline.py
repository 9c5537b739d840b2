"""The in-memory SUMMA loop of one rank: a :class:`Pipeline` walks a
:class:`summa.planning.schedule.Schedule` and queues what it says, deciding nothing.

Broadcasters that read the roots' blocks directly (ipc) need no packing on the
root and no per-panel handshake: the blocks are exported once, and the
(collective, slow) opening of the peers' blocks comes where the schedule puts
it, after this rank's GEMMs of its own panels are queued, which then hide it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import NamedTuple

from ..runtime.faults import inject
from ..planning.schedule import CONNECT, MULTIPLY, SETTLE, START, Schedule
from ..runtime.watchdog import watch

__all__ = ["Pipeline", "PipelineReport", "Product", "in_place_parts", "local_parts",
           "wait_for_panel"]


def local_parts(A, B, p) -> tuple:
    """This rank's stored parts of panel `p`: its columns of A and its rows of B
    (views; meaningful on the panel's roots)."""
    return (A.local[:, p.a_offset:p.a_offset + p.width],
            B.local[p.b_offset:p.b_offset + p.width, :])


def in_place_parts(panels, grid, A, B, direct) -> list[tuple[bool, bool]]:
    """Per panel, whether this rank uses its A part and its B part where they
    lie (no receive, no packing): on their owner, where the part is contiguous
    or peers read it in place (direct copies), and along a grid row/column of
    one rank (its owner)."""
    flags = []
    for p in panels:
        a, b = local_parts(A, B, p)
        flags.append((grid.col == p.a_root and (direct[0] or grid.shape[1] == 1
                                                or a.flags.c_contiguous),
                      grid.row == p.b_root and (direct[1] or grid.shape[0] == 1
                                                or b.flags.c_contiguous)))
    return flags


def wait_for_panel(i: int, p, ra, rb, grid, context: str = "") -> None:
    """Complete panel `i`'s two broadcasts, each a step the watchdog can name
    (`context`, e.g. " for C tile 2", is appended to the name)."""
    with watch(f"the broadcast of A panel {i} (columns {p.k0}:{p.k1}) from grid column "
               f"{p.a_root} along grid row {grid.row}{context}"):
        ra.wait()
    with watch(f"the broadcast of B panel {i} (rows {p.k0}:{p.k1}) from grid row "
               f"{p.b_root} along grid column {grid.col}{context}"):
        rb.wait()


def _settle(*sends) -> None:
    """Complete the broadcasts a rank sent from its own block: host requests
    (MPI) finish here; device ones need no stream to wait, since that block is
    never rewritten (waiting would tie this rank's GEMMs to the receivers'
    progress)."""
    for pending in sends:
        with watch("a broadcast this rank sends to finish"):
            pending.settle()


@dataclass(frozen=True)
class Product:
    """One panel's product, ``C_local += alpha * a @ b``, as the loop queues it:
    its operands read as `forms` (a :class:`summa.execution.transpose.PanelForms`)
    give them, and with `sums` (fp64-int8 panel sums) the product added to them instead
    of to C."""

    alpha: object
    backend: object
    c: object
    precision: str | None
    forms: object
    sums: object = None
    scheme: object = None  # fp64-int8: how its products run (the plan's)

    def __call__(self, a, b) -> None:
        a, b, _ = self.forms(a, b)  # (a grid's panels come conjugated)
        if self.sums is None:
            self.backend.gemm(self.alpha, a, b, self.c, precision=self.precision,
                              scheme=self.scheme)
        else:
            self.sums.add(a, b)


@dataclass
class PipelineReport:
    """What a :class:`Pipeline` run did beside its GEMMs.

    Attributes
    ----------
    marks : list
        Backend timing marks, two around each GEMM (pairs for
        :meth:`summa.device.backend.Backend.elapsed`, once the queue is done).
    own_first : bool
        This rank multiplied the panels it holds before all others.
    connect_seconds, release_seconds : float or None
        Opening and closing the peers' blocks (direct copies only).
    opened_blocks : int or None
        Peers' blocks opened (direct copies only).
    """

    marks: list
    own_first: bool
    connect_seconds: float | None = None
    opened_blocks: int | None = None
    release_seconds: float | None = None

    def extra(self) -> dict:
        """The entries for :attr:`summa.execution.algorithm.SummaStats.extra`."""
        keys = ("own_first", "connect_seconds", "opened_blocks", "release_seconds")
        return {k: getattr(self, k) for k in keys if getattr(self, k) is not None}


class _Side(NamedTuple):
    """One operand's panels: A's along the grid row, B's along the grid column."""

    bc: object  # the broadcaster
    bufs: list  # a receive buffer per slot
    me: int  # this rank's place along the broadcast (its grid column for A)
    direct: bool  # copied straight from the root's block (ipc)


class Pipeline:
    """The SUMMA steps of one rank, as its :class:`Schedule` lists them.

    Parameters
    ----------
    A, B, C : DistMatrix
        The operands; C's block is what :class:`Product` updates.
    schedule : Schedule
        This rank's steps (:func:`summa.planning.schedule.make_schedule`).
    broadcasters : (broadcaster, broadcaster)
        Broadcast A's panels along grid rows, B's along grid columns;
        direct ones (``schedule.direct``) copy from the roots' exported blocks.
    multiply : callable
        ``multiply(a, b)`` queues one panel's product (:class:`Product`).
    progress : callable, optional
        Called as ``progress(gemms_queued, panels)`` after each GEMM.
    """

    def __init__(self, A, B, C, schedule: Schedule, broadcasters, multiply, progress=None):
        self.A, self.B, self.schedule = A, B, schedule
        self.multiply, self.progress = multiply, progress
        self.grid, self.backend = C.grid, C.backend
        self.shape = C.local.shape
        xp, width, (mloc, nloc) = C.backend.xp, schedule.width, C.local.shape
        # Panel buffers only where panels arrive from other ranks.
        a_bufs = [xp.empty(mloc * width if self.grid.shape[1] > 1 else 0, dtype=C.dtype)
                  for _ in range(schedule.slots)]
        b_bufs = [xp.empty(width * nloc if self.grid.shape[0] > 1 else 0, dtype=C.dtype)
                  for _ in range(schedule.slots)]
        row_bc, col_bc = broadcasters
        self.rows = _Side(row_bc, a_bufs, self.grid.col, schedule.direct[0])
        self.cols = _Side(col_bc, b_bufs, self.grid.row, schedule.direct[1])
        self.readers = [side.bc for side in (self.rows, self.cols) if side.direct]
        # Direct copies into a slot wait only for the GEMM that last read it.
        self.slot_free = [None] * schedule.slots
        self.inflight: dict = {}  # panel -> (a, b, its two pending broadcasts)
        self.queued = 0
        self.report = PipelineReport([], bool(schedule.first))
        # A held panel's sends (its part where it lies) wait only for the
        # operands' values, not for the GEMMs queued before them.
        self.operands = C.backend.record_event()
        self._do = {START: self._start, MULTIPLY: self._multiply, SETTLE: self._settle,
                    CONNECT: self._connect}

    def run(self) -> PipelineReport:
        """Queue every step of the schedule; closes what direct copies opened."""
        try:
            for event in self.schedule.events:
                self._do[event.kind](event.panel, event.slot)
        except BaseException:
            # The peers may be gone: close what this rank opened, no barrier.
            for bc in self.readers:
                bc.release_local()
            raise
        t0 = time.perf_counter()
        for bc in self.readers:
            bc.release()
        if self.readers:
            self.report.release_seconds = time.perf_counter() - t0
        return self.report

    def _start(self, i: int, slot: int) -> None:
        """Queue panel i's two broadcasts (or copies) into `slot`."""
        p, (mloc, nloc) = self.schedule.panels[i], self.shape
        a_part, b_part = local_parts(self.A, self.B, p)
        own_a, own_b = self.schedule.in_place[i]
        early = i in self.schedule.first
        a, ra = self._post(self.rows, a_part, own_a, early, p.a_root, slot,
                           (slice(0, mloc), slice(p.a_offset, p.a_offset + p.width)))
        b, rb = self._post(self.cols, b_part, own_b, early, p.b_root, slot,
                           (slice(p.b_offset, p.b_offset + p.width), slice(0, nloc)))
        self.inflight[i] = (a, b, ra, rb)

    def _post(self, side: _Side, part, own: bool, early: bool, root: int, slot: int,
              region) -> tuple:
        """One part of a panel (`region` of the root's block): its view, and its
        broadcast started. `own`: used where it lies; `early`: the panel is
        held, so its sends go out at once."""
        # The owner multiplies (and, where it is contiguous, broadcasts) its
        # panel where it lies; GEMM takes row-strided views, so a grid row or
        # column of one rank never copies at all.
        if own:
            view = part
        else:
            rows, cols = region
            view = side.bufs[slot][: (rows.stop - rows.start) * (cols.stop - cols.start)]
            view = view.reshape(rows.stop - rows.start, cols.stop - cols.start)
            if side.me == root:
                view[...] = part
        if side.direct:
            return view, side.bc.iget(view, root, *region, after=self.slot_free[slot])
        if own and early:
            return view, side.bc.ibcast(view, root, slot, ready=self.operands, own=True)
        return view, side.bc.ibcast(view, root, slot)

    def _multiply(self, i: int, slot: int) -> None:
        """Queue panel i's GEMM, after its broadcasts unless it is held."""
        p = self.schedule.panels[i]
        held = i in self.schedule.first
        if held:
            a, b = local_parts(self.A, self.B, p)
        else:
            a, b, ra, rb = self.inflight.pop(i)
        if self.queued == 1:
            inject("summa")
        if not held:
            wait_for_panel(i, p, ra, rb, self.grid)
        marks = self.report.marks
        marks.append(self.backend.timing_mark())  # the copy of A, if any, counts as compute
        self.multiply(a, b)
        marks.append(self.backend.timing_mark())
        self.queued += 1
        if self.schedule.fetched[i]:
            self.slot_free[slot] = self.backend.record_event()
        if self.progress is not None:
            self.progress(self.queued, len(self.schedule.panels))

    def _settle(self, i: int, slot: int) -> None:
        """Complete held panel i's sends (its slot is free then)."""
        _settle(*self.inflight.pop(i)[2:])

    def _connect(self, i: int, slot: int) -> None:
        """Open the peers' blocks for direct copies (collective)."""
        t0 = time.perf_counter()
        for bc in self.readers:
            bc.connect()
        self.report.connect_seconds = time.perf_counter() - t0
        self.report.opened_blocks = sum(bc.opened_blocks for bc in self.readers)
