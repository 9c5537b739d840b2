"""The out-of-core sweep itself: a rank's C tiles and K panels, stepped
through (:class:`Sweep`), with the panel pieces and strips that hide the first
upload and the last write-back (:mod:`summa.execution.outofcore` plans and
checks a sweep and runs it through this)."""

from __future__ import annotations

import contextlib
from collections import deque
from dataclasses import dataclass

import numpy as np

from ..runtime.faults import inject
from ..distribution.layout import narrowest_first, split_panel_doubling
from ..distribution.matrix import DistMatrix
from .pipeline import local_parts, wait_for_panel
from ..planning.memory import TAIL_SHARE
from ..planning.plan import Plan
from ..host.storage import as_rows, rows_shape
from ..transports.broadcasters import NoBroadcasts
from .transpose import PanelForms, PanelsOfA, PanelsOfB

__all__ = ["SweepOperands", "Sweep", "bounds", "head_pieces"]


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
class Cut:
    """How one rank's sweep cuts the product: its C tiles ``(i0, i1, j0,
    j1)`` and the panels of K (:func:`summa.distribution.layout.panel_schedule`)."""

    tiles: list
    panels: list


class _Steps:
    """``(tile, panel)`` of each step, tiles outermost, made when asked: a list
    of them took 1.4 MiB beside 0.4 planned for 12 tiles of 1491 one-wide panels
    (tests/test_sweep.py, SUMMA_SWEEP_MEMORY=1 SUMMA_SWEEP_SEED=3397540529, case 19)."""

    __slots__ = ("count", "panels")

    def __init__(self, tiles: int, panels: int):
        self.count, self.panels = tiles * panels, panels

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, s: int) -> tuple:
        if not 0 <= s < self.count:
            raise IndexError(f"step {s} of {self.count}")
        return divmod(s, self.panels)


class Sweep:
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
    cut : Cut
        The tiles and panels.
    broadcasters : tuple
        ``(row_bc, col_bc)``.
    mover : CudaMover or HostMover
    """

    def __init__(self, plan: Plan, scalars: tuple, operands: SweepOperands, cut: Cut,
                 broadcasters: tuple, mover):
        (self.alpha, self.load_c), (self.row_bc, self.col_bc) = scalars, broadcasters
        self.plan, self.operands, self.mover = plan, operands, mover
        self.tiles, self.panels = cut.tiles, cut.panels
        self.slots = plan.memory.slots
        self.smallest = plan.memory.tail_smallest
        # Tile counts agree on all ranks (the plan); sizes are this rank's own,
        # and the same along a grid row (rows) or column (columns), as broadcasts need.
        tm = max((i1 - i0 for i0, i1, _, _ in self.tiles), default=0)
        tn = max((j1 - j0 for _, _, j0, j1 in self.tiles), default=0)
        width = max((p.width for p in self.panels), default=0)
        self.steps = _Steps(len(self.tiles), len(self.panels))
        # lead: uploads run so far ahead of the broadcasts
        self.depth, self.lead = plan.lookahead + 1, max(0, self.slots - plan.lookahead - 1)
        xp, held = mover.xp, min(self.slots, len(self.steps))
        # the device's rows are of the plan's type: float64 where the host's
        # integers are converted as they are copied (plan.host_integers), C's own else
        dtype = np.dtype(plan.dtype)
        self.a_slots = [xp.empty(tm * width, dtype=dtype) for _ in range(held)]
        self.b_slots = [xp.empty(width * tn, dtype=dtype) for _ in range(held)]
        # One C buffer: each tile's GEMMs wait for the last one's write-back
        # (the mover's begin_tile waits for the buffer's last download).
        self.c_bufs = [xp.empty(tm * tn, dtype=dtype)
                       for _ in range(min(plan.memory.c_buffers, len(self.tiles)))]
        self.forms = PanelForms(
            PanelsOfA(mover.device, tm, width, dtype, plan.memory.transposed_a),
            PanelsOfB(mover.device, width, tn, dtype, plan.memory.transposed_b))
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


def _alone(broadcaster) -> bool:
    """Does `broadcaster` send nothing (one rank, or every rank its own parts)?"""
    if isinstance(broadcaster, NoBroadcasts):
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


def head_pieces(panels: list, overlaps: bool, first: int | None) -> list:
    """`panels` ordered and cut so that the first GEMM waits for a short
    upload, where uploads overlap the GEMMs: the first cut in pieces that
    double from `first` columns (the plan's ``head_first``); where it goes
    whole (None: fp64-int8, whose every product folds the whole tile), the
    narrowest panel first (:func:`narrowest_first`): a sweep whose GEMMs are
    faster than their uploads would wait between panels behind a narrow
    first one, but pieces of K cost fp64-int8 a fold each, the order none
    (fp64-int8 40960³ with the whole H200: 2.31-2.35 s narrowest first against
    2.38-2.40 a full panel first, docs/benchmarks.md,
    "Measurements behind the defaults")."""
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


def bounds(size: int, parts: int) -> list[tuple[int, int]]:
    """`parts` near-equal ranges covering ``[0, size)`` (some empty when size < parts)."""
    cuts = [size * i // parts for i in range(parts + 1)]
    return list(zip(cuts[:-1], cuts[1:]))
