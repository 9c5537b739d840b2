"""One rank's SUMMA schedule: which panels start when, into which slot, and
the order of the GEMMs, decided up front as data.

Pure: no MPI, no arrays (panels are :class:`summa.distribution.layout.Panel` values). The
inputs are the panels in the order every rank starts their broadcasts, this
rank's grid coordinates, which directions copy directly from the roots'
blocks (ipc), which parts of each panel this rank uses where they lie, and the
lookahead. :class:`summa.execution.pipeline.Pipeline` walks the :class:`Schedule`'s
events and decides nothing.

The rules, each of which a unit test checks (``tests/planning/test_schedule.py``):

- Broadcasts start in list order, panel ``i`` into slot ``i % depth``
  (``depth = lookahead + 1``); panel ``i`` starts only once panel
  ``i - depth`` is done with that slot: its GEMM queued, or, for a panel
  multiplied where it lies, its sends settled. So at most ``depth`` panels
  are in flight.
- The panels a rank holds go first (:func:`own_first`) where that lets all its
  receives start at once; the others follow in list order, ``lookahead``
  panels behind their broadcasts. The GEMM order does not depend on the
  depth, so neither do the bits (lookahead 0 aside).
- With direct copies, the GEMMs of the leading panels a rank holds are all
  queued before its first fetch, whose set-up (opening the peers' blocks,
  :data:`CONNECT`) they then hide; every rank connects once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Sequence

from ..distribution.layout import split_panel

__all__ = ["HEAD_PIECES", "OWN_FIRST_RECEIVES", "START", "MULTIPLY", "SETTLE", "CONNECT",
           "Event", "Schedule", "make_schedule", "order_panels", "own_first", "waits_first",
           "fetched"]

#: Pieces the first panel is sent in on GPUs (its broadcast is the pipeline fill).
HEAD_PIECES = 4

#: Most panels a rank may receive and still multiply its own ones first: all
#: its receives must start at once, into the two slots of the default lookahead.
OWN_FIRST_RECEIVES = 2

#: Queue panel ``i``'s two broadcasts (or direct copies) into its slot.
START = "start"
#: Queue panel ``i``'s GEMM (after waiting for its broadcasts, unless held).
MULTIPLY = "multiply"
#: Complete the sends of held panel ``i`` (its slot is free after this).
SETTLE = "settle"
#: Open the peers' blocks for direct copies (collective; once, every rank).
CONNECT = "connect"


class Event(NamedTuple):
    """One step of a rank's schedule: `kind` for panel `panel` in slot
    `slot` (both -1 for :data:`CONNECT`)."""

    kind: str
    panel: int
    slot: int


@dataclass(frozen=True)
class Schedule:
    """One rank's SUMMA steps, computed by :func:`make_schedule`.

    Attributes
    ----------
    panels : tuple of summa.distribution.layout.Panel
        The panels in the order every rank starts their broadcasts.
    direct : (bool, bool)
        A's (along grid rows) and B's (along grid columns) panels are copied
        straight from the roots' blocks (ipc), not broadcast in pairs.
    in_place : tuple of (bool, bool)
        Per panel: this rank uses its A part, its B part, where it lies.
    depth : int
        ``lookahead + 1``: slots, and most panels in flight.
    first : frozenset of int
        Panels multiplied where they lie, before all others.
    fetched : tuple of bool
        Per panel: this rank copies a part of it from another rank's block.
    events : tuple of Event
        What the loop does, in order.
    """

    panels: tuple
    direct: tuple
    in_place: tuple
    depth: int
    first: frozenset
    fetched: tuple
    events: tuple

    @property
    def slots(self) -> int:
        """Panel buffers the loop needs (per operand)."""
        return min(self.depth, len(self.panels))

    @property
    def width(self) -> int:
        """Widest panel: the size of every slot."""
        return max((p.width for p in self.panels), default=0)

    @property
    def order(self) -> tuple:
        """The panels in the order their GEMMs are queued."""
        return tuple(e.panel for e in self.events if e.kind == MULTIPLY)


def fetched(p, me: tuple[int, int], direct) -> int:
    """How many of panel `p`'s two parts the rank at grid coordinates `me`
    (row, column) copies from another rank's block."""
    return int(direct[0] and p.a_root != me[1]) + int(direct[1] and p.b_root != me[0])


def order_panels(panels: Sequence, me: tuple[int, int], direct, split_head: bool,
                 pieces: int = HEAD_PIECES) -> list:
    """This rank's order of the SUMMA steps.

    Broadcasts pair up across ranks, so every rank starts them in the same
    order, the first one in `pieces` when `split_head` (a rank with nothing of
    its own to multiply meanwhile then starts after a fraction of it); the
    GEMMs of panels a rank holds go first anyway (:func:`own_first`). Direct
    copies (ipc) pair with nothing, so a rank first multiplies the panels it
    holds itself, which hides its set-up, and only splits the head when that
    one has to be fetched.
    """
    panels = list(panels)
    if any(direct):
        panels = sorted(panels, key=lambda p: fetched(p, me, direct))
        split_head = split_head and bool(panels) and fetched(panels[0], me, direct) > 0
    if split_head and panels:
        panels = split_panel(panels[0], pieces) + panels[1:]
    return panels


