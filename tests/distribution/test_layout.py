"""Layout maths, serially: every index owned exactly once, maps invert each other."""

import numpy as np
import pytest

from summa.distribution.layout import Distribution, Layout, panel_schedule

CASES = [(n, p, b) for n in (0, 1, 2, 5, 17, 100, 1001) for p in (1, 2, 3, 4, 6, 7)
         for b in (None, 1, 3, 16)]


@pytest.mark.parametrize("n,p,block", CASES)
def test_every_index_owned_once_and_maps_invert(n, p, block):
    d = Distribution(n, p, block)
    everything = np.concatenate([d.global_indices(q) for q in range(p)])
    assert np.array_equal(np.sort(everything), np.arange(n))
    assert sum(d.local_size(q) for q in range(p)) == n
    for q in range(p):
        g = d.global_indices(q)
        assert np.all(np.diff(g) > 0), "local order must follow global order"
        if g.size:
            owner, local = d.to_local(g)
            assert np.all(owner == q)
            assert np.array_equal(local, np.arange(g.size))
            assert np.array_equal(d.to_global(q, local), g)
            assert np.all(d.owner(g) == q)


@pytest.mark.parametrize("n,p", [(n, p) for n in (0, 1, 5, 17, 1001) for p in (1, 3, 7)])
def test_balanced_sizes_differ_by_at_most_one(n, p):
    sizes = [Distribution(n, p).local_size(q) for q in range(p)]
    assert max(sizes) - min(sizes) <= 1
    assert sizes == [len(x) for x in np.array_split(np.arange(n), p)]


@pytest.mark.parametrize("n,p,b", [(n, p, b) for n in (1, 10, 97, 1000) for p in (1, 2, 5)
                                   for b in (1, 4, 64)])
