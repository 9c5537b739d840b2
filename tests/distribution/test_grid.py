"""ProcessGrid: shapes, coordinates, sub-communicators, errors."""

import os

import pytest

from summa.distribution.grid import (ProcessGrid, check_grid_ranks, choose_grid, core_share,
                                     parse_grid)


@pytest.mark.parametrize("p", [1, 2, 3, 4, 5, 6, 7, 8, 12, 13, 64])
def test_choose_grid_is_near_square(p):
    pr, pc = choose_grid(p)
    assert pr * pc == p and pr >= pc
    # no factorisation is closer to square
    assert all(not (p % c == 0 and pc < c <= p // c) for c in range(1, p + 1))


@pytest.mark.parametrize("text,expect", [("2x3", (2, 3)), ("1X6", (1, 6)), ("4×1", (4, 1))])
def test_parse_grid(text, expect):
    assert parse_grid(text) == expect


@pytest.mark.parametrize("text", ["2", "2x", "x3", "axb", "0x4", "2x-1", "2x3x1"])
def test_parse_grid_rejects(text):
    with pytest.raises(ValueError, match="grid"):
        parse_grid(text)


def _check(grid, comm):
    pr, pc = grid.shape
    assert pr * pc == comm.Get_size()
    assert grid.rank == comm.Get_rank(), "rank order must be preserved"
    assert (grid.row, grid.col) == (comm.Get_rank() // pc, comm.Get_rank() % pc)
    assert grid.row_comm.Get_size() == pc and grid.row_comm.Get_rank() == grid.col
    assert grid.col_comm.Get_size() == pr and grid.col_comm.Get_rank() == grid.row
    # the row communicator really holds this grid row
    assert grid.row_comm.allgather(grid.row) == [grid.row] * pc
    assert grid.col_comm.allgather(grid.col) == [grid.col] * pr
    assert 0 <= grid.local_rank < grid.local_size


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dims", ["auto", "row", "col"])
def test_grid_shapes(comm, dims):
    p = comm.Get_size()
    shape = {"auto": None, "row": (1, p), "col": (p, 1)}[dims]
    with ProcessGrid(comm, shape) as grid:
        _check(grid, comm)
        if shape:
            assert grid.shape == shape


@pytest.mark.mpi(min_size=1)
def test_grid_from_string_and_free_twice(comm):
    grid = ProcessGrid(comm, f"{comm.Get_size()}x1")
    _check(grid, comm)
    grid.free()
    grid.free()
    assert grid.comm is None


@pytest.mark.mpi(min_size=1)
def test_grid_mismatch_raises_on_every_rank(comm):
    p = comm.Get_size()
    verb = "was" if p == 1 else "were"
    with pytest.raises(ValueError, match=f"needs {2 * p} ranks, but {p} {verb} started"):
        ProcessGrid(comm, (2, p))
    with pytest.raises(ValueError, match=">= 1"):
        ProcessGrid(comm, (0, p))


@pytest.mark.mpi(min_size=1)
def test_device_index_cycles_over_devices(comm):
    with ProcessGrid(comm) as grid:
        assert grid.device_index(1) == 0
        assert grid.device_index(grid.local_size + 1) == grid.local_rank
        with pytest.raises(ValueError):
            grid.device_index(0)


@pytest.mark.mpi(min_size=1)
def test_a_node_is_named_by_its_first_rank(comm):
    """The node of a rank is named by its first rank, as MPI groups ranks that
    share memory (as for the GPU binding), not by hostname."""
    from summa.distribution.grid import node_of, node_rank
    leaders = comm.allgather(node_of(comm)[2])
    mine = leaders[comm.rank]
    assert leaders.count(mine) == node_rank(comm)[1] == node_of(comm)[1]
    assert leaders[mine] == mine and mine <= comm.rank  # the node's first rank names it
    # numbered in the communicator given: with the ranks reversed, the node's last
    reversed_ranks = comm.Split(0, comm.Get_size() - comm.rank)
    try:
        old_rank_of_leader = reversed_ranks.allgather(comm.rank)[node_of(reversed_ranks)[2]]
        assert old_rank_of_leader == max(r for r, n in enumerate(leaders) if n == mine)
    finally:
        reversed_ranks.Free()


@pytest.mark.mpi(min_size=2)
def test_within_nodes_per_direction_and_remembered(comm):
    p = comm.Get_size()
    with ProcessGrid(comm, (p, 1)) as grid:
        assert grid.within_nodes() == (True, True)  # every rank on this machine
    with ProcessGrid(comm, (p, 1)) as grid:
        grid.node = 100 + grid.row  # one rank per node: the column spans nodes
        assert grid.within_nodes() == (True, False)
        grid.node = 100  # asked once per grid: the answer is kept
        assert grid.within_nodes() == (True, False)


@pytest.mark.parametrize("p", [1, 2, 3, 4, 6, 8, 12])
@pytest.mark.parametrize("m, n", [(100, 100), (400, 100), (100, 400), (1000, 7), (5, 5000)])
def test_choose_grid_by_shape_receives_the_fewest_panel_elements(p, m, n):
    grids = [(r, p // r) for r in range(1, p + 1) if p % r == 0]
    volume = {g: m / g[0] + n / g[1] for g in grids}  # per rank, in units of k
    for tall in (False, True):
        pr, pc = choose_grid(p, m, n, tall)
        assert pr * pc == p
        assert volume[(pr, pc)] == pytest.approx(min(volume.values()))


@pytest.mark.parametrize("p", [2, 6, 8, 12])
def test_choose_grid_square_product_is_near_square_taller_blocks_when_asked(p):
    assert choose_grid(p, 500, 500) == choose_grid(p)
    pr, pc = choose_grid(p)
    assert choose_grid(p, 500, 500, tall=True) == (pc, pr)


def test_choose_grid_by_shape_cuts_the_long_side():
    assert choose_grid(4, 4000, 1000) == (4, 1)
    assert choose_grid(4, 1000, 4000) == (1, 4)
    assert choose_grid(8, 2000, 1000) == (4, 2)


def test_grid_for_float64_on_gpus_strips_and_cpus():
    from summa.distribution.grid import grid_for
    assert grid_for(2, 64, 64, "cupy", "float64") == (1, 2)
    assert grid_for(2, 64, 64, "cupy", "float32") == (2, 1)
    assert grid_for(2, 64, 64, "numpy", "float64") == (2, 1)
    assert grid_for(4, 64, 64, "cupy", "float64", "strips") == (4, 1)


@pytest.mark.parametrize("p", [1, 6, 7, 12])
def test_grid_shapes_are_every_factorisation_fewest_rows_first(p):
    from summa.distribution.grid import grid_shapes
    shapes = grid_shapes(p)
    assert all(r * c == p for r, c in shapes)
    assert [r for r, _ in shapes] == [d for d in range(1, p + 1) if p % d == 0]


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or (os.cpu_count() or 1) < 2,
                    reason="needs affinity and two cores")
def test_a_rank_bound_to_one_core_of_several_is_warned_and_copies_on_one_thread():
    from mpi4py import MPI

    from summa.device import staging
    before = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {min(before)})
        cores, sharing, note = core_share(MPI.COMM_SELF)
        assert (cores, sharing) == (1, 1)
        assert "--bind-to none" in note and "1 of its node's" in note
        with ProcessGrid(MPI.COMM_SELF) as grid:
            assert grid.core_note == note
        assert staging.copy_threads(sharing) == 1
    finally:
        os.sched_setaffinity(0, before)
    assert core_share(MPI.COMM_SELF)[2] is None  # all its cores again: nothing to say


def test_pool_launcher_unbinds_open_mpi_ranks_only_where_nothing_was_said(monkeypatch):
    from mpi4py import MPI

    from summa.pool import launch
    monkeypatch.setattr(MPI, "Get_library_version", lambda: "Open MPI v4.1.6")
    assert launch._unbound(["mpirun", "-n", "2"]) == ["mpirun", "--bind-to", "none", "-n", "2"]
    assert launch._unbound(["mpirun", "--bind-to", "socket"]) == ["mpirun", "--bind-to", "socket"]
    monkeypatch.setattr(MPI, "Get_library_version", lambda: "MPICH Version: 4.2")
    assert launch._unbound(["mpiexec"]) == ["mpiexec"]


def test_grid_ranks_message_agrees_in_number():
    with pytest.raises(ValueError, match="^grid 3x3 needs 9 ranks, but 1 was started$"):
        check_grid_ranks((3, 3), 1)
    with pytest.raises(ValueError, match="^grid 3x1 needs 3 ranks, but 2 were started$"):
        check_grid_ranks((3, 1), 2)
    check_grid_ranks((2, 2), 4)
