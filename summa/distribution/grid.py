"""The 2-D process grid: Cartesian communicator, row/column sub-communicators,
the ranks' nodes (:mod:`summa.distribution.topology`); the default grid for a problem."""

from __future__ import annotations

import math
import os

import numpy as np

from ..runtime.mpi import MPI
from ..device import staging
from .topology import Topology, keep, topology_of
from ..device.traits import traits

__all__ = ["ProcessGrid", "parse_grid", "choose_grid", "grid_for", "grid_shapes",
           "node_rank", "node_of", "core_share", "check_grid_ranks"]


def node_of(comm: MPI.Intracomm, topology: Topology | None = None) -> tuple[int, int, int]:
    """This rank's index among the ranks of `comm` on its node (ranks sharing
    memory, as MPI sees them, or as `topology` says), their number, and the
    rank in `comm` of the node's first rank, which names the node: the same
    on every rank of a node, different between nodes whatever their
    hostnames (containers or VMs on different machines may share one)."""
    topology = topology or topology_of(comm)
    return topology.local_rank, topology.local_size, topology.leader


def core_share(comm: MPI.Intracomm,
               topology: Topology | None = None) -> tuple[int, int, str | None]:
    """The cores this rank may run on (its affinity), how many ranks of
    `comm` on its node (as `topology` says, :func:`node_of`) may run on some of
    them (itself too), and a warning where that leaves it under an even
    share of its node's cores; collective. Host copies and file reads run on
    threads, so a rank the launcher bound to one core (Open MPI does when it
    starts two ranks or fewer) copies at a fraction of the node's rate
    (issue 23: reads at 1 GB/s of the disk's 2.3)."""
    mine = _affinity()
    node = (topology or topology_of(comm)).node_comm
    # the launcher's own cores: what the job was given (a batch system's
    # allocation), where its ranks were then bound narrower
    sets = node.allgather((mine, _affinity(os.getppid())))
    sharing = sum(1 for s, _ in sets if s & mine)
    cores = len(set().union(*(s | launcher for s, launcher in sets)))
    even = cores // len(sets)
    note = None
    if len(mine) // sharing < min(4, even):
        note = (f"rank {comm.Get_rank()} may run on {len(mine)} of its node's {cores} "
                f"cores{f' (with {sharing - 1} other ranks)' if sharing > 1 else ''}: its "
                "launcher bound it, and its host copies and file reads run on threads. Start "
                "it with --bind-to none (Open MPI binds each rank to one core when it starts "
                "two or fewer) or give each rank its cores (Open MPI --map-by "
                "ppr:R:node:PE=C, Slurm --cpus-per-task)")
    return len(mine), sharing, note


def _affinity(pid: int = 0) -> set:
    """The cores process `pid` (0: this one) may run on; this one's where
    the system does not say."""
    try:
        return set(os.sched_getaffinity(pid))
    except (AttributeError, OSError):
        return set(os.sched_getaffinity(0)) if pid and hasattr(os, "sched_getaffinity") \
            else set(range(os.cpu_count() or 1))


def node_rank(comm: MPI.Intracomm, topology: Topology | None = None) -> tuple[int, int]:
    """This rank's index among the ranks of `comm` on its node (as `topology`
    says, :func:`node_of`), and their number."""
    return node_of(comm, topology)[:2]


def parse_grid(text: str) -> tuple[int, int]:
    """Parse ``"2x3"`` into ``(2, 3)``; raise ValueError on anything else.

    Examples
    --------
    >>> parse_grid("2x3")
    (2, 3)
    """
    parts = str(text).lower().replace("×", "x").split("x")
    try:
        if len(parts) != 2:
            raise ValueError
        pr, pc = int(parts[0]), int(parts[1])
    except ValueError:
        raise ValueError(f"grid must look like 2x3 (rows x columns), got {text!r}") from None
    if pr < 1 or pc < 1:
        raise ValueError(f"grid dimensions must be >= 1, got {text!r}")
    return pr, pc


