"""The SUMMA schedule (summa.planning.schedule) alone: no MPI, no arrays.

Each schedule is checked against the rules it must keep (every panel started
and multiplied once, a slot reused only once its last panel is done with it,
at most lookahead + 1 panels in flight, the lookahead used, own panels first
where the rule says so, the set-up of direct copies hidden behind the held
panels' GEMMs), on a table of hand-worked cases and on many random ones.
"""

import random

import pytest

from summa.distribution.layout import Distribution, Panel, panel_schedule
from summa.planning.schedule import (CONNECT, HEAD_PIECES, MULTIPLY, OWN_FIRST_RECEIVES, SETTLE,
                                     START, fetched, make_schedule, order_panels, own_first,
                                     waits_first)


def roots(a_roots, b_roots, width=4):
    """Panels of `width` with these roots (offsets do not matter here)."""
    return [Panel(width * i, width * (i + 1), a, 0, b, 0)
            for i, (a, b) in enumerate(zip(a_roots, b_roots))]


def in_place(panels, me, grid_shape=(2, 2), contiguous=True):
    """Parts this rank holds, used where they lie (contiguous, or alone)."""
    return [(p.a_root == me[1] and (contiguous or grid_shape[1] == 1),
             p.b_root == me[0] and (contiguous or grid_shape[0] == 1)) for p in panels]


def check(schedule, lookahead: int) -> None:
    """Assert every rule a schedule must keep."""
    n, depth, first = len(schedule.panels), lookahead + 1, schedule.first
    events = list(schedule.events)
    at = {}  # (kind, panel) -> position
    for pos, e in enumerate(events):
        assert (e.kind, e.panel) not in at or e.kind == CONNECT, e
        at[e.kind, e.panel] = pos
        if e.kind != CONNECT:
            assert e.slot == e.panel % depth and 0 <= e.slot < schedule.slots
    starts = [e.panel for e in events if e.kind == START]
    assert starts == list(range(n))  # every panel once, in the common order
    assert sorted(schedule.order) == list(range(n))  # every panel multiplied once
    assert sorted(e.panel for e in events if e.kind == SETTLE) == sorted(first)
    for i in range(n):
        if i in first:  # sends settled after they start
            assert at[START, i] < at[SETTLE, i]
        else:  # a received panel is multiplied after its broadcast starts
            assert at[START, i] < at[MULTIPLY, i]
    # A slot is reused only once its last panel is done with it.
    done = {i: at[SETTLE if i in first else MULTIPLY, i] for i in range(n)}
    for j in range(depth, n):
        assert done[j - depth] < at[START, j], (j, events)
    # At most depth panels in flight (started, not yet done with).
    for pos in range(len(events)):
        inflight = [i for i in range(n) if at[START, i] <= pos < done[i]]
        assert len(inflight) <= depth, (pos, events)
    # GEMMs: the held panels first, in list order, then the rest in list order.
    assert list(schedule.order) == sorted(first) + [i for i in range(n) if i not in first]
    assert first == frozenset(own_first([a and b for a, b in schedule.in_place], lookahead))
    check_lookahead(schedule, lookahead, at)
    check_connect(schedule, events, at)


def check_lookahead(schedule, lookahead, at) -> None:
    """Overlap is used, where no direct copies hold the starts back: the
    broadcasts of the next `lookahead` panels are started before a GEMM waits
    for one (the common order); own panels first start every receive before
    the first GEMM."""
    n, first = len(schedule.panels), schedule.first
    if any(schedule.direct):
        return  # (check_connect)
    if first:
        gemm0 = min(at[MULTIPLY, i] for i in range(n))
        assert all(at[START, i] < gemm0 for i in range(n) if i not in first)
    else:
        for i in range(n):
            for j in range(i + 1, min(i + lookahead, n - 1) + 1):
                assert at[START, j] < at[MULTIPLY, i], (i, j)


def check_connect(schedule, events, at) -> None:
    """Direct copies: one connect on every rank, before the first fetch and
    after the GEMMs of the panels before it; none otherwise."""
    connects = [pos for pos, e in enumerate(events) if e.kind == CONNECT]
    if not any(schedule.direct):
        assert connects == []
        return
    assert len(connects) == 1
    hold = next((j for j, f in enumerate(schedule.fetched) if f), len(schedule.panels))
    for i in range(hold):
        assert at[MULTIPLY, i] < connects[0]
    for j in range(hold, len(schedule.panels)):
        assert connects[0] < at[START, j]


