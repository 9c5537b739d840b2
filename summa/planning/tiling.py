"""The out-of-core tile and panel search: how a rank's block of C is cut into
tiles that fit a device budget (fewest tiles, by rows or by columns as the
operands lie and the host link weighs them, one C tile at a time where the
link bounds the sweep), the device elements such a sweep holds, the
elements it moves over the host link, and fp64-int8's products taken a
chunk of rows and a pass of planes at a time where their scratch would not
fit whole.

Pure arithmetic on sizes and predicates (no MPI, no device):
:func:`summa.planning.memory.memory_plan` asks it and states the result as a
:class:`summa.planning.memory.MemoryPlan`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import options
from ..precision import ozaki_gpu
from .precision import moduli_for, panel_sums_apply, panel_sums_bytes
from .model import gemm_flops

__all__ = ["FP64_INT8_ROWS", "HOST_LINK_BALANCE", "TRAFFIC_GAIN", "EMULATED_COLUMN_TILES",
           "Int8Products", "least_int8_rows", "int8_chunk_rows", "int8_fold_planes",
           "tiles_asked", "ozaki_scratch", "one_at_a_time", "moved_elements", "waited_elements",
           "c_tile_buffers", "SweepPanels", "ooc_elements", "ooc_tiles", "choose_cut",
           "upload_elements", "columns_first", "Int8InMemory", "int8_in_memory"]


#: fp64-int8's scratch grows with the rows of C a product takes (its int32
#: products and the fold's two float64 sums: 32 bytes an element of C, where
#: the sweep's two C tiles take 16; and A's residues): where a tile's whole
#: rows do not fit, its products take them in chunks
#: (:attr:`summa.planning.memory.MemoryPlan.int8_rows`) of at least this
#: many, so that the scratch no longer decides the tiles. Out of core, products of row strips of at
#: least 2048 rows ran at the bare product's rate (the measurement behind
#: FP64_INT8_TAIL_SMALLEST in docs/benchmarks.md): twice that keeps each
#: INT8 GEMM large.
FP64_INT8_ROWS = 4096


def least_int8_rows() -> int:
    """:data:`FP64_INT8_ROWS`, read when asked (a test makes it small here,
    and the memory plan's cut and its chunks both follow)."""
    return FP64_INT8_ROWS


def int8_chunk_rows(rows: int, fits) -> int | None:
    """The rows of A and C one fp64-int8 product of `rows` rows takes at a
    time: all (None) where ``fits(rows)``, else the most that `fits` (a
    predicate of the rows of a chunk: is its memory within the budget?),
    evened out over as many chunks where that leaves each at least
    :data:`FP64_INT8_ROWS` (the least, taken even where it does not fit: the
    caller's cut made room for it, or refuses)."""
    if fits(rows):
        return None
    low = min(rows, FP64_INT8_ROWS)
    if low >= rows:
        return None
    if not fits(low):
        return low
    low = _most_that_fit(low, rows - 1, fits)
    even = -(-rows // -(-rows // low))  # as many chunks, of even size: none over `low`
    return max(even, FP64_INT8_ROWS)  # (fits: FP64_INT8_ROWS <= low < rows here)


def int8_fold_planes(k: int, fits) -> int | None:
    """The integer products each fold of an fp64-int8 product over `k`
    terms takes a pass: all of its moduli (one pass over C's sums) where
    ``fits(planes)`` (a predicate of the planes' memory within the budget)
    holds for them, else the most that fit; None where no more than
    :data:`summa.precision.ozaki_gpu.PLANES` do. All 15 in one pass ran a
    20480 x 40960 x 16384 panel product in 0.356 s against 0.375 with 4,
    40960³ in 1.628 against 1.678 (`ozaki_gpu.gemm` on one H200, 2026-12-04,
    docs/benchmarks.md "Measurements behind the defaults"): each pass reads
    and writes the sums again. A complex product's four real ones take
    them each (`ozaki_gpu._complex` joins them into C in place)."""
    count, least = moduli_for(k), ozaki_gpu.PLANES
    if count <= least or not fits(least + 1):
        return None
    return _most_that_fit(least + 1, count, fits)


def _most_that_fit(low: int, high: int, fits) -> int:
    """The largest count in ``[low, high]`` that `fits` (a predicate true for
    every count up to some bound), by bisection; `low` where none above it
    does."""
    while low < high:
        mid = (low + high + 1) // 2
        if fits(mid):
            low = mid
        else:
            high = mid - 1
    return low


def tiles_asked(ml: int, nl: int) -> tuple | None:
    """``SUMMA_OOC_TILES=RxC``: out of core, R x C tiles per rank instead of
    the planner's fewest (to measure other cuts: fp64-int8's scratch grows
    with a tile's rows plus columns, so squarer tiles leave room for wider
    panels); None where unset."""
    asked = options.current().ooc_tiles
    if asked is None:
        return None
    rows, cols = asked
    if not (1 <= rows <= max(ml, 1) and 1 <= cols <= max(nl, 1)):
        raise ValueError(f"SUMMA_OOC_TILES: {rows}x{cols} tiles do not cut a {ml} x {nl} "
                         "block of C")
    return rows, cols


def _ooc_parts(panels: SweepPanels) -> tuple[int, int]:
    """How many nb-wide A parts (tm x nb) and B parts (nb x tn) the sweep keeps
    on the device: its slots, their `staged` copies per direction, and the
    transposed `copies` (A's, B's) of a slot (:class:`SweepPanels`)."""
    slots, copies, staged = panels.slots, panels.copies, panels.staged
    return slots * (1 + staged[0]) + copies[0], slots * (1 + staged[1]) + copies[1]


@dataclass(frozen=True)
class Int8Products:
    """fp64-int8's products as the out-of-core sweep's memory counts them.

    Attributes
    ----------
    complex_ : bool
        complex128: four real products, beside the operands' real and
        imaginary parts and two real results.
    rows : int or None
        Rows of A and C a product takes at a time (None: all).
    planes : int or None
        Integer products a fold takes a pass (None: the default).
    """

    complex_: bool = False
    rows: int | None = None
    planes: int | None = None


@dataclass(frozen=True)
class SweepPanels:
    """The out-of-core sweep's panels as its device memory counts them
    (:func:`ooc_elements`, :func:`ooc_tiles`), whatever the cut of C.

    Attributes
    ----------
    nb : int
        Columns of A (rows of B) per panel part.
    slots : int
        Panel slots (the lookahead's, and one spare where it fits).
    copies : tuple
        ``(A's, B's)``: whether a slot's part also has a transposed copy.
    staged : tuple
        ``(row, column)``: whether that direction's slots are staged through
        buffers of their own (copy-engine broadcasters).
    emulated : Int8Products or None
        fp64-int8's products, whose scratch the device holds too.
    """

    nb: int
    slots: int
    copies: tuple = (False, False)
    staged: tuple = (False, False)
    emulated: Int8Products | None = None


def ozaki_scratch(tm: int, tn: int, nb: int, complex_: bool = False,
                   rows: int | None = None, planes: int | None = None) -> int:
    """Device bytes one ``tm x nb`` by ``nb x tn`` product takes on INT8 tensor
    cores (``precision="fp64-int8"``, :func:`summa.precision.ozaki_gpu.scratch_bytes`),
    `rows` of A and C at a time (None: all), `planes` integer products a
    fold (None: the default); complex: one real product at a time, beside
    the operands' real and imaginary parts and the two real results."""
    scratch = ozaki_gpu.scratch_bytes(tm, tn, nb, moduli_for(nb),
                                      planes, rows=rows)
    return scratch + (16 * (tm * nb + nb * tn) + 16 * tm * tn if complex_ else 0)


#: Flops per byte crossing the host link under which the link, not the
#: GEMMs, bounds an out-of-core sweep: an H200's float64 GEMM rate (51.7
#: TFLOP/s, ``cupy.matmul`` of 32768³) over its host link's from pageable
#: memory, both directions together (26 GB/s: float64 32768³ under 8 GiB
#: moved 43 GB in 1.66 s; `benchmarks/matrix.py`, docs/benchmarks.md).
#: Where a machine's own balance is lower (slower GEMMs, a faster link),
#: some sweeps called link-bound here are not; one C tile at a time then
#: costs them only its waited write-backs, short beside such GEMMs.
HOST_LINK_BALANCE = 2000


def one_at_a_time(sizes: tuple, tiles: tuple, dtype: np.dtype, fits,
                   by_columns: bool = False) -> tuple:
    """``(tiles, c_buffers)``: the fewest tiles that `fit` (a predicate of a
    tile's rows and columns, one C tile on the device) where the two-tile
    cut `tiles` of a rank's ``(ml, nl, k)`` is bound by the host link (fewer
    flops per byte moved than :data:`HOST_LINK_BALANCE`) and the taller
    (`by_columns`: wider) tiles move no more bytes, each earlier tile's
    write-back counted as moved twice (the next tile waits for it); else
    `tiles` with two buffers. At equal bytes the fewer tiles win: their
    sweep takes fewer, wider steps.
    float64 32768³ under 8 GiB: 2 x 1 tiles one at a time ran 1.47 s
    (0.93 of ``cupy.matmul``) where 3 x 1 two at a time ran 1.75 s (34.4
    GB up against 25.8; `benchmarks/matrix.py` with ``SUMMA_OOC_TILES``);
    float64 16384 x 65536 x 32768, 1 x 2 tiles one at a time 1.39-1.42 s
    where 1 x 3 two at a time, the same bytes counted so, ran 1.59-1.61
    (`benchmarks/cuts.py`, docs/benchmarks.md, "Wide blocks")."""
    ml, nl, k = sizes
    flops = gemm_flops(dtype, ml, nl, k)
    if flops >= HOST_LINK_BALANCE * moved_elements(sizes, tiles, 2) * dtype.itemsize:
        return tiles, 2
    if by_columns:  # the same choice for the transposed block (moved_elements is symmetric)
        cut, buffers = one_at_a_time((nl, ml, k), tiles[::-1], dtype,
                                      lambda tn, tm: fits(tm, tn))
        return cut[::-1], buffers
    for cols in range(1, tiles[1] + 1):
        tn = -(-nl // cols)
        rows = _most_that_fit(0, ml, lambda r: fits(r, tn))
        if rows >= 1:
            one = (-(-ml // rows), cols)
            if moved_elements(sizes, one, 1) <= moved_elements(sizes, tiles, 2):
                return one, 1
            break
    return tiles, 2


def moved_elements(sizes: tuple, tiles: tuple, buffers: int) -> int:
    """Elements a rank's ``(ml, nl, k)`` sweep cut in `tiles` moves over the
    host link, as :func:`summa.planning.memory.host_traffic` and
    :func:`summa.planning.memory.waited_write_backs` count them."""
    (ml, nl, k), (rows, cols) = sizes, tiles
    waited = waited_elements(tiles, (-(-ml // rows), -(-nl // cols))) if buffers == 1 else 0
    return k * upload_elements(ml, nl, tiles) + ml * nl + waited


def waited_elements(tiles: tuple, tile: tuple) -> int:
    """Elements of C a sweep of `tiles` tiles of `tile`, one on the device
    at a time, waits to write back: every tile's but the last."""
    return (tiles[0] * tiles[1] - 1) * tile[0] * tile[1]


#: A cut (or a narrower panel) is taken over another where it moves this
#: share fewer bytes.
TRAFFIC_GAIN = 0.95


def c_tile_buffers(ntiles: int) -> int:
    """C tiles the sweep holds on the device where the cut leaves room: two
    where there are several (a tile's write-back overlaps the next tile's
    GEMMs), else one."""
    return min(2, ntiles)


def ooc_elements(tm: int, tn: int, ntiles: int, panels: SweepPanels,
                 c_buffers: int | None = None) -> int:
    """Device elements of the out-of-core sweep of `ntiles` tiles of ``tm x
    tn``: C tiles (`c_buffers` of them, default two where there are
    several), the panel parts of :func:`_ooc_parts`, and where
    ``panels.emulated`` (:class:`Int8Products`) one product's scratch on INT8
    tensor cores."""
    a_parts, b_parts = _ooc_parts(panels)
    nb, emulated = panels.nb, panels.emulated
    buffers = c_tile_buffers(ntiles) if c_buffers is None else c_buffers
    elements = buffers * tm * tn + a_parts * tm * nb + b_parts * tn * nb
    if emulated is None:
        return elements
    item = 16 if emulated.complex_ else 8  # elements of the data's size, complex or real
    return elements + -(-ozaki_scratch(tm, tn, nb, emulated.complex_, emulated.rows,
                                        emulated.planes) // item)


#: Most column tiles the search for fp64-int8's cut tries (per rank).
EMULATED_COLUMN_TILES = 64


def ooc_tiles(ml: int, nl: int, budget: int, panels: SweepPanels, by_columns: bool = False):
    """Fewest ``(row tiles, column tiles)`` of an ``ml x nl`` block of C whose
    sweep of `panels` (:class:`SweepPanels`) fits `budget` elements:
    by columns, the most rows that fit (the sweep's size grows with them);
    `by_columns` (:func:`columns_first`), the transpose of that: by rows,
    the most columns that fit.
    Where ``panels.emulated`` (:class:`Int8Products`, its products `rows` of C at a time),
    the cut that uploads least instead (B's panels once per row of tiles,
    A's once per column: ``rows nl + columns ml``): fp64-int8's scratch
    grows with a tile's columns (B's residues, and each chunk of rows'
    integer products and sums), so whole rows of C leave thin tiles, and at
    N = 32768 under 24 GiB a 3 x 2 cut with 16384-wide panels ran 60.4
    TFLOP/s where 4 x 1 with 8192 ran 52.3 (the products' scratch then
    grew with the whole tile's rows; in chunks of 4096 rows the same budget
    takes 2 x 2, and N = 65536 3 x 4 where whole tiles took 6 x 4).
    Emulated, C is never one tile where it has rows to cut: a tile's first
    panel goes up whole before its first product (nothing hides it), and one
    tile of N = 32768 ran 49.4 TFLOP/s where 2 x 1 ran 58.7 (both: `bench`,
    docs/benchmarks.md, "Measurements behind the defaults")."""
    emulated = panels.emulated

    def fits(tm, tn, ntiles):
        return ooc_elements(tm, tn, ntiles, panels) <= budget
    if by_columns and not emulated:
        cut = _fewest_whole_rows(nl, ml, lambda tn, tm, ntiles: fits(tm, tn, ntiles))
        return cut and cut[::-1]
    if not emulated:
        return _fewest_whole_rows(ml, nl, fits)
    fewest_rows = 2 if ml >= 2 else 1
    if fewest_rows == 1 and fits(ml, nl, 1):
        return 1, 1
    best = None
    for ntn in range(1, nl + 1):
        tn = -(-nl // ntn)
        low = _most_that_fit(0, ml, lambda rows: fits(rows, tn, 2))
        if low >= 1:
            ntm = max(fewest_rows, -(-ml // low))
            # uploads, tiles, rows first
            cut = (upload_elements(ml, nl, (ntm, ntn)), ntm * ntn, ntn, ntm)
            best = min(best or cut, cut)
        if ntn >= min(nl, EMULATED_COLUMN_TILES):
            break
    return (best[3], best[2]) if best else None


def choose_cut(ml: int, nl: int, columns: bool, cut_by, either: bool = True) -> tuple:
    """``(tiles, by_columns)``: the cut of a rank's ``ml x nl`` block of C,
    ``cut_by(by_columns)`` (:func:`ooc_tiles`), by whole rows or whole
    columns: the way the operands lie (by columns where `columns`,
    :func:`columns_first`) unless the other way uploads a
    :data:`TRAFFIC_GAIN` share less (:func:`upload_elements`: the operand read
    again for each tile is B by rows, A by columns). On a block taller than
    wide, columns read the taller A again for each tile: float64 32768³
    Fortran under 8 GiB on a 1 x 2 grid of two H200s (a rank's block 32768
    x 16384, 1 x 2 tiles against 2 x 1: a quarter more uploaded) ran 1.73 s
    where rows ran 1.44 (`benchmarks/matrix.py`, docs/benchmarks.md); on a
    block wider than tall rows read (and on a grid broadcast) the wider B
    again for each tile: float64 49152³ C-ordered under 2 GiB on one H200,
    28 x 2 tiles by rows (B read 28 times) ran 15.1 s where 2 x 12 by columns
    ran 8.0 (`benchmarks/cuts.py`, docs/benchmarks.md). Only the way the
    operands lie where not `either`."""
    prefer = (cut_by(columns), columns)
    if not either:
        return prefer
    other = (cut_by(not columns), not columns)
    if other[0] is not None and (prefer[0] is None or upload_elements(ml, nl, other[0])
                                 < TRAFFIC_GAIN * upload_elements(ml, nl, prefer[0])):
        return other
    return prefer


def upload_elements(ml: int, nl: int, tiles: tuple) -> int:
    """Elements of A and B an ``ml x nl`` block cut in `tiles` uploads for
    each column of K: A's rows once for each column of tiles, B's columns
    once for each row of them."""
    return ml * tiles[1] + nl * tiles[0]


def _fewest_whole_rows(ml: int, nl: int, fits) -> tuple | None:
    """:func:`ooc_tiles`' cut of an ``ml x nl`` block (not emulated): one
    tile where it fits, else by columns, the most rows that fit
    (``fits(rows, columns, tiles)``); None where not one row fits."""
    if fits(ml, nl, 1):
        return 1, 1
    for ntn in range(1, nl + 1):
        tn = -(-nl // ntn)
        low = _most_that_fit(0, ml, lambda rows: fits(rows, tn, 2))
        if low >= 1:
            return -(-ml // low), ntn
    return None


def columns_first(storage: tuple) -> bool:
    """Is C cut into tiles of whole columns rather than whole rows for
    operands lying as `storage` says (:attr:`summa.planning.Plan.storage`)?
    A cut of whole rows reads B again for each row of tiles: by rows of
    its own where B lies by rows (a block a panel), but where op(B) lies by
    columns (Fortran order, ``b.T`` of a C array) in pieces of one panel's
    width, 32 KB for complex128 2048-wide panels. Where op(A) lies by
    columns too, whole columns of C read A again as blocks a panel, as
    C-ordered operands read B: the same sweep, transposed."""
    return tuple(storage) == ("cols", "cols")


@dataclass(frozen=True)
class Int8InMemory:
    """fp64-int8's share of an in-memory plan: its scratch bytes, and how
    its products run (:class:`MemoryPlan`'s `int8_rows`, `int8_planes`,
    `panel_sums`)."""

    scratch: int = 0
    rows: int | None = None
    planes: int | None = None
    sums: bool = False


def int8_in_memory(shape: tuple, dtype, held: int, k: int, grid: bool,
                    room: int | None) -> Int8InMemory:
    """fp64-int8 in memory: a ``(rows, columns, K)`` product's scratch
    (a panel's, or a strip's of all K) beside the `held` bytes of blocks and
    panels, within the device `room` (None: unknown). On a `grid` of GPUs
    where they apply (:func:`summa.planning.precision.panel_sums_apply`),
    the panel sums of all of `k` where they fit; else one product's
    scratch, its rows in chunks and more planes a fold where the room says
    (:func:`int8_chunk_rows`, :func:`int8_fold_planes`), as one GEMM on the device
    (:func:`resident_plan`) takes them."""
    tm, tn, nb = shape
    complex_ = np.dtype(dtype).kind == "c"
    left = None if room is None else room - held
    if grid and panel_sums_apply(dtype, 2, k):
        sums = panel_sums_bytes(tm, tn, nb, k)
        if left is None or sums <= left:
            return Int8InMemory(sums, sums=True)

    def scratch(rows: int | None, planes: int | None = None) -> int:
        return ozaki_scratch(tm, tn, nb, complex_, rows, planes)
    if left is None:
        return Int8InMemory(scratch(None))
    rows = int8_chunk_rows(tm, lambda r: scratch(r) <= left)
    planes = int8_fold_planes(nb, lambda p: scratch(rows, p) <= left)
    return Int8InMemory(scratch(rows, planes), rows, planes)
