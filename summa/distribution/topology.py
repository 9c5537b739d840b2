"""Where the ranks of a communicator run: which of them share a node, as one
value that every "same node?" decision takes (node-shared arrays in
``/dev/shm``, in-place reads between processes, CUDA IPC, the host-staged
panels, the node's cores and copy threads, its host memory).

:func:`topology_of` gives a communicator's topology, detected once (MPI's
shared-memory split, :meth:`Topology.detect`) and kept with the communicator
as an MPI attribute, freed when the communicator is. A
:class:`summa.distribution.grid.ProcessGrid` keeps its topology with its own
communicator, so everything given the grid's communicator sees the same
one. :meth:`Topology.virtual` splits each node's ranks into several virtual
nodes instead: given to a grid (or to :func:`summa.matmul`), it makes one
machine's ranks take the paths between nodes, which tests use.
"""

from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass, field

from ..runtime.mpi import MPI
__all__ = ["Topology", "topology_of", "keep"]


@dataclass(frozen=True, eq=False)
class Topology:
    """The nodes of a communicator's ranks, as seen from one of them.

    Parameters
    ----------
    node_comm : MPI.Intracomm
        The ranks of the communicator on this rank's node, in its order.
    nodes : tuple of int
        The node of every rank of the communicator, numbered from 0 in the
        order of each node's first rank.
    rank : int
        This rank in the communicator.
    devices : int or None
        GPUs this rank's node has, where known (None: no CuPy, or not asked).
    real : Topology or None
        Of a virtual topology (:meth:`virtual`), the nodes MPI sees.
    """

    node_comm: MPI.Intracomm
    nodes: tuple
    rank: int
    devices: int | None = None
    real: Topology | None = field(default=None, repr=False)

    @classmethod
    def detect(cls, comm: MPI.Intracomm) -> "Topology":
        """The nodes MPI sees (ranks that can share memory); collective. The
        caller frees it (:meth:`free`); :func:`topology_of` keeps one per
        communicator instead. The only shared-memory split in summa."""
        return cls._made(comm, comm.Split_type(MPI.COMM_TYPE_SHARED), _device_count())

    @classmethod
    def virtual(cls, comm: MPI.Intracomm, nodes: int, devices: int | None = None) -> "Topology":
        """Each node's ranks in `nodes` virtual nodes of consecutive ranks
        (as even as they go; fewer where a node has fewer ranks), so that
        ranks of one machine decide as ranks of different machines would;
        collective. Virtual nodes never span real ones. The caller frees it
        (:meth:`free`, or ``with``).

        Examples
        --------
        >>> with Topology.virtual(MPI.COMM_WORLD, nodes=2) as topo:  # doctest: +SKIP
        ...     topo.nodes  # on 4 ranks of one machine
        (0, 0, 1, 1)
        """
        if nodes < 1:
            raise ValueError(f"a virtual topology needs at least one node, got {nodes}")
        real = topology_of(comm)
        color = real.node * nodes + real.local_rank * nodes // real.local_size
        return cls._made(comm, comm.Split(color, comm.Get_rank()),
                         real.devices if devices is None else devices, real)

    @classmethod
    def _made(cls, comm, node_comm, devices, real=None) -> "Topology":
        """The topology whose node communicator is `node_comm` (virtual
        nodes of `real`'s where given); collective."""
        leaders = comm.allgather(node_comm.bcast(comm.Get_rank(), root=0))
        first = sorted(set(leaders))
        return cls(node_comm, tuple(first.index(x) for x in leaders), comm.Get_rank(),
                   devices, real)

    @property
    def is_virtual(self) -> bool:
        """Made by :meth:`virtual`: the nodes are blocks of a machine's ranks."""
        return self.real is not None

    @property
    def size(self) -> int:
        """Ranks in the communicator."""
        return len(self.nodes)

    @property
    def node(self) -> int:
        """This rank's node."""
        return self.nodes[self.rank]

    @property
    def count(self) -> int:
        """Nodes the communicator spans."""
        return max(self.nodes) + 1

    @property
    def one_node(self) -> bool:
        """Do all ranks share one node? The same on every rank."""
        return self.count == 1

    @property
    def local_rank(self) -> int:
        """This rank's index among its node's ranks."""
        return self.node_comm.Get_rank()

    @property
    def local_size(self) -> int:
        """Ranks on this rank's node."""
        return self.node_comm.Get_size()

    @property
    def leader(self) -> int:
        """The rank of this node's first rank, which names the node."""
        return self.nodes.index(self.node)

    @property
    def machine_comm(self) -> MPI.Intracomm:
        """The ranks on this rank's machine, virtual nodes or not: those that
        may share its GPU (device numbers and bus ids name a machine's GPUs)."""
        return (self.real or self).node_comm

    @property
    def machine(self) -> int:
        """This rank's machine (its node as MPI sees it), virtual nodes or not."""
        return (self.real or self).node

    def same_node(self, rank: int) -> bool:
        """Is `rank` (of the communicator) on this rank's node?"""
        return self.nodes[rank] == self.node

    def free(self) -> None:
        """Free the node communicator (safe to call twice)."""
        if self.node_comm != MPI.COMM_NULL:
            self.node_comm.Free()

    def __enter__(self) -> "Topology":
        return self

    def __exit__(self, *exc) -> None:
        self.free()

    def __repr__(self) -> str:
        kind = "virtual " if self.is_virtual else ""
        return (f"Topology({self.size} ranks on {self.count} {kind}node(s), rank {self.rank} "
                f"is {self.local_rank} of {self.local_size} on node {self.node}, "
                f"devices={self.devices})")


def _device_count() -> int | None:
    """GPUs this process sees, where CuPy is installed and says (None
    elsewhere): nothing is imported on machines without it."""
    if importlib.util.find_spec("cupy") is None:
        return None
    try:
        import cupy
        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:  # a CuPy without a driver raises CUDARuntimeError and others
        return None


@functools.lru_cache(maxsize=None)
def _key() -> int:
    """The MPI attribute key under which communicators keep their topology
    (created once per process: the cache)."""
    return MPI.Comm.Create_keyval(delete_fn=_dropped)


def _dropped(comm, keyval, kept) -> None:
    """A communicator with a topology is freed: free the topology where it
    was detected for it. Not on COMM_WORLD or COMM_SELF, whose attributes
    some MPIs delete inside MPI_Finalize, when no communicator may be freed."""
    topology, owned = kept
    if owned and comm != MPI.COMM_WORLD and comm != MPI.COMM_SELF:
        topology.free()


def topology_of(comm: MPI.Intracomm) -> Topology:
    """The topology of `comm`: the one kept with it (:func:`keep`; a process
    grid's), else detected on the first call and kept, freed with `comm`.
    Collective on the first call for a communicator."""
    kept = comm.Get_attr(_key())
    if kept is None:
        kept = (Topology.detect(comm), True)
        comm.Set_attr(_key(), kept)
    return kept[0]


def keep(comm: MPI.Intracomm, topology: Topology) -> None:
    """Make `topology` the one :func:`topology_of` gives for `comm` (which
    has the ranks it describes, in its order); whoever made it frees it."""
    if topology.size != comm.Get_size():
        raise ValueError(f"a topology of {topology.size} ranks cannot describe a communicator "
                         f"of {comm.Get_size()}")
    comm.Set_attr(_key(), (topology, False))
