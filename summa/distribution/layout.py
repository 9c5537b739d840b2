"""Pure index arithmetic of 2-D block and block-cyclic distributions.

Nothing here talks to MPI: every rank evaluates the same functions on the same
arguments and so agrees, without communication, on who owns what.

A one-dimensional distribution of ``n`` indices over ``nprocs`` processes is a
sequence of contiguous *segments* ``[start, stop)``, each owned by one process.
A process stores its segments one after another, in increasing global order,
so a global index maps to ``(owner, local index)`` by one binary search.

* balanced blocks (the default): one segment per process, sizes differing by
  at most one (like :func:`numpy.array_split`);
* block-cyclic with block size ``b``: segment ``s`` is ``[s*b, (s+1)*b)`` and
  belongs to process ``s % nprocs`` (ScaLAPACK's layout with zero source).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

__all__ = ["Distribution", "Layout", "panel_schedule", "Panel", "split_panel",
           "split_panel_doubling", "span", "take_block"]


def span(indices: np.ndarray) -> tuple[int, int] | None:
    """``(start, stop)`` where `indices` are consecutive (a balanced block's
    rows or columns: a slice reads them), else None (empty included)."""
    if indices.size and bool(np.all(np.diff(indices) == 1)):
        return int(indices[0]), int(indices[-1]) + 1
    return None


def take_block(data, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """``data[rows][:, cols]`` as a new C-contiguous array, touching only those
    elements (slices where the indices are contiguous; works on memory maps)."""
    def as_index(idx):
        run = span(idx)
        if run is not None:
            return slice(*run)
        return idx if idx.size else slice(0, 0)
    r, c = as_index(rows), as_index(cols)
    # Always a private copy: a view into a read-only memory map would be handed
    # to MPI, whose broadcast algorithms may write into the root's buffer too.
    if isinstance(r, slice):
        return np.array(data[r][:, c], order="C", copy=True)
    if isinstance(c, slice):
        return np.array(data[:, c][r], order="C", copy=True)
    return np.array(data[np.ix_(r, c)], order="C", copy=True)


class Distribution:
    """Distribution of ``n`` indices over ``nprocs`` processes.

    Parameters
    ----------
    n : int
        Number of global indices (may be 0 or smaller than `nprocs`).
    nprocs : int
        Number of processes, at least 1.
    block : int or None
        Block size of a block-cyclic distribution; None for balanced blocks.

    Examples
    --------
    >>> d = Distribution(10, 3)
    >>> [d.local_size(p) for p in range(3)]
    [4, 3, 3]
    >>> Distribution(10, 3, block=2).global_indices(0).tolist()
    [0, 1, 6, 7]
    """

    def __init__(self, n: int, nprocs: int, block: int | None = None):
        n, nprocs = int(n), int(nprocs)
        if n < 0:
            raise ValueError(f"distribution length must be >= 0, got {n}")
        if nprocs < 1:
            raise ValueError(f"number of processes must be >= 1, got {nprocs}")
        if block is not None:
            block = int(block)
            if block < 1:
                raise ValueError(f"block size must be >= 1, got {block}")
        self.n, self.nprocs, self.block = n, nprocs, block
        if block is None:
            sizes = np.full(nprocs, n // nprocs, dtype=np.int64)
            sizes[: n % nprocs] += 1
            starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
            owners = np.arange(nprocs, dtype=np.int64)
        else:
            starts = np.arange(0, n, block, dtype=np.int64)
            sizes = np.minimum(block, n - starts)
            owners = np.arange(len(starts), dtype=np.int64) % nprocs
        keep = sizes > 0
        self._starts = starts[keep]
        self._sizes = sizes[keep]
        self._owners = owners[keep]
        # Local offset of each segment inside its owner's storage.
        self._local_starts = np.zeros_like(self._starts)
        for p in range(nprocs):
            mine = self._owners == p
            self._local_starts[mine] = np.concatenate(([0], np.cumsum(self._sizes[mine])[:-1]))

    def __eq__(self, other) -> bool:
        return (isinstance(other, Distribution) and self.n == other.n
                and self.nprocs == other.nprocs and self.block == other.block)

    def __hash__(self) -> int:
        return hash((self.n, self.nprocs, self.block))

    def __repr__(self) -> str:
        kind = "balanced" if self.block is None else f"block={self.block}"
        return f"Distribution(n={self.n}, nprocs={self.nprocs}, {kind})"

    @property
    def boundaries(self) -> np.ndarray:
        """Global indices where a new segment (and so maybe a new owner) starts."""
        return self._starts

    def local_size(self, p: int) -> int:
        """Number of indices process `p` stores."""
        return int(self._sizes[self._owners == p].sum())

    def segments(self, p: int) -> list[tuple[int, int, int]]:
        """Segments of process `p` as ``(global_start, global_stop, local_start)``."""
        mine = np.flatnonzero(self._owners == p)
        return [(int(self._starts[s]), int(self._starts[s] + self._sizes[s]),
                 int(self._local_starts[s])) for s in mine]

    def global_indices(self, p: int) -> np.ndarray:
        """Global indices stored by process `p`, in local order."""
        segs = self.segments(p)
        if not segs:
            return np.zeros(0, dtype=np.int64)
        return np.concatenate([np.arange(a, b, dtype=np.int64) for a, b, _ in segs])

    def _segment_of(self, g) -> np.ndarray:
        g = np.asarray(g, dtype=np.int64)
        if np.any((g < 0) | (g >= self.n)):
            raise IndexError(f"global index out of range [0, {self.n})")
        return np.searchsorted(self._starts, g, side="right") - 1

    def owner(self, g):
        """Process owning global index (or array of indices) `g`."""
        return self._owners[self._segment_of(g)]

    def to_local(self, g):
        """Map global index (array) `g` to ``(owner, local_index)``."""
        s = self._segment_of(g)
        return self._owners[s], self._local_starts[s] + (np.asarray(g) - self._starts[s])

    def to_global(self, p: int, local):
        """Map local index (array) `local` of process `p` to global indices."""
        return self.global_indices(p)[np.asarray(local, dtype=np.int64)]


class Layout:
    """2-D distribution of an ``M x N`` matrix over a ``Pr x Pc`` process grid.

    Rows are distributed over grid rows and columns over grid columns; the rank
    at grid coordinates ``(r, c)`` stores the rows of ``rows.global_indices(r)``
    and the columns of ``cols.global_indices(c)``.

    Parameters
    ----------
    shape : tuple of int
        Global shape ``(M, N)``.
    grid_shape : tuple of int
        Process grid ``(Pr, Pc)``.
    block : tuple or None
        Block sizes ``(mb, nb)`` of a block-cyclic layout; None (for both, or
        for one dimension) means balanced blocks.
    """

    def __init__(self, shape, grid_shape, block=None):
        if len(shape) != 2:
            raise ValueError(f"a matrix layout needs a 2-D shape, got {tuple(shape)}")
        mb, nb = (None, None) if block is None else block
        if block is not None and mb is None and nb is None:
            block = None
        self.shape = (int(shape[0]), int(shape[1]))
        self.grid_shape = (int(grid_shape[0]), int(grid_shape[1]))
        self.block = None if block is None else (mb, nb)
        self.rows = Distribution(self.shape[0], self.grid_shape[0], mb)
        self.cols = Distribution(self.shape[1], self.grid_shape[1], nb)

    @classmethod
    def from_distributions(cls, rows: Distribution, cols: Distribution) -> "Layout":
        """The layout whose rows and columns are distributed as `rows` and `cols`."""
        return cls((rows.n, cols.n), (rows.nprocs, cols.nprocs), (rows.block, cols.block))

    def __eq__(self, other) -> bool:
        return isinstance(other, Layout) and (self.rows, self.cols) == (other.rows, other.cols)

    def __hash__(self) -> int:
        return hash((self.rows, self.cols))

    def __repr__(self) -> str:
        return f"Layout(shape={self.shape}, grid={self.grid_shape}, block={self.block})"

    def local_shape(self, r: int, c: int) -> tuple[int, int]:
        """Shape of the block stored at grid coordinates ``(r, c)``."""
        return self.rows.local_size(r), self.cols.local_size(c)

    def owner(self, i, j):
        """Grid coordinates ``(r, c)`` of the rank owning element ``(i, j)``."""
        i, j = np.broadcast_arrays(np.asarray(i), np.asarray(j))
        return self.rows.owner(i), self.cols.owner(j)

    def transposed(self) -> "Layout":
        """The layout of the transpose on the same grid with swapped block sizes."""
        block = None if self.block is None else self.block[::-1]
        return Layout(self.shape[::-1], self.grid_shape, block)


@dataclass(frozen=True)
class Panel:
    """One SUMMA step: columns ``[k0, k1)`` of A and rows ``[k0, k1)`` of B.

    The panel lies inside a single segment of both distributions, so one grid
    column (``a_root``) holds the A part at local columns starting at ``a_offset``
    and one grid row (``b_root``) holds the B part at local rows from ``b_offset``.
    """

    k0: int
    k1: int
    a_root: int
    a_offset: int
    b_root: int
    b_offset: int

    @property
    def width(self) -> int:
        return self.k1 - self.k0


def panel_schedule(a_cols: Distribution, b_rows: Distribution, width: int) -> list[Panel]:
    """Cut the inner dimension into panels of at most `width` for SUMMA.

    Panels never straddle a segment boundary of A's column distribution or of
    B's row distribution, so each has a single broadcast root along the grid
    rows and along the grid columns. Panel width is therefore independent of the
    distribution block sizes, but a panel is shortened where a boundary falls.

    Parameters
    ----------
    a_cols, b_rows : Distribution
        Distributions of the inner dimension K for A's columns and B's rows.
    width : int
        Largest panel width, at least 1.
    """
    if a_cols.n != b_rows.n:
        raise ValueError(f"inner dimensions differ: {a_cols.n} != {b_rows.n}")
    width = int(width)
    if width < 1:
        raise ValueError(f"panel width must be >= 1, got {width}")
    cuts = np.union1d(a_cols.boundaries, b_rows.boundaries)
    cuts = np.union1d(cuts, [a_cols.n]).astype(np.int64)
    panels = []
    for lo, hi in zip(cuts[:-1], cuts[1:]):
        a_root, a_off = a_cols.to_local(lo)
        b_root, b_off = b_rows.to_local(lo)
        for k0 in range(int(lo), int(hi), width):
            k1 = min(k0 + width, int(hi))
            panels.append(Panel(k0, k1, int(a_root), int(a_off + k0 - lo),
                                int(b_root), int(b_off + k0 - lo)))
    return panels


def split_panel(p: Panel, pieces: int) -> list[Panel]:
    """Panel `p` cut into up to `pieces` narrower panels with the same roots.

    The first panel's broadcast cannot overlap any GEMM (pipeline fill); sent
    in pieces, the first GEMM starts after a fraction of it.
    """
    pieces = max(1, min(pieces, p.width))
    return _cut_panel(p, [p.width * i // pieces for i in range(pieces + 1)])


def narrowest_first(panels: list[Panel]) -> list[Panel]:
    """`panels` with the narrowest (the first of equals) moved to the front,
    the rest in order: the same terms of the sum, in another order.

    Where the first panel's upload is what the first GEMM waits for and the
    panel goes whole, K's remainder (K = 40960 in 16384-wide panels: 8192)
    goes up in half the time of a full panel, at no extra GEMM.
    """
    if not panels:
        return list(panels)
    i = min(range(len(panels)), key=lambda j: panels[j].width)
    return [panels[i]] + panels[:i] + panels[i + 1:]


def first_panel_width(k: int, width: int) -> int:
    """The width of :func:`narrowest_first`'s first panel where K's `k`
    terms are cut into panels of `width` on one rank: K's remainder, or a
    whole panel where there is none."""
    if k <= 0:
        return 0
    width = max(1, min(int(width), int(k)))
    return k % width or width


def split_panel_doubling(p: Panel, first: int) -> list[Panel]:
    """Panel `p` cut into pieces that double in width from `first` columns.

    Where the first piece's transfer is slow against its GEMM (host memory to
    device), a narrow first piece starts the GEMMs soonest, and each piece's
    transfer hides behind the GEMMs of the narrower ones before it.
    """
    cuts, width = [0], max(1, int(first))
    while cuts[-1] + width < p.width:
        cuts.append(cuts[-1] + width)
        width = cuts[-1]  # the next piece is as wide as all before it
    return _cut_panel(p, cuts + [p.width])


def _cut_panel(p: Panel, cuts: list[int]) -> list[Panel]:
    """Panel `p` cut at the columns `cuts` (from 0 to its width)."""
    return [replace(p, k0=p.k0 + a, k1=p.k0 + b, a_offset=p.a_offset + a,
                    b_offset=p.b_offset + a)
            for a, b in zip(cuts[:-1], cuts[1:])]