# (name, panel roots (a, b), this rank (row, col), grid shape, direct, GEMM order
# for lookahead >= 1, worked out by hand from the rule in summa.planning.schedule)
CASES = [
    # P x 1, 2 ranks, K = 16 by 4: a rank holds two panels, receives two adjacent
    ("2x1 first row", ([0] * 4, [0, 0, 1, 1]), (0, 0), (2, 1), (False, False), [0, 1, 2, 3]),
    ("2x1 second row", ([0] * 4, [0, 0, 1, 1]), (1, 0), (2, 1), (False, False), [2, 3, 0, 1]),
    # K = 40: five panels received, too many to start at once: the common order
    ("2x1 many received", ([0] * 10, [0] * 5 + [1] * 5), (1, 0), (2, 1), (False, False),
     list(range(10))),
    # 3 x 1: the received panels 0 and 2 are not adjacent: the common order
    ("3x1 middle", ([0] * 3, [0, 1, 2]), (1, 0), (3, 1), (False, False), [0, 1, 2]),
    ("3x1 last", ([0] * 3, [0, 1, 2]), (2, 0), (3, 1), (False, False), [2, 0, 1]),
    # 2 x 2, paired broadcasts: rank (1, 1) holds both parts of panel 1 only and
    # receives three: the common order; holding the last of three, it goes first
    ("2x2 paired", ([0, 1, 0, 1], [0, 1, 1, 0]), (1, 1), (2, 2), (False, False), [0, 1, 2, 3]),
    ("2x2 paired own last", ([0, 0, 1], [0, 0, 1]), (1, 1), (2, 2), (False, False), [2, 0, 1]),
    # direct copies on 2 x 2: own panels lead the list, and go first
    ("2x2 direct", ([0, 1, 1, 0], [0, 1, 1, 0]), (1, 1), (2, 2), (True, True), [0, 1, 2, 3]),
]


@pytest.mark.parametrize("lookahead", [0, 1, 2, 5])
@pytest.mark.parametrize("name, rts, me, shape, direct, expect", CASES, ids=[c[0] for c in CASES])
def test_table_of_cases(name, rts, me, shape, direct, expect, lookahead):
    panels = order_panels(roots(*rts), me, direct, split_head=False)
    s = make_schedule(panels, me, direct, in_place(panels, me, shape), lookahead)
    check(s, lookahead)
    if lookahead == 0:  # nothing in flight to start first: the common order
        assert list(s.order) == list(range(len(panels)))
    else:
        assert list(s.order) == expect


@pytest.mark.parametrize("k, expect", [(11, [2, 3, 0, 1]), (8, [1, 0]), (40, list(range(10)))])
def test_panels_of_a_grid_column(k, expect):
    """The second rank of a 2 x 1 grid, K split 6 + 5 (11), 4 + 4 (8) or
    20 + 20 (40) by panels of 4: one or two panels received, adjacent, go
    after its own; five do not."""
    panels = panel_schedule(Distribution(k, 1), Distribution(k, 2), 4)
    s = make_schedule(panels, (1, 0), (False, False), in_place(panels, (1, 0), (2, 1)), 1)
    check(s, 1)
    assert list(s.order) == expect


def test_direct_copies_multiply_the_ranks_own_panels_before_fetching():
    """2 x 2 with direct copies: rank (1, 1)'s own panels lead its list; the
    others are fetched after the one connect, which follows their GEMMs."""
    panels = order_panels(roots([0, 1, 0, 1, 1], [0, 1, 1, 0, 1]), (1, 1), (True, True), False)
    assert [(p.a_root, p.b_root) for p in panels][:2] == [(1, 1), (1, 1)]
    s = make_schedule(panels, (1, 1), (True, True), in_place(panels, (1, 1)), 1)
    check(s, 1)
    kinds = [(e.kind, e.panel) for e in s.events]
    connect = kinds.index((CONNECT, -1))
    assert {i for k, i in kinds[:connect] if k == MULTIPLY} == {0, 1}
    assert s.fetched == (False, False, True, True, True)