def own_first(held: Sequence[bool], lookahead: int) -> list[int]:
    """The panels this rank multiplies before all others: the ones it holds
    (`held`: both parts used where they lie), where lookahead is on and it
    receives at most :data:`OWN_FIRST_RECEIVES` panels, adjacent in the
    common order, so that their broadcasts all start at once whatever the
    depth; else none (the common order). Otherwise a receive would wait for a
    GEMM of the common order while this rank's GEMMs went another way (and the
    peers' sends behind it on the broadcaster's stream with it). The rule does
    not depend on the lookahead's depth, so neither do the bits (lookahead 0
    aside)."""
    mine = [i for i, h in enumerate(held) if h]
    received = [i for i, h in enumerate(held) if not h]
    adjacent = len(received) < 2 or received[-1] - received[0] == len(received) - 1
    if lookahead >= 1 and mine and len(received) <= OWN_FIRST_RECEIVES and adjacent:
        return mine
    return []


def waits_first(held: Sequence[bool], lookahead: int) -> bool:
    """Does this rank's first GEMM wait for a broadcast (neither its own
    panels first nor the first panel its own)?"""
    return not (own_first(held, lookahead) or (len(held) > 0 and held[0]))


def make_schedule(panels: Sequence, me: tuple[int, int], direct, in_place: Sequence,
                  lookahead: int) -> Schedule:
    """The :class:`Schedule` of `panels` (in the common order, as
    :func:`order_panels` gives them) for the rank at grid coordinates `me`
    (row, column), whose panel parts `in_place` (per panel, A's and B's) it
    uses where they lie, with `lookahead` panels' broadcasts ahead of the
    GEMMs and `direct` copies (A's, B's)."""
    in_place = tuple((bool(a), bool(b)) for a, b in in_place)
    if len(in_place) != len(panels):
        raise ValueError(f"{len(in_place)} in-place flags for {len(panels)} panels")
    direct = (bool(direct[0]), bool(direct[1]))
    flags = tuple(fetched(p, me, direct) > 0 for p in panels)
    first = frozenset(own_first([a and b for a, b in in_place], lookahead))
    depth = int(lookahead) + 1
    # Direct copies: the panels before the first fetched one (they lead the
    # order) have their GEMMs queued before any later panel starts.
    hold = next((j for j, f in enumerate(flags) if f), len(panels)) if any(direct) else 0
    events = _Walk(len(panels), depth, first, hold, flags).events(any(direct))
    return Schedule(tuple(panels), direct, in_place, depth, first, flags, tuple(events))


class _Walk:
    """Works out a schedule's events by stepping through it once."""

    def __init__(self, n: int, depth: int, first: frozenset, hold: int, flags: tuple):
        self.n, self.depth, self.first, self.hold, self.flags = n, depth, first, hold, flags
        self.out: list[Event] = []
        self.inflight: set = set()  # started, and not done with: GEMM to come, or sends
        self.started = self.queued = 0  # panels started; GEMMs queued
        self.connected = True

    def events(self, connects: bool) -> list[Event]:
        self.connected = not connects
        order = sorted(self.first) + [i for i in range(self.n) if i not in self.first]
        self.start_more()
        for i in order:
            if i not in self.first:  # multiplied where it lies: its sends go in list order
                self.start_more(need=i)
                self.inflight.discard(i)
            self.emit(MULTIPLY, i)
            self.queued += 1
            self.start_more()  # refill the slot just used
        self.start_more(self.n - 1)
        for j in sorted(self.inflight):  # the held panels' last sends
            self.emit(SETTLE, j)
        if not self.connected:  # every rank takes part, even one that fetched nothing
            self.out.append(Event(CONNECT, -1, -1))
        return self.out

    def emit(self, kind: str, i: int) -> None:
        self.out.append(Event(kind, i, i % self.depth))

    def vacate(self, j: int) -> bool:
        """Make panel j's slot free for panel ``j + depth``; False if not yet."""
        if j not in self.inflight:
            return True  # before the first panel, or done with
        if j not in self.first:
            return False  # its GEMM comes later
        self.inflight.discard(j)
        self.emit(SETTLE, j)  # a held panel's sends: no stream waits for them
        return True

    def start_more(self, need: int = -1) -> None:
        """Start the panels up to `need`, and then more while slots are free."""
        while self.started < self.n:
            i = self.started
            if i > need and i >= self.hold > self.queued:
                return
            if not self.vacate(i - self.depth):
                if i > need:
                    return
                # Cannot happen: every panel before `need` has had its GEMM.
                raise RuntimeError(f"SUMMA schedule: panel {need} needs a slot still in use")
            if self.flags[i] and not self.connected:
                self.out.append(Event(CONNECT, -1, -1))  # after the held panels' GEMMs
                self.connected = True
            self.emit(START, i)
            self.inflight.add(i)
            self.started += 1