def check_grid_ranks(dims, ranks: int) -> None:
    """Raise ValueError unless the grid `dims` ``(Pr, Pc)`` holds `ranks`.

    Examples
    --------
    >>> check_grid_ranks((3, 3), 1)
    Traceback (most recent call last):
    ValueError: grid 3x3 needs 9 ranks, but 1 was started
    """
    if dims[0] * dims[1] != ranks:
        raise ValueError(f"grid {dims[0]}x{dims[1]} needs {dims[0] * dims[1]} ranks, "
                         f"but {ranks} {'was' if ranks == 1 else 'were'} started")


def grid_shapes(nprocs: int) -> list[tuple[int, int]]:
    """Every grid ``(Pr, Pc)`` of `nprocs` ranks, fewest rows first."""
    return [(r, nprocs // r) for r in range(1, nprocs + 1) if nprocs % r == 0]


def choose_grid(nprocs: int, m: int | None = None, n: int | None = None,
                tall: bool = False) -> tuple[int, int]:
    """Grid ``(Pr, Pc)`` with ``Pr * Pc == nprocs`` for a product C of ``m x n``.

    Without the shape: near-square with ``Pr >= Pc`` (a prime count gives
    ``P x 1``). With it: the grid whose ranks receive the fewest panel
    elements, ``k (m / Pr + n / Pc)``, i.e. blocks of C as square as the shape
    allows; among grids that tie (a square C), the near-square one with
    ``Pr >= Pc``, or with ``Pc >= Pr`` where `tall` (blocks of C taller than
    wide: cuBLAS's float64 GEMM runs faster on them).
    """
    if nprocs < 1:
        raise ValueError(f"number of processes must be >= 1, got {nprocs}")
    # MPI_Dims_create's balanced pair, Pr >= Pc, reckoned here: planning starts no MPI
    pc = max(d for d in range(1, math.isqrt(nprocs) + 1) if nprocs % d == 0)
    pr = nprocs // pc
    if m is None or n is None:
        return pr, pc
    grids = grid_shapes(nprocs)
    # exact comparison of m/r + n/c over a common denominator (ties must tie)
    cost = {g: m * (nprocs // g[0]) + n * g[0] for g in grids}
    best = min(cost.values())
    if tall and cost[(pc, pr)] == best:
        return pc, pr
    if cost[(pr, pc)] == best:
        return pr, pc
    return min((g for g in grids if cost[g] == best), key=lambda g: (abs(g[0] - g[1]), g[1]))


def grid_for(nprocs: int, m: int, n: int, backend: str, dtype,
             schedule: str = "panels") -> tuple[int, int]:
    """The default grid of a run making an ``m x n`` C: ``P x 1`` for column
    strips (all they run on); else :func:`choose_grid` by the shape, blocks
    taller than wide for float64 on GPUs (cuBLAS's float64 GEMM with A
    transposed, the halves of N = 16384 on 2 H200s: 118 against 110 TFLOP/s;
    summa on 1x2 110.2 against 100.2 on 2x1; other dtypes tie)."""
    if schedule == "strips":
        return nprocs, 1
    return choose_grid(nprocs, m, n, tall=traits(backend).gpu and np.dtype(dtype) == np.float64)


class ProcessGrid:
    """A ``Pr x Pc`` Cartesian grid of the ranks of `comm`.

    Parameters
    ----------
    comm : MPI.Intracomm
        The ranks to arrange; the grid duplicates what it needs and never
        frees `comm` itself.
    dims : tuple of int, str or None
        ``(Pr, Pc)``, a string such as ``"2x3"``, or None for a near-square grid.
    topology : Topology, optional
        The nodes of `comm`'s ranks (:mod:`summa.distribution.topology`; default: as MPI
        sees them, detected once per communicator). Its maker frees it, after
        the grid.

    Attributes
    ----------
    comm : MPI.Cartcomm
        Cartesian communicator (rank order preserved).
    row_comm : MPI.Cartcomm
        The ranks of this rank's grid row; its rank is the grid column.
    col_comm : MPI.Cartcomm
        The ranks of this rank's grid column; its rank is the grid row.
    row, col : int
        This rank's grid coordinates.
    local_rank, local_size : int
        Rank and number of ranks on this node (shared-memory domain).
    topology : Topology
        The nodes of the ranks; also what :func:`summa.distribution.topology.topology_of`
        gives for `comm` (the grid's).

    Examples
    --------
    >>> with ProcessGrid(MPI.COMM_WORLD, "1x1") as grid:  # doctest: +SKIP
    ...     grid.shape
    (1, 1)
    """

    def __init__(self, comm: MPI.Intracomm, dims=None, topology: Topology | None = None):
        size = comm.Get_size()
        if dims is None:
            dims = choose_grid(size)
        elif isinstance(dims, str):
            dims = parse_grid(dims)
        dims = (int(dims[0]), int(dims[1]))
        if dims[0] < 1 or dims[1] < 1:
            raise ValueError(f"grid dimensions must be >= 1, got {dims[0]}x{dims[1]}")
        check_grid_ranks(dims, size)
        if topology is not None and topology.size != size:
            raise ValueError(f"a topology of {topology.size} ranks given for {size}")
        self.shape = dims
        self.topology = topology or topology_of(comm)
        self.comm = comm.Create_cart(dims, periods=[False, False], reorder=False)
        self.row, self.col = self.comm.Get_coords(self.comm.Get_rank())
        self.row_comm = self.comm.Sub([False, True])
        self.col_comm = self.comm.Sub([True, False])
        # the grid's communicator numbers the ranks as `comm` does: the same
        # topology, which what is given the grid's communicator finds there
        keep(self.comm, self.topology)
        # self.node: the rank of its node's first rank, which names the node
        self.local_rank, self.local_size, self.node = node_of(comm, self.topology)
        # host-GPU copies share the cores this rank may run on with the
        # node's ranks that may run there too; a warning (rank 0 says it)
        # where the launcher left some rank too few
        _, sharing, note = core_share(comm, self.topology)
        staging.set_ranks_on_node(sharing)
        self.core_note = next((n for n in comm.allgather(note) if n), None)
        #: Objects living as long as the grid (e.g. NCCL communicators), each with
        #: a ``free()`` method; released by :meth:`free`.
        self.resources: dict = {}
        self._within_nodes = None

    def within_nodes(self) -> tuple[bool, bool]:
        """Whether every grid row, and every grid column, lies within one node;
        the same on every rank. Collective on its first call, then remembered."""
        if self._within_nodes is None:
            self._within_nodes = tuple(
                [self.comm.allreduce(len(set(c.allgather(self.node))) == 1, op=MPI.LAND)
                 for c in (self.row_comm, self.col_comm)])  # a list: every rank takes part
        return self._within_nodes

    @property
    def rank(self) -> int:
        return self.comm.Get_rank()

    @property
    def size(self) -> int:
        return self.comm.Get_size()

    def device_index(self, ndevices: int) -> int:
        """GPU this rank binds to: its node-local rank modulo the device count."""
        if ndevices < 1:
            raise ValueError("no GPU devices to bind to")
        return self.local_rank % ndevices

    def free(self) -> None:
        """Free the communicators this grid created (safe to call twice)."""
        for resource in getattr(self, "resources", {}).values():
            resource.free()
        self.resources = {}
        for name in ("row_comm", "col_comm", "comm"):
            c = getattr(self, name, None)
            if c is not None and c != MPI.COMM_NULL:
                c.Free()
            setattr(self, name, None)

    def __enter__(self) -> "ProcessGrid":
        return self

    def __exit__(self, *exc) -> None:
        self.free()

    def __repr__(self) -> str:
        return f"ProcessGrid({self.shape[0]}x{self.shape[1]}, rank={self.rank} at ({self.row}, {self.col}))"