def test_every_rank_connects_even_with_nothing_to_fetch():
    panels = roots([1, 1], [1, 1])
    s = make_schedule(panels, (1, 1), (True, False), in_place(panels, (1, 1)), 2)
    check(s, 2)
    assert s.events[-1].kind == CONNECT


def test_order_puts_a_ranks_own_panels_first():
    """Direct copies pair with nothing, so each rank starts with what it holds;
    paired broadcasts keep one order everywhere, the head in pieces."""
    panels = panel_schedule(Distribution(16, 2), Distribution(16, 2), 4)
    mine = order_panels(panels, (1, 1), (True, True), split_head=True)
    assert [(p.a_root, p.b_root) for p in mine][:2] == [(1, 1), (1, 1)]
    assert sorted(p.k0 for p in mine) == [p.k0 for p in panels]  # nothing split or lost
    same = order_panels(panels, (1, 1), (False, False), split_head=True)
    assert len(same) == len(panels) + HEAD_PIECES - 1 and same[0].k0 == 0
    assert same[-1] == panels[-1]
    # direct copies split the head only where it is fetched
    assert order_panels(panels, (0, 0), (True, True), split_head=True)[0] == panels[0]
    assert order_panels([], (0, 0), (True, True), split_head=True) == []


def test_own_first_rule():
    assert own_first([True, True, False, False], 1) == [0, 1]
    assert own_first([True, True, False, False], 0) == []  # no lookahead: nothing to gain
    assert own_first([False, True, False], 3) == []  # received panels not adjacent
    assert own_first([True] + [False] * (OWN_FIRST_RECEIVES + 1), 1) == []  # too many
    assert own_first([False, False], 1) == []  # nothing held
    assert own_first([True, True], 1) == [0, 1]  # nothing received
    assert not waits_first([True, False], 0)  # the first panel is its own
    assert waits_first([False, True, False], 1)
    assert not waits_first([False, True], 1)  # its own first
    assert waits_first([], 1)


def test_the_gemm_order_does_not_depend_on_the_depth():
    panels = roots([0] * 5, [0, 0, 1, 1, 1])
    flags = in_place(panels, (1, 0), (2, 1))
    orders = {make_schedule(panels, (1, 0), (False, False), flags, la).order
              for la in (1, 2, 3, 7)}
    assert orders == {(2, 3, 4, 0, 1)}


def test_flags_must_match_the_panels():
    with pytest.raises(ValueError, match="3 in-place flags for 2 panels"):
        make_schedule(roots([0, 0], [0, 0]), (0, 0), (False, False), [(True, True)] * 3, 1)


def test_slots_and_width():
    panels = roots([0, 0, 0], [0, 0, 0], width=5)
    s = make_schedule(panels, (0, 0), (False, False), in_place(panels, (0, 0)), 4)
    assert (s.slots, s.width, s.depth) == (3, 5, 5)
    empty = make_schedule([], (0, 0), (False, False), [], 1)
    assert (empty.slots, empty.width, empty.events) == (0, 0, ())


def test_random_schedules_keep_every_rule():
    rng = random.Random(7)
    for _ in range(2000):
        pr, pc = rng.randint(1, 3), rng.randint(1, 3)
        me = (rng.randrange(pr), rng.randrange(pc))
        panels = roots([rng.randrange(pc) for _ in range(9)], [rng.randrange(pr) for _ in range(9)])
        panels = panels[:rng.randint(0, 9)]
        direct = (pc > 1 and rng.random() < 0.4, pr > 1 and rng.random() < 0.4)
        panels = order_panels(panels, me, direct, split_head=rng.random() < 0.3)
        flags = [(p.a_root == me[1] and (direct[0] or pc == 1 or rng.random() < 0.7),
                  p.b_root == me[0] and (direct[1] or pr == 1 or rng.random() < 0.7))
                 for p in panels]
        lookahead = rng.randint(0, 5)
        s = make_schedule(panels, me, direct, flags, lookahead)
        check(s, lookahead)
        assert s.fetched == tuple(fetched(p, me, direct) > 0 for p in panels)
