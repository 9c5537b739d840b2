"""Memory planner: peak bytes per rank on the device and the host, in memory
or out of core, decided and checked before anything is allocated.

In memory, a rank holds its blocks of A, B and C and its panel buffers on the
device. Out of core (:mod:`summa.execution.outofcore`) the blocks stay in host memory and
the device holds C tiles and panel slots cut to a budget. Every run checks its
plan against the free device memory and each node's host memory
(:mod:`summa.planning.memorycheck`).

How the tiles and panel slots are cut to a budget (and fp64-int8's products
to the room left) is searched in :mod:`summa.planning.tiling`; this module
states what it found as a :class:`MemoryPlan`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from .. import options
from ..device.staging import copy_threads, ring_bytes
from ..device.traits import traits
from .tuning import transposes_a, transposes_b
from .tiling import (Int8InMemory, Int8Products, c_tile_buffers, choose_cut, columns_first,
                     int8_chunk_rows, int8_fold_planes, int8_in_memory, least_int8_rows,
                     moved_elements, one_at_a_time, ooc_elements, ooc_tiles, SweepPanels,
                     tiles_asked, waited_elements)
from ..precision import ozaki_gpu
from .precision import moduli_for
from ..precision.ozaki import K_EXACT
from ..host.storage import transposed as by_columns_stored
from .units import format_bytes, parse_bytes

__all__ = ["MemoryPlan", "Execution", "memory_plan", "resident_plan", "host_traffic",
           "sweep_steps", "waited_write_backs", "parse_bytes", "format_bytes"]


@dataclass(frozen=True)
class MemoryPlan:
    """Peak bytes one rank needs, and how the work is cut to fit.

    Attributes
    ----------
    mode : str
        ``"in-memory"`` (A, B, C and panels on the device), ``"out-of-core"``
        (A, B, C in host memory, C streamed through the device in tiles) or
        ``"on-device"`` (the caller's A and B already on the one rank's GPU:
        one GEMM, :func:`resident_plan`).
    device_bytes, host_bytes : int
        Peak per rank (the largest rank's share).
    tile : tuple or None
        ``(rows, cols)`` of the largest C tile kept on the device (out-of-core).
    chunk : int or None
        Panel width, the inner dimension of one upload and GEMM (out-of-core).
    tiles : tuple or None
        ``(row tiles, column tiles)`` the same on every rank (out-of-core).
    slots : int or None
        Panel slots on the device (out-of-core): ``lookahead + 1``, or one
        more where it fits the same tiles, so uploads run a step ahead of
        their broadcasts.
    transposed_a : bool
        Whether the GEMMs read A's panels from a transposed copy (its scratch
        buffer is counted in `device_bytes`).
    staged : tuple
        ``(row, column)``: out of core, whether that direction's panels pass
        through a staging buffer per slot (copy-engine broadcasts, ``ipc``),
        counted in `device_bytes`.
    staging_bytes : int
        Out of core on GPUs: page-locked host chunks the copies between host
        and GPU pass through (:mod:`summa.device.staging`), beside `host_bytes`.
    int8_rows : int or None
        fp64-int8 out of core or on the device: the rows of A and C each
        product takes at a time (:attr:`summa.precision.ozaki_gpu.Scheme.rows`),
        where its scratch for all of a tile's (or C's) rows does not fit;
        None: all at once.
    int8_planes : int or None
        fp64-int8 out of core or on the device: the integer products each
        fold takes a pass over C's sums (:attr:`summa.precision.ozaki_gpu.Scheme.planes`),
        more than :data:`summa.precision.ozaki_gpu.PLANES` where the room
        left beside the chosen tiles and rows holds them (:func:`int8_fold_planes`);
        None: the default.
    c_buffers : int or None
        Out of core: C tiles on the device at once. Two where there are
        several tiles (a tile's write-back overlaps the next tile's GEMMs);
        one where there is one, where the host link bounds the sweep and one
        at a time lets taller tiles move fewer bytes (:func:`one_at_a_time`),
        or where a cut asked for (``SUMMA_OOC_TILES``) fits only so: each
        tile then starts once the last one is home
        (:func:`waited_write_backs`).
    head_first : int or None
        Out of core: columns of the first panel's first piece, each piece
        after it twice as wide (:data:`HEAD_FIRST`), so that the GPU's first
        GEMM waits for little; None: the first panel goes whole, the
        narrowest first (fp64-int8, whose every product reconstructs the
        whole tile).
    tail_smallest : int or None
        Out of core: the fewest rows of a tile's last row strip, written back
        once final (:data:`TAIL_SMALLEST`, fp64-int8
        :data:`FP64_INT8_TAIL_SMALLEST`).
    transposed_b : bool
        Whether the GEMMs read B's panels, which lie by columns, from a
        row-major copy (its scratch buffer is counted in `device_bytes`).
    panel_sums : bool
        fp64-int8 in memory on a grid: whether the panels' INT8 products
        are summed and C folded once (:class:`summa.precision.panel_sums.PanelSums`,
        counted in `device_bytes` in place of a panel product's scratch),
        where they fit the device room.
    """

    mode: str
    device_bytes: int
    host_bytes: int
    tile: tuple | None = None
    chunk: int | None = None
    tiles: tuple | None = None
    slots: int | None = None
    transposed_a: bool = False
    staged: tuple = (False, False)
    staging_bytes: int = 0
    int8_rows: int | None = None
    int8_planes: int | None = None
    c_buffers: int | None = None
    head_first: int | None = None
    tail_smallest: int | None = None
    transposed_b: bool = False
    panel_sums: bool = False

    def as_dict(self) -> dict:
        return dict(self.__dict__)

    @property
    def tile_count(self) -> int:
        """C tiles a rank's sweep takes out of core (one in memory)."""
        return self.tiles[0] * self.tiles[1] if self.tiles else 1


#: The out-of-core sweep's head and tail (:mod:`summa.execution.outofcore`),
#: which the planner also counts in the time it predicts.
#: Width of the first panel's first piece; the pieces after it double, each
#: upload hiding behind the GEMMs before it (float64, N = 32768, 2 H200s: the
#: GPU idles 4.2 ms before the first GEMM, against 13.6 ms with 4 equal pieces).
HEAD_FIRST = 256
#: Each row strip of a tile's last panels takes this share of the rows left,
#: down to TAIL_SMALLEST rows: the strips shrink, so that the last write-back,
#: which nothing hides, is short (1.2 ms against 9.7 ms with 8 equal strips).
TAIL_SHARE = 0.4
TAIL_SMALLEST = 256
#: Float64 on INT8 tensor cores (``fp64-int8``): every product folds and
#: reconstructs its whole C block whatever its K, and a product of few rows or
#: of a narrow K keeps the INT8 kernels far from their rate. The first panel
#: goes whole and the last one's strips keep at least this many rows: a
#: 64 GiB sweep of N = 32768 ran 40 products (its first panel in 6 pieces of
#: K from 256, strips down to 256 rows) and `bench` 41.3 TFLOP/s, now 13
#: products and 58.2, the bare product 58.0 (docs/benchmarks.md, "Measurements
#: behind the defaults").
FP64_INT8_TAIL_SMALLEST = 2048
#: ... and the width of its first panel's first piece (None: the panel whole,
#: the narrowest first). Whole, each C tile's first panel goes up before its
#: first product (0.2-0.3 s a tile from pageable memory on one H200); in
#: pieces, each piece folds the tile's sums once more, which costs more than
#: it hides:
#: ``benchmarks/fp64_int8_user_case.py --size 40960 --head-first N`` ran 2.30 s
#: whole, 2.35 s in pieces of 8192 and 2.44 s of 4096 with the whole GPU, and
#: 2.48-2.52 s either way under 24 GiB (docs/benchmarks.md,
#: "Measurements behind the defaults").
FP64_INT8_HEAD_FIRST = None
def _local_sizes(m, n, k, grid):
    pr, pc = grid
    return -(-m // pr), -(-n // pc), -(-k // pc), -(-k // pr)


@dataclass(frozen=True)
class Execution:
    """How a product is run, as :func:`memory_plan` counts it.

    Attributes
    ----------
    lookahead : int
        Panels broadcast ahead of the GEMMs.
    backend : str
        ``"cupy"`` or ``"numpy"`` (:func:`summa.device.traits.traits`).
    device_budget : int or None
        Out of core: device bytes the C tiles and panel slots are cut to.
    out_of_core : bool
        Whether A, B and C stay in host memory, C streamed through the
        device in tiles (needs `device_budget`).
    schedule : {"panels", "strips"}
    precision : str or None
        The GEMMs' precision (``tf32``, ``fp64-int8``, ...).
    staged : tuple
        ``(row, column)``: out of core, whether that direction's broadcasts
        pass each slot through a staging buffer (copy engines, ``ipc``).
    copy_threads : int or None
        Out of core on GPUs: the host copy threads per rank
        (:attr:`summa.planning.Plan.copy_threads`), whose ring of page-locked
        chunks is counted (:func:`summa.device.staging.ring_bytes`). None:
        one rank's count on this host, for memory plans made outside
        :func:`summa.planning.make_plan`, which always says.
    storage : tuple
        How op(A) and op(B) lie in host memory (:attr:`summa.planning.Plan.storage`):
        out of core, operands lying by columns cut C by columns
        (:func:`columns_first`).
    device_room : int or None
        In memory on GPUs: the device bytes a rank may hold (the free
        memory, shared among the ranks on its GPU), within which fp64-int8
        takes panel sums or its products' rows in chunks; None: unknown
        (sums where they apply, all rows at once).
    """

    lookahead: int = 1
    backend: str = "cupy"
    device_budget: int | None = None
    out_of_core: bool = False
    schedule: str = "panels"
    precision: object = None
    staged: tuple = (False, False)
    copy_threads: int | None = None
    storage: tuple = ("rows", "rows")
    device_room: int | None = None


def memory_plan(m: int, n: int, k: int, dtype, grid: tuple, panel_width: int,
                execution: Execution = Execution()) -> MemoryPlan:
    """Peak memory per rank of ``C = A @ B`` run as `execution`
    (:class:`Execution`) says and, out of core, the C tiles that fit its
    `device_budget` bytes.

    In memory, a rank holds its blocks of A (ml x ka), B (kb x nl) and C
    (ml x nl) plus ``lookahead + 1`` panel buffers for each operand that arrives
    from other ranks (NumPy on a grid also makes one C-sized product per
    GEMM; CuPy, and NumPy on one rank, write into C); with
    ``schedule="strips"`` the buffers hold B's strips of all of K (k x nb).
    Where A's panels are multiplied from a transposed copy
    (:func:`summa.planning.tuning.transposes_a`), one more nb x ml scratch
    buffer (out of core nb x tm); where B's, one rank's or out of core
    (:func:`summa.planning.tuning.transposes_b`; a grid's in-memory blocks lie
    by rows), nb x nl (nb x tn). On a grid in memory, a block scattered
    lying by columns is copied by rows while it is held (:func:`_settling`):
    that is the peak where it is more. Out of core, the blocks stay in host memory; the
    device holds C tiles (two when there are several, so one is written back
    while the next is computed) and ``lookahead + 1`` slots for the A and B
    parts of a panel that a tile needs: ``c tm tn + slots (tm + tn) nb``
    elements. Fewest tiles first (each extra row of tiles uploads B's panels
    again), cut by rows before columns; where the host link bounds that cut,
    one C tile at a time where it fits fewer tiles (:func:`one_at_a_time`);
    then one more slot where those tiles
    leave room for it (uploads then run a step ahead of the broadcasts, so a
    panel's owner is ready to send when its receivers are), up to
    :func:`upload_lead` more. Directions that
    broadcast by copy engines (`staged`, row and column: ``ipc``) pass every
    slot's part through a staging buffer of its size: ``slots tm nb`` (A) and
    ``slots nb tn`` (B) more, where that direction has more than one rank.
    fp64-int8 adds one product's scratch: in memory for all of C's rows;
    out of core the tiles and slots are cut for products taking a tile's
    rows :data:`summa.planning.tiling.FP64_INT8_ROWS` at a time, then those
    chunks grow into the room left, to all of a tile's rows where they fit
    (``int8_rows``).
    """
    lookahead, backend, device_budget = (execution.lookahead, execution.backend,
                                         execution.device_budget)
    out_of_core, schedule, precision = (execution.out_of_core, execution.schedule,
                                        execution.precision)
    item = np.dtype(dtype).itemsize
    kind = traits(backend)
    pr, pc = grid
    ml, nl, ka, kb = _local_sizes(m, n, k, grid)
    nb = max(1, min(panel_width, k))
    slots = lookahead + 1
    panels = slots * ((ml * nb if pc > 1 else 0) + (nb * nl if pr > 1 else 0))
    strips = schedule == "strips" and pr > 1  # one rank runs panels whatever it is asked
    runs = "strips" if strips else "panels"
    columns_b = by_columns_stored(execution.storage[1]) and (out_of_core or pr * pc == 1)
    copies = (transposes_a(backend, dtype, precision, runs),
              transposes_b(backend, dtype, precision, runs, columns_b))
    if strips:  # B's strips: all of K, `panel_width` columns
        panels = slots * k * max(1, min(panel_width, nl))
    blocks = ml * ka + kb * nl + ml * nl
    emulated = precision == "fp64-int8"
    if not out_of_core:
        # NumPy adds each GEMM's product into C from a temporary of C's size;
        # a rank alone writes its row strips straight into C (one_rank_steps)
        extra = ml * nl if kind.cpu_only and pr * pc > 1 else 0
        extra += nb * ml * copies[0] + nb * nl * copies[1]
        int8 = Int8InMemory()
        if emulated:  # one product's scratch: a panel's, or under strips a strip's of all K
            shape = (ml, max(1, min(panel_width, nl)), k) if strips else (ml, nl, nb)
            if pr * pc == 1 and kind.gpu and not any(copies):
                # one GPU alone runs one product over all of K
                # (summa.execution.steps.one_rank_steps), in pieces of
                # at most K_EXACT terms
                shape = (ml, nl, max(1, min(k, K_EXACT)))
            int8 = int8_in_memory(shape, dtype, (blocks + panels + extra) * item, k,
                                   pr * pc > 1 and not strips and kind.gpu, execution.device_room)
            extra += -(-int8.scratch // item)
        on_device = max(blocks + panels + extra,
                        _settling(ml, nl, ka, kb, execution.storage, pr * pc)) * item
        staging = panels * item if kind.gpu else 0  # pinned host buffers (mpi mode)
        if kind.cpu_only:
            return MemoryPlan("in-memory", 0, on_device, transposed_a=copies[0],
                              transposed_b=copies[1])
        return MemoryPlan("in-memory", on_device, staging, transposed_a=copies[0],
                          transposed_b=copies[1], int8_rows=int8.rows, int8_planes=int8.planes,
                          panel_sums=int8.sums)
    if device_budget is None:
        raise ValueError("an out-of-core plan needs a device memory budget")
    return _ooc_memory((ml, nl, k, nb, blocks), dtype, grid, copies, execution)


def _settling(ml: int, nl: int, ka: int, kb: int, storage: tuple, ranks: int) -> int:
    """Elements a grid's rank holds in memory while it settles its scattered
    blocks (:func:`summa.host.blocks.stored_operand`): a block that came
    lying by columns is copied by rows while it is still held, A's first
    (ml x ka twice), then B's beside A's (kb x nl twice). The randomized
    sweep (tests/test_sweep.py, ``SUMMA_SWEEP_MEMORY=1
    SUMMA_SWEEP_LARGEST=1500 SUMMA_SWEEP_SEED=32`` on 4 ranks) found a
    4 x 1 grid's rank take 4.2 MiB, B's block twice, against 2.4 planned
    before C and the panels. None on one rank, which reads its operands
    where they lie."""
    if ranks == 1:
        return 0
    a_cols, b_cols = (by_columns_stored(s) for s in storage)
    return max(2 * ml * ka if a_cols else 0, ml * ka + 2 * kb * nl if b_cols else 0)


def _ooc_memory(sizes: tuple, dtype, grid: tuple, copies: tuple,
                execution: Execution) -> MemoryPlan:
    """:func:`memory_plan` out of core: `sizes` ``(ml, nl, k, nb, blocks)``, a
    rank's rows and columns of C, K, the panel width and its blocks'
    elements; `copies`: (A's, B's) panels read from a transposed copy."""
    (ml, nl, k, nb, blocks), (pr, pc) = sizes, grid
    item, device_budget = np.dtype(dtype).itemsize, execution.device_budget
    slots = execution.lookahead + 1
    # Staging only where a grid row (A) or column (B) has ranks to send to.
    staged = (bool(execution.staged[0]) and pc > 1, bool(execution.staged[1]) and pr > 1)
    # fp64-int8's products in chunks of rows where a tile's do not fit whole:
    # the cut and the slots are made for the smallest chunks, which then
    # grow into the room left (:func:`int8_chunk_rows`)
    emulated = Int8Products(np.dtype(dtype).kind == "c", least_int8_rows()) \
        if execution.precision == "fp64-int8" else None
    panels = SweepPanels(nb, slots, copies, staged, emulated)
    asked = tiles_asked(ml, nl)
    tiles, by_columns = asked, False
    if not asked:
        # (fp64-int8's cut is its own, by its scratch, whatever the storage)
        tiles, by_columns = choose_cut(max(ml, 1), max(nl, 1),
                                 columns_first(execution.storage) and emulated is None,
                                 lambda columns: ooc_tiles(
                                     max(ml, 1), max(nl, 1), device_budget // item, panels,
                                     columns),
                                 either=emulated is None)
    if tiles is None:
        raise ValueError(f"a device budget of {format_bytes(device_budget)} is too small for "
                         f"out-of-core tiles of {np.dtype(dtype).name} with {nb}-wide panels")
    buffers = c_tile_buffers(tiles[0] * tiles[1])
    if not (asked or emulated) and buffers == 2:
        def fits_one(tm: int, tn: int) -> bool:  # one C tile of tm x tn, and the slots
            return ooc_elements(tm, tn, 2, panels, c_buffers=1) * item <= device_budget
        tiles, buffers = one_at_a_time((max(ml, 1), max(nl, 1), k), tiles, np.dtype(dtype),
                                        fits_one, by_columns)
    tm, tn = -(-max(ml, 1) // tiles[0]), -(-max(nl, 1) // tiles[1])

    def need(slots: int, rows: int | None = least_int8_rows(),
             planes: int | None = None) -> int:
        return ooc_elements(tm, tn, tiles[0] * tiles[1], replace(
            panels, slots=slots, emulated=emulated and replace(emulated, rows=rows,
                                                               planes=planes)), buffers) * item
    if asked and need(slots) > device_budget:  # the planner's own cut fits by construction
        buffers = 1  # an asked cut may fit with one C tile at a time
        if need(slots) > device_budget:
            raise ValueError(f"SUMMA_OOC_TILES: {tiles[0]} x {tiles[1]} tiles of {tm} x {tn} "
                             f"need {format_bytes(need(slots))} of the device budget of "
                             f"{format_bytes(device_budget)}")
    for _ in range(upload_lead()):  # room for uploads steps ahead, same tiles
        if need(slots + 1) > device_budget:
            break
        slots += 1
    rows = int8_chunk_rows(tm, lambda r: need(slots, r) <= device_budget) if emulated else None
    planes = int8_fold_planes(nb, lambda p: need(slots, rows, p) <= device_budget) \
        if emulated else None
    ring = ring_bytes(execution.copy_threads or copy_threads(1)) \
        if traits(execution.backend).gpu else 0
    return MemoryPlan("out-of-core", need(slots, rows, planes), blocks * item,
                      (int(tm), int(tn)), int(nb), (int(tiles[0]), int(tiles[1])), slots,
                      copies[0], staged, ring, rows, planes, buffers,
                      head_first=FP64_INT8_HEAD_FIRST if emulated else HEAD_FIRST,
                      tail_smallest=FP64_INT8_TAIL_SMALLEST if emulated else TAIL_SMALLEST,
                      transposed_b=copies[1])


def resident_plan(m: int, n: int, k: int, dtype, precision=None, copies: int = 0,
                  new_c: bool = True, budget: int | None = None) -> MemoryPlan:
    """Peak device bytes of one GEMM on operands that already lie on the
    device (``summa.matmul`` of GPU arrays on one rank), beside them: C
    where it is `new_c` (not the caller's ``out=``), `copies` bytes of
    operands uploaded or copied for the GEMM, and for ``precision=
    "fp64-int8"`` one product's scratch (K taken in pieces of at most
    :data:`summa.precision.ozaki.K_EXACT`; complex: the operands' real and imaginary
    parts over all of K besides), for all of C's rows at once, or where
    that passes `budget` (the device bytes free beside the operands) in
    chunks of rows (``int8_rows``, :func:`int8_chunk_rows`; the smallest where
    none fits, the least this GEMM can need). No host memory."""
    dtype = np.dtype(dtype)
    need = (m * n * dtype.itemsize if new_c else 0) + int(copies)
    if precision != "fp64-int8":
        return MemoryPlan("on-device", need, 0)
    piece = max(1, min(k, K_EXACT))
    if dtype.kind == "c":
        need += 16 * (m * k + k * n + m * n)

    def with_scratch(rows: int | None, planes: int | None = None) -> int:
        return need + ozaki_gpu.scratch_bytes(m, n, piece, moduli_for(piece),
                                              planes=planes, rows=rows)
    if budget is None:
        return MemoryPlan("on-device", with_scratch(None), 0)
    rows = int8_chunk_rows(m, lambda r: with_scratch(r) <= budget)
    planes = int8_fold_planes(piece, lambda p: with_scratch(rows, p) <= budget)
    return MemoryPlan("on-device", with_scratch(rows, planes), 0, int8_rows=rows,
                      int8_planes=planes)


def upload_lead() -> int:
    """Most extra slots an out-of-core plan takes, where the budget leaves
    room: uploads run that many steps ahead of their GEMMs, so that an upload
    slower than its GEMM for a while (host threads busy) does not stop the
    GPU. ``SUMMA_UPLOAD_LEAD`` overrides."""
    return options.current().upload_lead


def host_traffic(memory: MemoryPlan, shape, grid) -> int:
    """Elements one rank moves between host and GPU out of core: its A
    block once per column of C tiles, its B block once per row of them, its
    C block once."""
    m, n, k = shape
    return moved_elements((-(-m // grid[0]), -(-n // grid[1]), k), memory.tiles, 2)


def sweep_steps(memory: MemoryPlan, k: int) -> int:
    """Steps (GEMMs) of an out-of-core sweep of K: C tiles times panels."""
    return memory.tile_count * -(-k // max(memory.chunk, 1))


def waited_write_backs(memory: MemoryPlan) -> int:
    """Elements of C out of core whose write-back the next tile waits for:
    with one C tile on the device (``c_buffers`` 1), every tile's but the
    last; none with two."""
    return waited_elements(memory.tiles, memory.tile) if memory.c_buffers == 1 else 0
