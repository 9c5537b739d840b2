"""Node-shared host arrays (summa/host/shared.py) and summa.matmul on them: one copy
of the data per node, every rank reading its block where it lies."""

import os
import subprocess
import sys

import numpy as np
import pytest
from mpi4py import MPI

import summa
from helpers import gemm_scaled_error, random_array, spy_out_of_core
from summa.host import shared as host
from summa.runtime import cleanup


@pytest.mark.mpi(min_size=1)
def test_a_node_shared_array_is_one_memory_on_every_rank(comm):
    x = host.empty((comm.Get_size() * 3, 5), "float64", comm)
    assert host.shared_token(x) is not None
    assert len(set(comm.allgather(host.shared_token(x)))) == 1  # one node here
    x[3 * comm.rank:3 * comm.rank + 3] = comm.rank + 0.5
    comm.Barrier()
    expect = np.repeat(np.arange(comm.Get_size()) + 0.5, 3)[:, None] * np.ones(5)
    assert np.array_equal(np.asarray(x), expect)
    assert host.shared_token(np.ones(3)) is None


@pytest.mark.mpi(min_size=1)
def test_matmul_of_node_shared_arrays_copies_nothing(comm, rng, monkeypatch):
    seen = spy_out_of_core(monkeypatch)
    a = host.empty((37, 23), "float64", comm)
    b = host.empty((23, 29), "float64", comm)
    out = host.empty((37, 29), "float64", comm)
    if comm.rank == 0:
        a[...] = random_array(rng, a.shape, "float64")
        b[...] = random_array(rng, b.shape, "float64")
    comm.Barrier()
    c = summa.matmul(a, b, out=out, out_of_core=True, panel_width=4)
    (A, B, C), = seen
    assert np.shares_memory(A, a) and np.shares_memory(B, b) and np.shares_memory(C, out)
    if comm.rank == 0:
        assert c is out and gemm_scaled_error(c, np.asarray(a), np.asarray(b)) <= 1


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("in_place", ["1", "0"])
@pytest.mark.parametrize("trans_a", ["N", "T"])
def test_arrays_on_the_root_are_read_in_place_or_through_one_node_shared_copy(
        comm, rng, monkeypatch, trans_a, in_place):
    from summa.host import remote
    monkeypatch.setenv("SUMMA_IN_PLACE", in_place)
    seen = spy_out_of_core(monkeypatch)
    a = random_array(rng, (31, 26) if trans_a == "N" else (26, 31), "float32")
    b = random_array(rng, (26, 19), "float32")
    root = comm.Get_size() - 1
    mine = comm.rank == root
    c = summa.matmul(a if mine else None, b if mine else None, root=root, trans_a=trans_a,
                     out_of_core=True, panel_width=8)
    (A, B, C), = seen
    if comm.Get_size() > 1 and _ranks_read_each_other(comm):
        # where the root's A lies, whatever its op: itself there, a stand-in
        # for it on the others (op T: its rows, by columns of op(A), as they lie)
        assert np.shares_memory(A, a) if mine else \
            remote.find(A if trans_a == "N" else A.T) is not None
        assert np.shares_memory(C, c) if mine else remote.find(C) is not None
    elif comm.Get_size() > 1:  # views into shared copies, not the root's arrays
        assert A.base is not None and not np.shares_memory(A, a) and remote.find(A) is None
    if mine:
        assert gemm_scaled_error(c, a, b, trans_a=trans_a) <= 1
    else:
        assert c is None


@pytest.mark.mpi(min_size=1)
def test_without_room_to_share_the_blocks_travel_by_mpi(comm, rng, monkeypatch, folder):
    monkeypatch.setenv("SUMMA_SHM_DIR", str(folder / "no such folder"))
    a, b = random_array(rng, (20, 11), "float64"), random_array(rng, (11, 13), "float64")
    c = summa.matmul(a if comm.rank == 0 else None, b if comm.rank == 0 else None,
                     out_of_core=True, panel_width=4)
    if comm.rank == 0:
        assert gemm_scaled_error(c, a, b) <= 1
    with pytest.raises(ValueError, match="node-shared"):
        host.empty((4, 4), "float64", comm)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("fortran", [False, True])
