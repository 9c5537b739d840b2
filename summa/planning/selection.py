"""Which broadcasters a multiply uses: the row and column broadcasters of a
grid (made and self-tested once per grid and kind), ``auto``'s choice of
direct copies (CUDA IPC) per direction, and whether their set-up pays
(:func:`direct_copies_pay`: the planner's, which the Plan carries).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..runtime.mpi import MPI
from .. import options
from ..transports import ipc
from ..transports.broadcasters import make_broadcaster
from ..transports.comm import choose_comm
from ..runtime.watchdog import watch

__all__ = ["direct_copies_pay", "planned_copy_engines", "export_blocks", "connect_seconds",
           "grid_broadcasters", "peer_access", "OPEN_SECONDS", "SMALL_BLOCK_BYTES"]


def direct_copies_pay(A, B, C, panels, broadcaster, precision) -> bool:
    """May ``auto`` take direct copies (ipc) for these operands
    (:func:`grid_broadcasters`' `copy_engines`)? With ``auto`` on GPUs of a
    grid, where the peers' blocks stay open after the multiply
    (:func:`_stay_open`), or where every rank's own GEMMs hide opening them
    (:func:`_hides_connect`); elsewhere True, as nothing is decided (other
    kinds, CPUs and one rank never copy by ``auto``'s choice). The planner's
    decision (:func:`summa.planning.distributed.plan_distributed`,
    :func:`summa.planning.distributed.settled_plan`), which the executors
    take as the Plan's ``copy_engines``. Collective where it decides: the
    same answer everywhere.

    Parameters
    ----------
    A, B, C : DistMatrix
        The operands and result of the multiply.
    panels : list of Panel
        The multiply's panels (their roots tell which GEMMs are this rank's own).
    broadcaster : str
        The kind asked for (``auto``, ``nccl``, ``ipc``, ``host`` ...).
    precision : str or None
        The multiply's precision (``tf32`` runs faster GEMMs that hide less).

    Returns
    -------
    bool
        Whether ``auto`` may copy directly.
    """
    grid, backend = C.grid, C.backend
    if broadcaster != "auto" or grid.size == 1 or not backend.is_gpu:
        return True
    # The directions auto could copy directly in (collective, like all below).
    dirs = grid.within_nodes()
    # Blocks along a grid row (column) of one rank have no reader.
    read = (dirs[0] and grid.shape[1] > 1, dirs[1] and grid.shape[0] > 1)
    return bool(any(dirs) and (
        _stay_open(grid, backend, (A.local, B.local), read)
        or _hides_connect(panels, grid, C.local.shape, C.dtype, precision,
                          (A.local.nbytes, B.local.nbytes), dirs)))


def planned_copy_engines(copy_engines) -> bool:
    """A Plan's ``copy_engines`` as the in-memory executor takes it, checked:
    True or False (None, not yet settled, is the planner's to settle on the
    operands before the run: :func:`summa.planning.distributed.settled_plan`)."""
    if not isinstance(copy_engines, bool):
        raise ValueError("a plan's copy_engines must be True or False (settled by the planner "
                         f"on the operands before the run), got {copy_engines!r}")
    return copy_engines


def _stay_open(grid, backend, blocks, dirs) -> bool:
    """Are all blocks of this multiply (A's and B's on each rank, in the
    directions `dirs` that would copy directly) small enough to stay open at
    their readers after it (:func:`summa.transports.ipc.keeps_open`)? Collective; the same
    answer everywhere.

    Then direct copies pay even where the first multiply cannot hide opening
    them (TF32 at N = 16384: 313 against NCCL's 646 TFLOP/s): every later one
    of the same blocks opens nothing (712 TFLOP/s; docs/benchmarks.md). The
    choice does not depend on earlier multiplies, so neither do the bits; a
    loop over new operands pays the opening each time (README).
    """
    small = all([ipc.keeps_open(b, backend) for b, on in zip(blocks, dirs) if on])
    return grid.comm.allreduce(small, op=MPI.LAND)


def _direct(bc) -> bool:
    """Does broadcaster `bc` let receivers copy panels straight out of the
    roots' blocks (ipc), with ranks of its row/column to read from?"""
    return getattr(bc, "reads_blocks", False) and bc.comm.Get_size() > 1


def export_blocks(grid, backend, row_bc, col_bc, a_block, b_block) -> tuple[bool, bool]:
    """Export this rank's blocks to the broadcasters that let peers read them
    directly (ipc); collective. Returns, the same on every rank, which of the
    row and column broadcasters copy directly: neither where any rank could
    not export (e.g. a block without contiguous rows), and paired broadcasts
    of the same broadcasters are used instead.

    Parameters
    ----------
    grid : Grid
        The process grid.
    backend : Backend
        The array backend of the blocks.
    row_bc, col_bc : broadcaster
        The row and column broadcasters.
    a_block, b_block : array
        This rank's blocks of A and B.

    Returns
    -------
    tuple of bool
        Whether the row and the column broadcaster copy directly.
    """
    want = (_direct(row_bc), _direct(col_bc))
    if not any(want):
        return want
    backend.synchronize()  # the blocks' values are written before any peer reads
    ok = all([bc.export(block) for bc, block, on in
              zip((row_bc, col_bc), (a_block, b_block), want) if on])
    return want if grid.comm.allreduce(ok, op=MPI.LAND) else (False, False)


#: Seconds to open one peer's block for direct copies (ipc), by its size: on
#: 2 H200s ``cudaIpcOpenMemHandle`` took ~1 ms up to 256 MiB and ~10 ms from
#: 512 MiB to 4 GiB (docs/benchmarks.md, "Measurements behind the defaults"),
#: and a multiply's whole connect (handles exchanged, 4 GiB blocks) 19-22 ms.
#: Rounded up.
OPEN_SECONDS = {"small": 0.002, "large": 0.02}
#: Largest block that opens at the small cost.
SMALL_BLOCK_BYTES = 256 << 20

#: GPU GEMM rates (FLOP/s) to judge whether a rank's own panels outlast the
#: connect: one H200's cupy.matmul at N = 16384-32768 (docs/benchmarks.md).
#: Slower GPUs only make the GEMMs longer and direct copies safer.
_GEMM_FLOPS = {"d": 54e12, "f": 54e12, "tf32": 420e12, "e": 760e12}


def connect_seconds(shape, a_bytes: int, b_bytes: int, dirs=(True, True)) -> float:
    """Estimated time to open the peers' blocks on a grid of `shape`: the A
    blocks of a rank's grid row and the B blocks of its column (sized like its
    own), in the directions `dirs` (row, column) that copy directly.

    Parameters
    ----------
    shape : tuple of int
        The grid's shape (rows, columns).
    a_bytes, b_bytes : int
        Bytes of one rank's A and B blocks.
    dirs : tuple of bool
        Whether the row and the column direction copy directly.

    Returns
    -------
    float
        Estimated seconds.

    Examples
    --------
    >>> connect_seconds((1, 2), 1 << 20, 1 << 20, (True, False))
    0.002
    """
    def one(nbytes):
        return OPEN_SECONDS["small" if nbytes <= SMALL_BLOCK_BYTES else "large"]
    return (dirs[0] * (shape[1] - 1) * one(a_bytes)
            + dirs[1] * (shape[0] - 1) * one(b_bytes))


def _hides_connect(panels, grid, local_shape, dtype, precision, block_bytes,
                   dirs=(True, True)) -> bool:
    """Would every rank's GEMMs on the panels it holds itself in the directions
    `dirs` that copy directly (multiplied first) outlast opening its peers'
    blocks there (`block_bytes`: this rank's A and B blocks)? Collective; the
    same answer everywhere. Where not, and the blocks are too large to stay
    open (:func:`_stay_open`), ``auto`` takes NCCL: at N = 16384 TF32 lost
    half its speed to an unhidden connect."""
    dtype = np.dtype(dtype)
    kind = "tf32" if precision == "tf32" else dtype.char.lower()
    rate = _GEMM_FLOPS.get(kind, _GEMM_FLOPS["d"]) / (4 if dtype.kind == "c" else 1)
    own = sum(p.width for p in panels
              if (not dirs[0] or p.a_root == grid.col) and (not dirs[1] or p.b_root == grid.row))
    margin = 2.0 * local_shape[0] * local_shape[1] * own / rate \
        - connect_seconds(grid.shape, *block_bytes, dirs)
    return grid.comm.allreduce(margin, op=MPI.MIN) >= 0


def grid_broadcasters(grid, kind: str, backend, copy_engines: bool = True):
    """The row and column broadcasters of `grid`, made (and self-tested) once per
    grid and mode, since NCCL communicators are expensive to create.

    With ``auto`` and `copy_engines`, each direction whose grid rows (columns)
    all lie within a node, with a GPU per rank, gets ``ipc`` where its
    self-test passes: on 2 H200s at N = 32768 the GPUs' copy engines beat
    NCCL's kernels, which slow the GEMMs beside them, in every dtype in
    memory (the SUMMA loop copies panels straight out of the roots' blocks)
    and in float64 out of core (paired broadcasts through staging buffers:
    102.9 against 98.6 TFLOP/s; docs/benchmarks.md). A grid whose rows lie
    within nodes and whose columns span them copies row panels and broadcasts
    column panels with NCCL. Without `copy_engines` (in memory where the
    peers' blocks would open too slowly, and are too large to keep open)
    ``auto`` takes NCCL.

    Parameters
    ----------
    grid : Grid
        The process grid.
    kind : str
        The broadcaster kind asked for.
    backend : Backend
        The array backend.
    copy_engines : bool
        Whether ``auto`` may choose direct copies (ipc).

    Returns
    -------
    tuple
        The row and column broadcasters.
    """
    if kind == "auto" and copy_engines and backend.supports_ipc and grid.size > 1:
        pair = _auto_ipc(grid, backend)
        if pair is not None and None in (pair.row, pair.col):
            # One direction within nodes (ipc), the other across them (as usual).
            usual = grid_broadcasters(grid, kind, backend, copy_engines=False)
            return pair.row or usual[0], pair.col or usual[1]
        if pair is not None:
            return pair.row, pair.col
    # One rank sends nothing: under auto the plainest broadcaster, so that no
    # library (NCCL: ~0.1 s to load) is loaded on the first call.
    name = "mpi" if kind == "auto" and grid.size == 1 else choose_comm(kind, backend)
    if name == "nccl" and not _devices_distinct(grid, backend):
        # NCCL refuses two ranks of one communicator on the same GPU.
        if kind == "nccl":
            raise ValueError("--comm nccl needs a GPU per rank, but ranks of a grid row or "
                             "column share a GPU; use more GPUs, fewer ranks, or --comm mpi")
        name = choose_comm("mpi", backend)
    if name == "ipc" and not _on_one_node(grid):
        raise ValueError("--comm ipc needs every grid row and column on one node")
    key = ("broadcasters", name, backend.name, backend.device)
    pair = grid.resources.get(key)
    if pair is None:
        with watch(f"the other ranks to set up and self-test the {name} broadcasters"):
            pair = _Pair(make_broadcaster(name, grid.row_comm, backend, check=True),
                         make_broadcaster(name, grid.col_comm, backend, check=True))
        grid.resources[key] = pair
    return pair.row, pair.col


def _auto_ipc(grid, backend):
    """The ipc broadcasters for ``--comm auto``: a pair (row, column), each
    None where its direction cannot use them (some grid row, or column, spans
    nodes; GPUs are shared; its self-test failed), or None where neither
    direction can. The same on every rank, since ranks of one grid column (row)
    must order their panels alike; kept with the grid."""
    key = ("broadcasters", "ipc", backend.name, backend.device)
    if key in grid.resources or ("no auto ipc",) in grid.resources:
        return grid.resources.get(key)
    comms = (grid.row_comm, grid.col_comm)
    wanted = [False, False]
    if _devices_distinct(grid, backend):
        wanted = list(grid.within_nodes())
    made, ok = [None, None], [False, False]
    if any(wanted):
        with watch("the other ranks to set up and self-test the ipc broadcasters"):
            for d, c in enumerate(comms):  # every rank tries the same directions
                if wanted[d]:
                    try:
                        made[d] = make_broadcaster("ipc", c, backend, check=True)
                    except RuntimeError:
                        # raised on every rank of `c` (see summa/transports/ipc.py)
                        pass
            ok = [wanted[d] and grid.comm.allreduce(made[d] is not None, op=MPI.LAND)
                  for d in (0, 1)]
    for d in (0, 1):
        if made[d] is not None and not ok[d]:
            made[d].free()
            made[d] = None
    if not any(ok):
        grid.resources[("no auto ipc",)] = _Pair(None, None)  # remembered; nothing to free
        return None
    pair = grid.resources[key] = _Pair(*made)
    return pair


def peer_access(grid, backend) -> bool:
    """Can every GPU read the memory of the other GPUs of its grid row and
    column directly (``cudaDeviceCanAccessPeer``; NVLink, or PCIe with peer
    access)? Collective; the same answer everywhere. ``SUMMA_PEER_ACCESS``
    (0 or 1) overrides (tests). Without it (GeForce cards over PCIe), a
    panel forwarded from its owner's GPU passes through host memory again,
    and every GPU fetching its own panel parts from host memory is faster."""
    asked = options.current().peer_access
    if asked is not None:
        return asked
    if not backend.is_gpu or grid.size == 1:
        return True
    me = (grid.topology.node, backend.device)
    peers = set()
    for c in (grid.row_comm, grid.col_comm):
        peers.update(c.allgather(me))
    rt = backend.xp.cuda.runtime
    # GPUs on other nodes (virtual ones too) are never peers: device numbers
    # name the GPUs of one node
    ok = all(p == me or (p[0] == me[0] and bool(rt.deviceCanAccessPeer(me[1], p[1])))
             for p in peers)
    return grid.comm.allreduce(ok, op=MPI.LAND)


def _devices_distinct(grid, backend) -> bool:
    """True on every rank when no two ranks of any grid row or column share a
    GPU (that of one machine: virtual nodes of it may share one)."""
    me = (grid.topology.machine, backend.device_id())
    # A list, not a generator: every rank takes part in both collectives.
    distinct = all([len(set(c.allgather(me))) == c.Get_size()
                    for c in (grid.row_comm, grid.col_comm)])
    return grid.comm.allreduce(distinct, op=MPI.LAND)


def _on_one_node(grid) -> bool:
    """True on every rank when each grid row and column lies within one node."""
    return all(grid.within_nodes())


@dataclass
class _Pair:
    row: object
    col: object

    def free(self) -> None:
        for bc in (self.row, self.col):
            if bc is not None:
                bc.free()
