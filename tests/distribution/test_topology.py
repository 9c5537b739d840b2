"""Topology (summa/distribution/topology.py): the nodes of a communicator's ranks, detected
once, or virtual nodes that make one machine's ranks take the paths between
nodes."""

import pathlib
import re

import numpy as np
import pytest
from mpi4py import MPI

import summa
from helpers import gemm_scaled_error, random_array, spy_out_of_core
from summa.host import shared as host, blocks as hostblocks, remote
from summa.device.backend import NumpyBackend
from summa.distribution.grid import ProcessGrid
from summa.planning.memory import Execution, memory_plan
from summa.planning.memorycheck import check_host_memory, ranks_on_device
from summa.distribution.topology import Topology, topology_of

SOURCES = pathlib.Path(summa.__file__).parent


def test_split_type_is_called_in_topology_alone():
    """Every "same node?" decision takes one topology: no other module splits."""
    callers = sorted(path.name for path in SOURCES.rglob("*.py")
                     if re.search(r"\bSplit_type\b|COMM_TYPE_SHARED", path.read_text()))
    assert callers == ["topology.py"]


@pytest.mark.mpi(min_size=1)
def test_this_machine_is_one_node_detected_once(comm):
    topo = topology_of(comm)
    assert topo is topology_of(comm)  # kept with the communicator: one split
    assert not topo.is_virtual and topo.one_node and topo.count == 1
    assert topo.nodes == (0,) * comm.Get_size() and topo.node == 0 and topo.leader == 0
    assert (topo.local_rank, topo.local_size) == (comm.rank, comm.Get_size())
    assert all(topo.same_node(r) for r in range(comm.Get_size()))
    assert topo.machine_comm is topo.node_comm and topo.machine == 0
    with ProcessGrid(comm) as grid:
        assert grid.topology is topo and topology_of(grid.comm) is topo
        assert (grid.local_rank, grid.local_size, grid.node) == (comm.rank, comm.Get_size(), 0)


def _blocks(size: int, nodes: int) -> list:
    """The virtual node of every rank of one machine: consecutive blocks."""
    return [r * nodes // size for r in range(size)]


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("nodes", [1, 2, 3])
def test_virtual_nodes_are_consecutive_blocks_of_ranks(comm, nodes):
    size = comm.Get_size()
    expect = _blocks(size, nodes)
    with Topology.virtual(comm, nodes=nodes) as topo:
        assert topo.is_virtual and list(topo.nodes) == expect
        assert topo.count == len(set(expect)) and topo.one_node == (len(set(expect)) == 1)
        mine = [r for r in range(size) if expect[r] == expect[comm.rank]]
        assert topo.local_size == len(mine) and topo.local_rank == mine.index(comm.rank)
        assert topo.leader == mine[0]
        assert topo.node_comm.allgather(comm.rank) == mine
        assert [topo.same_node(r) for r in range(size)] == [r in mine for r in range(size)]
        # GPUs are a machine's: ranks of other virtual nodes may share one
        assert topo.machine == 0 and topo.machine_comm.Get_size() == size
    assert topo.node_comm == MPI.COMM_NULL  # freed by its maker
    if size in (4, 6) and nodes > 1:  # the sweep's splits
        assert {(4, 2): [0, 0, 1, 1], (4, 3): [0, 0, 1, 2], (6, 2): [0, 0, 0, 1, 1, 1],
                (6, 3): [0, 0, 1, 1, 2, 2]}[size, nodes] == expect


@pytest.mark.mpi(min_size=1)
def test_a_detected_topology_goes_with_its_communicator(comm):
    dup = comm.Dup()
    topo = topology_of(dup)
    assert topo is not topology_of(comm) and topo.nodes == topology_of(comm).nodes
    dup.Free()
    assert topo.node_comm == MPI.COMM_NULL


@pytest.mark.mpi(min_size=1)
def test_bad_virtual_topologies_are_refused(comm):
    with pytest.raises(ValueError, match="at least one node"):
        Topology.virtual(comm, nodes=0)
    with Topology.virtual(MPI.COMM_SELF, nodes=1) as alone:
        if comm.Get_size() > 1:
            with pytest.raises(ValueError, match="topology of 1 ranks"):
                ProcessGrid(comm, topology=alone)


@pytest.mark.mpi(min_size=2)
def test_a_grid_on_virtual_nodes_decides_between_nodes(comm):
    p = comm.Get_size()
    with Topology.virtual(comm, nodes=2) as topo:
        with ProcessGrid(comm, (1, p), topology=topo) as grid:
            assert grid.topology is topo and topology_of(grid.comm) is topo
            assert (grid.local_rank, grid.local_size) == (topo.local_rank, topo.local_size)
            assert grid.node == topo.leader
            assert grid.within_nodes() == (False, True)  # the row spans both nodes
            assert ranks_on_device(NumpyBackend(), grid.comm) == 1
            assert not hostblocks.node_shares(grid, (4, 4, 4), "float64")
            plan = memory_plan(8, 8, 8, "float64", grid.shape, 4, Execution(1, "numpy"))
            check_host_memory(plan, grid.comm)
        assert topo.node_comm != MPI.COMM_NULL  # the grid frees what it made only


@pytest.mark.mpi(min_size=2)
def test_node_shared_arrays_are_one_per_virtual_node(comm, rng, folder):
    with Topology.virtual(comm, nodes=2) as topo:
        x = host.empty((comm.Get_size(), 3), "float64", comm, topology=topo)
        tokens = comm.allgather(host.shared_token(x))
        assert [tokens[r] == tokens[comm.rank] for r in range(comm.Get_size())] == \
            [topo.same_node(r) for r in range(comm.Get_size())]
        x[comm.rank] = comm.rank + 1
        comm.Barrier()
        written = [r + 1 if topo.same_node(r) else 0 for r in range(comm.Get_size())]
        assert np.array_equal(np.asarray(x)[:, 0], written)  # the node's ranks' rows only
        data = random_array(rng, (7, 5), "float32")
        if comm.rank == 0:
            np.save(folder / "a.npy", data)
        comm.Barrier()
        data = comm.bcast(data)
        loaded = host.load(folder / "a.npy", comm, topology=topo)
        assert np.array_equal(np.asarray(loaded), data)  # every virtual node has all of it


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("nodes", [1, 2])
def test_arrays_on_the_root_travel_by_mpi_between_virtual_nodes(comm, rng, monkeypatch,
                                                                 nodes):
    """One node: blocks are read in place (or from a node-shared copy); two:
    scattered and gathered by MPI, neither path taken."""
    taken = []
    for module, name in ((remote, "describe"), (host, "empty")):
        real = getattr(module, name)
        monkeypatch.setattr(module, name,
                            lambda *a, _real=real, _name=name, **k: taken.append(_name)
                            or _real(*a, **k))
    seen = spy_out_of_core(monkeypatch)
    a, b = random_array(rng, (29, 17), "float64"), random_array(rng, (17, 11), "float64")
    mine = comm.rank == 0
    with Topology.virtual(comm, nodes=nodes) as topo:
        c = summa.matmul(a if mine else None, b if mine else None, comm=comm,
                         out_of_core=True, panel_width=5, topology=topo)
    (A, B, C), = seen
    if nodes == 1:  # (the root alone describes its arrays)
        assert comm.allreduce(bool(taken), op=MPI.LOR)
    else:
        assert not taken and remote.find(A) is None and host.shared_token(A) is None
    if mine:
        assert gemm_scaled_error(c, a, b) <= 1