def test_load_reads_a_file_into_a_node_shared_array(comm, rng, folder, fortran):
    data = random_array(rng, (41, 17), "complex64")
    path = f"{folder}/x.npy"
    if comm.rank == 0:
        np.save(path, np.asfortranarray(data) if fortran else data)
    comm.Barrier()
    x = host.load(path, comm)
    assert host.shared_token(x) is not None and np.array_equal(np.asarray(x), data)
    with pytest.raises(ValueError):
        host.load(f"{folder}/missing.npy", comm)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("how", ["no peer access", "asked"])
def test_every_rank_uploads_its_own_parts_where_gpus_cannot_read_each_other(comm, rng,
                                                                            monkeypatch, how):
    # GeForce cards over PCIe: forwarding a panel from its owner's GPU would cross the
    # host again, so each rank fetches its own parts from the node-shared arrays.
    kwargs = {}
    if how == "no peer access":
        monkeypatch.setenv("SUMMA_PEER_ACCESS", "0")
    else:
        kwargs["broadcaster"] = "host"
    a, b = random_array(rng, (45, 33), "float64"), random_array(rng, (33, 27), "float64")
    stats = summa.SummaStats()
    c = summa.matmul(a if comm.rank == 0 else None, b if comm.rank == 0 else None,
                     out_of_core=True, panel_width=5, stats=stats, **kwargs)
    if comm.Get_size() > 1:
        assert "own uploads" in stats.comm
    if comm.rank == 0:
        assert gemm_scaled_error(c, a, b) <= 1


@pytest.mark.mpi(min_size=2)
def test_own_uploads_without_node_shared_operands_are_refused_on_every_rank(comm, rng,
                                                                           monkeypatch, folder):
    monkeypatch.setenv("SUMMA_SHM_DIR", str(folder / "no such folder"))
    a = random_array(rng, (8, 8), "float64")
    if _ranks_read_each_other(comm):  # read in place where the root holds it: no copy needed
        c = summa.matmul(a if comm.rank == 0 else None, a if comm.rank == 0 else None,
                         out_of_core=True, broadcaster="host")
        assert comm.rank != 0 or gemm_scaled_error(c, a, a) <= 1
    monkeypatch.setenv("SUMMA_IN_PLACE", "0")
    with pytest.raises(ValueError, match="node-shared"):
        summa.matmul(a if comm.rank == 0 else None, a if comm.rank == 0 else None,
                     out_of_core=True, broadcaster="host")


@pytest.mark.mpi(min_size=2)
def test_peer_access_asks_cuda_about_every_gpu_of_the_row_and_column(comm, monkeypatch):
    import types
    from summa.planning.selection import peer_access
    monkeypatch.delenv("SUMMA_PEER_ACCESS", raising=False)
    asked = []

    def backend(can):
        def query(me, other):
            asked.append((me, other))
            return can
        runtime = types.SimpleNamespace(deviceCanAccessPeer=query)
        return types.SimpleNamespace(name="cupy", is_gpu=True, device=comm.rank,
                                     xp=types.SimpleNamespace(cuda=types.SimpleNamespace(
                                         runtime=runtime)))
    with summa.ProcessGrid(comm) as grid:
        assert peer_access(grid, backend(1)) is True
        assert asked and all(me == comm.rank and other != me for me, other in asked)
        assert peer_access(grid, backend(0)) is False


@pytest.mark.mpi(min_size=1)
def test_arrays_whose_product_the_host_cannot_hold_are_refused_on_every_rank(comm, rng,
                                                                             monkeypatch):
    from summa.planning import memorycheck
    monkeypatch.setattr(memorycheck, "host_memory_total", lambda: 1 << 20)  # a 1 MiB node
    a = random_array(rng, (300, 300), "float64")
    with pytest.raises(ValueError, match="host memory"):
        summa.matmul(a if comm.rank == 0 else None, a if comm.rank == 0 else None,
                     out_of_core=True)



@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("contiguous", [True, False])
def test_the_roots_out_is_written_in_place_or_through_a_copy(comm, rng, contiguous):
    # out C-contiguous: every rank writes its block into the root's out itself;
    # a slice of columns of a wider array: through a node-shared product, copied.
    a = random_array(rng, (21, 17), "float64")
    b = random_array(rng, (17, 13), "float64")
    mine = comm.rank == 0
    wide = np.full((21, 20), np.nan)
    out = (np.full((21, 13), np.nan) if contiguous else wide[:, 3:16]) if mine else None
    c = summa.matmul(a if mine else None, b if mine else None, out=out, out_of_core=True,
                     panel_width=4)
    if mine:
        assert c is out and gemm_scaled_error(c, a, b) <= 1
        assert contiguous or (np.isnan(wide[:, :3]).all() and np.isnan(wide[:, 16:]).all())
    else:
        assert c is None