def test_block_cyclic_matches_scalapack_numroc(n, p, b):
    def numroc(n, nb, iproc, nprocs):  # ScaLAPACK's formula, source process 0
        nblocks = n // nb
        count = (nblocks // nprocs) * nb
        extra = nblocks % nprocs
        if iproc < extra:
            count += nb
        elif iproc == extra:
            count += n % nb
        return count
    d = Distribution(n, p, b)
    assert [d.local_size(q) for q in range(p)] == [numroc(n, b, q, p) for q in range(p)]


def test_sizes_smaller_than_processes_leave_empty_blocks():
    d = Distribution(2, 5)
    assert [d.local_size(q) for q in range(5)] == [1, 1, 0, 0, 0]
    assert d.global_indices(4).size == 0
    assert d.segments(4) == []
    layout = Layout((2, 3), (5, 4))
    assert layout.local_shape(4, 3) == (0, 0)
    assert layout.local_shape(0, 0) == (1, 1)


def test_layout_owner_and_transpose():
    layout = Layout((10, 7), (2, 3), block=(3, 2))
    r, c = layout.owner(np.arange(10)[:, None], np.arange(7)[None, :])
    assert r.shape == (10, 7) and c.shape == (10, 7)
    assert r[4, 0] == 1 and c[0, 2] == 1 and c[0, 6] == 0
    t = layout.transposed()
    assert t.shape == (7, 10) and t.block == (2, 3)
    assert Layout.from_distributions(layout.rows, layout.cols) == layout


@pytest.mark.parametrize("k,pr,pc,ba,bb,width", [
    (100, 2, 3, None, None, 7), (100, 3, 2, 4, 5, 16), (1, 4, 4, None, None, 8),
    (17, 1, 1, None, None, 100), (0, 2, 2, None, None, 4), (64, 2, 2, 8, None, 3)])
def test_panels_cover_k_once_with_single_roots(k, pr, pc, ba, bb, width):
    a_cols, b_rows = Distribution(k, pc, ba), Distribution(k, pr, bb)
    panels = panel_schedule(a_cols, b_rows, width)
    covered = np.concatenate([np.arange(p.k0, p.k1) for p in panels]) if panels else []
    assert np.array_equal(covered, np.arange(k))
    for p in panels:
        assert 1 <= p.width <= width
        ks = np.arange(p.k0, p.k1)
        owner, local = a_cols.to_local(ks)
        assert np.all(owner == p.a_root) and np.array_equal(local, p.a_offset + np.arange(p.width))
        owner, local = b_rows.to_local(ks)
        assert np.all(owner == p.b_root) and np.array_equal(local, p.b_offset + np.arange(p.width))


@pytest.mark.parametrize("args,match", [
    ((-1, 2), "length"), ((5, 0), "processes"), ((5, 2, 0), "block size")])
def test_distribution_rejects_bad_arguments(args, match):
    with pytest.raises(ValueError, match=match):
        Distribution(*args)


def test_owner_out_of_range():
    with pytest.raises(IndexError):
        Distribution(5, 2).owner(5)


def test_panel_schedule_rejects_bad_width_and_mismatched_k():
    with pytest.raises(ValueError, match="panel width"):
        panel_schedule(Distribution(4, 2), Distribution(4, 2), 0)
    with pytest.raises(ValueError, match="inner dimensions"):
        panel_schedule(Distribution(4, 2), Distribution(5, 2), 2)


def test_layout_rejects_non_2d_shape():
    with pytest.raises(ValueError, match="2-D"):
        Layout((3, 4, 5), (1, 1))


@pytest.mark.parametrize("pieces", [1, 3, 4, 100])
def test_split_panel_covers_the_panel_with_the_same_roots(pieces):
    from summa.distribution.layout import split_panel
    p = panel_schedule(Distribution(40, 2), Distribution(40, 2), 16)[1]  # an interior panel
    parts = split_panel(p, pieces)
    assert len(parts) == min(pieces, p.width)
    assert parts[0].k0 == p.k0 and parts[-1].k1 == p.k1
    assert all(x.k1 == y.k0 for x, y in zip(parts, parts[1:]))
    assert all(q.width >= 1 and (q.a_root, q.b_root) == (p.a_root, p.b_root) for q in parts)
    assert all(q.a_offset - p.a_offset == q.k0 - p.k0 == q.b_offset - p.b_offset for q in parts)


@pytest.mark.parametrize("width, first", [(16, 2), (16, 3), (15, 4), (16, 16), (16, 40), (1, 1)])
def test_split_panel_doubling_covers_the_panel_in_widening_pieces(width, first):
    from summa.distribution.layout import split_panel_doubling
    p = panel_schedule(Distribution(40, 2), Distribution(40, 2), width)[1]
    parts = split_panel_doubling(p, first)
    assert parts[0].k0 == p.k0 and parts[-1].k1 == p.k1
    assert all(x.k1 == y.k0 for x, y in zip(parts, parts[1:]))
    assert all((q.a_root, q.b_root) == (p.a_root, p.b_root) for q in parts)
    assert all(q.a_offset - p.a_offset == q.k0 - p.k0 == q.b_offset - p.b_offset for q in parts)
    widths = [q.width for q in parts]
    assert widths[0] == min(first, p.width)
    # each piece but the last is as wide as all before it (the first two: `first`)
    assert all(w == sum(widths[:i]) for i, w in enumerate(widths[1:-1], 1))
    assert 0 < widths[-1] <= max(first, sum(widths[:-1]))


@pytest.mark.parametrize("k, width, parts", [(40, 16, 1), (40, 16, 2), (48, 16, 1), (7, 16, 1),
                                             (45, 8, 3), (0, 8, 1)])
def test_narrowest_first_moves_one_panel_to_the_front(k, width, parts):
    """The narrowest panel (the first of equals) first, the rest in K's
    order: every panel once; on one rank its width is first_panel_width's."""
    from summa.distribution.layout import first_panel_width, narrowest_first
    panels = panel_schedule(Distribution(k, parts), Distribution(k, parts), width)
    moved = narrowest_first(panels)
    assert sorted(moved, key=lambda p: p.k0) == panels
    if panels:
        assert moved[0].width == min(p.width for p in panels)
        assert moved[1:] == [p for p in panels if p is not moved[0]]
    if parts == 1:
        assert first_panel_width(k, width) == (moved[0].width if panels else 0)