def _ranks_read_each_other(comm) -> bool:
    """May every rank read rank 0's memory here (summa.host.remote; a sandbox may
    refuse)? Collective."""
    import os

    from summa.host import remote
    probe = np.zeros(8)
    if comm.rank == 0:
        remote.allow_readers(os.getppid())
    where = comm.bcast(remote.describe(probe) if comm.rank == 0 else None, root=0)
    ok = remote.allowed() and where is not None and (comm.rank == 0 or remote.readable(where))
    ok = comm.allreduce(ok, op=MPI.LAND)
    comm.Barrier()  # rank 0's probe is read before it goes
    return ok


@pytest.mark.parametrize("kind", ["named", "node-shared"])
def test_a_hard_exit_leaves_no_shared_file(tmp_path, kind):
    """A process ended abruptly (a signal, the watchdog: cleanup.hard_exit)
    while a shared file of its own lives leaves nothing in SUMMA_SHM_DIR: a
    named array's file (removed when collected), or a node-shared array's
    caught before all ranks have mapped it (here: at its barrier)."""
    script = f"""
import os
import summa.host.shared as shared
from mpi4py import MPI
from summa.runtime.cleanup import hard_exit
if {kind!r} == "named":
    keep = shared.named((1000,), "float64")
    assert len(os.listdir({str(tmp_path)!r})) == 1
    hard_exit(3)
class Node:  # its barrier is where the process ends
    def Get_rank(self): return 0
    def bcast(self, x, root=0): return x
    def Barrier(self):
        assert len(os.listdir({str(tmp_path)!r})) == 1
        hard_exit(3)
class Topology:
    node_comm, leader, local_rank = Node(), 0, 0
shared.empty((1000,), "float64", MPI.COMM_SELF, Topology())
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env={**os.environ, "SUMMA_SHM_DIR": str(tmp_path)}, timeout=60)
    assert proc.returncode == 3, proc.stderr
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("where", ["_new_file", "memmap", "finalize"])
def test_a_ctrl_c_while_a_named_array_is_made_leaves_no_file(monkeypatch, where):
    """KeyboardInterrupt at each step of :func:`summa.host.shared.named`
    (the pool's caller makes its copies outside the pool's wait) goes on to
    the caller, and the file goes at once, or, where it came as the file's
    making returned, at the process's exit (test_pool's Ctrl-C test once
    found one left in /dev/shm: it landed as the finalizer was being set)."""
    before = set(os.listdir(host.shm_dir()))
    real = {"_new_file": host._new_file, "memmap": np.memmap, "finalize": host.finalize}[where]

    def interrupted(*args, **kwargs):
        if where != "finalize":  # the step done, the signal comes as it returns
            real(*args, **kwargs)
        raise KeyboardInterrupt

    if where == "memmap":
        monkeypatch.setattr(host.np, "memmap", interrupted)
    else:
        monkeypatch.setattr(host, where, interrupted)
    with pytest.raises(KeyboardInterrupt):
        host.named((64, 64), np.float64)
    monkeypatch.undo()
    left = {os.path.join(host.shm_dir(), n) for n in set(os.listdir(host.shm_dir())) - before}
    if where == "_new_file":
        assert len(left) == 1 and left <= cleanup.temporary_files  # the exit removes it
        cleanup.remove_temporary_files()
    else:
        assert left == set()


def test_a_temporary_file_no_one_took_goes_when_the_process_exits(tmp_path):
    """A file made by :func:`summa.runtime.cleanup.new_temporary_file` and
    never handed on (the window between its making and its owner) is removed
    by a normal exit, and not by a forked child's."""
    script = (
        "import os, sys\n"
        "from summa.runtime.cleanup import new_temporary_file\n"
        "fd, path = new_temporary_file(sys.argv[1], 'left-', '.tmp')\n"
        "os.close(fd)\n"
        "if os.fork() == 0:\n"
        "    sys.exit(0)  # a forked child's exit: the parent's file stays\n"
        "os.wait()\n"
        "print(os.path.exists(path), path)\n")
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(summa.__file__)))
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    alive, path = done.stdout.split()
    assert alive == "True" and not os.path.exists(path)
