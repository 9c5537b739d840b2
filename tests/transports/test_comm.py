"""Broadcasters and chunked transfers, including the > 2**31 path on small data."""

import numpy as np
import pytest
from mpi4py import MPI

import summa.transports.broadcasters as broadcasters
import summa.transports.comm as comm_mod
from summa.transports.broadcasters import make_broadcaster
from summa.transports.comm import HostStagedBroadcaster, chunks, recv_array, send_array


def test_chunks_cover_exactly():
    assert list(chunks(0, 4)) == []
    assert list(chunks(10, 4)) == [(0, 4), (4, 8), (8, 10)]
    assert list(chunks(8, 4)) == [(0, 4), (4, 8)]


@pytest.fixture
def tiny_chunks(monkeypatch):
    """Messages of at most 7 bytes: every buffer takes the chunked path."""
    monkeypatch.setattr(comm_mod, "CHUNK_BYTES", 7)


def modes(backend):
    """Broadcasters this machine can run for `backend` (NCCL only with a GPU per rank)."""
    from mpi4py import MPI
    found = ["mpi"]
    if backend.name == "cupy":
        ids = MPI.COMM_WORLD.allgather((MPI.Get_processor_name(), backend.device_id()))
        if len(set(ids)) == len(ids) and comm_mod.nccl_available()[0]:
            found.append("nccl")
        if len({host for host, _ in ids}) == 1:
            found.append("ipc")
    return found


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("lower", [False, True])
@pytest.mark.parametrize("mode", ["mpi", "nccl", "ipc"])
def test_ibcast_from_every_root(comm, backend, rng, lower, mode, request):
    if mode not in modes(backend):
        pytest.skip(f"{mode} broadcasts are not available here")
    if lower:
        request.getfixturevalue("tiny_chunks")
    bc = make_broadcaster(mode, comm, backend)
    assert bc.name == mode
    data = comm.bcast(rng.uniform(-1, 1, (5, 9)), root=0)
    for root in range(comm.Get_size()):
        for slot, dtype in enumerate((np.float64, np.complex64)):
            expect = (data * (root + 1)).astype(dtype)
            buf = backend.asarray(expect.copy() if comm.rank == root else np.zeros_like(expect))
            handle = bc.ibcast(buf, root, slot)
            handle.wait()
            handle.wait()  # idempotent
            assert np.array_equal(backend.to_host(buf), expect)
    bc.free()


@pytest.mark.mpi(min_size=2)
def test_send_recv_chunked(comm, rng, tiny_chunks):
    data = comm.bcast(rng.uniform(-1, 1, 50), root=0)
    if comm.rank == 0:
        MPI.Request.Waitall(send_array(comm, data, 1, tag=3))
    elif comm.rank == 1:
        got = np.zeros(50)
        reqs = recv_array(comm, got, 0, tag=3)
        assert len(reqs) == -(-50 * 8 // 7)
        MPI.Request.Waitall(reqs)
        assert np.array_equal(got, data)


@pytest.mark.mpi(min_size=1)
def test_matmul_with_tiny_chunks_is_unchanged(comm, backend, tiny_chunks):
    from summa import DistMatrix, ProcessGrid, matmul
    with ProcessGrid(comm) as grid:
        A = DistMatrix.random((17, 9), "complex128", grid, backend, seed=1)
        B = DistMatrix.random((9, 13), "complex128", grid, backend, seed=2)
        chunked = matmul(A, B, panel_width=2).gather()
        a, b = A.gather(), B.gather()
        scattered = DistMatrix.from_global(a, grid, backend)
        back = scattered.gather()
    if comm.rank == 0:
        assert np.array_equal(back, a)
        np.testing.assert_allclose(chunked, a @ b, rtol=1e-12, atol=1e-12)


def test_non_contiguous_buffer_is_refused():
    with pytest.raises(ValueError, match="contiguous"):
        send_array(MPI.COMM_SELF, np.zeros((4, 4))[:, :2], 0)


def test_unknown_mode():
    with pytest.raises(ValueError, match="communication mode"):
        make_broadcaster("nope", MPI.COMM_SELF, None)


class _FakeGpuBackend:
    name = "cupy"
    is_gpu = supports_ipc = True


@pytest.mark.parametrize("nccl,aware,expect", [
    (True, True, "nccl"), (True, False, "nccl"), (False, True, "cuda-aware"), (False, False, "mpi")])
def test_auto_selection_order(monkeypatch, nccl, aware, expect):
    monkeypatch.setattr(comm_mod, "nccl_available", lambda: (nccl, "test"))
    monkeypatch.setattr(comm_mod, "mpi_cuda_aware", lambda: (aware, "test"))
    assert comm_mod.choose_comm("auto", _FakeGpuBackend()) == expect
    assert comm_mod.choose_comm("mpi", _FakeGpuBackend()) == "mpi"


def test_explicit_modes_are_refused_when_unavailable(monkeypatch):
    monkeypatch.setattr(comm_mod, "nccl_available", lambda: (False, "no nccl here"))
    monkeypatch.setattr(comm_mod, "mpi_cuda_aware", lambda: (False, "no cuda support"))
    with pytest.raises(ValueError, match="no nccl here"):
        comm_mod.choose_comm("nccl", _FakeGpuBackend())
    with pytest.raises(ValueError, match="no cuda support"):
        comm_mod.choose_comm("cuda-aware", _FakeGpuBackend())


def test_numpy_backend_always_uses_host_mpi():
    from summa.device.backend import NumpyBackend
    assert comm_mod.choose_comm("auto", NumpyBackend()) == "mpi"
    for kind in ("nccl", "cuda-aware", "ipc"):
        with pytest.raises(ValueError, match="needs the cupy backend"):
            comm_mod.choose_comm(kind, NumpyBackend())


@pytest.mark.parametrize("value,expect", [("0", False), ("1", True)])
def test_cuda_awareness_override(monkeypatch, value, expect):
    monkeypatch.setenv("SUMMA_CUDA_AWARE", value)
    assert comm_mod.mpi_cuda_aware() == (expect, "SUMMA_CUDA_AWARE")


def test_cuda_awareness_is_asked_not_tried(monkeypatch):
    monkeypatch.delenv("SUMMA_CUDA_AWARE", raising=False)
    answer, how = comm_mod.mpi_cuda_aware()
    assert isinstance(answer, bool) and how  # on the CI machine's MPICH: False, from the library


@pytest.mark.mpi(min_size=2)
def test_self_test_detects_a_broken_broadcaster(comm, backend):
    class Broken(HostStagedBroadcaster):
        def ibcast(self, buf, root, slot=0):
            handle = super().ibcast(buf, root, slot)
            handle.wait()
            if self.comm.Get_rank() == self.comm.Get_size() - 1 != root:
                buf[0] += 1  # corrupt one receiver's copy
            return handle
    good = make_broadcaster("mpi", comm, backend, check=True)
    good.free()
    with pytest.raises(RuntimeError, match="self-test failed on ranks"):
        broadcasters.self_test(Broken(comm, backend), backend)


@pytest.mark.mpi(min_size=2)
def test_a_broadcaster_failing_its_self_test_is_freed(comm, backend, monkeypatch):
    freed = []

    class Broken(HostStagedBroadcaster):
        def ibcast(self, buf, root, slot=0):
            handle = super().ibcast(buf, root, slot)
            handle.wait()
            if self.comm.Get_rank() != root:
                buf[0] += 1
            return handle

        def free(self):
            freed.append(True)
            super().free()
    monkeypatch.setitem(broadcasters.BROADCASTERS, "mpi", Broken)
    with pytest.raises(RuntimeError, match="self-test failed"):
        make_broadcaster("mpi", comm, backend, check=True)
    assert freed == [True]


@pytest.mark.mpi(min_size=2)
def test_held_blocks_are_dropped_once_every_peer_closed_them_without_a_wait(comm):
    """ipc's free drops the blocks its peers kept open once each has closed them
    (a barrier each posts); a peer that comes later than the grace, as one
    stopped by an error would, leaves them held, not this rank waiting, until a
    later call finds that it came."""
    import time

    from summa.transports import ipc
    block = object()
    ipc.release_held(comm, {b"handle": block}, grace=30)  # every rank at once
    assert ipc._held_for_late_peers == []
    start = time.monotonic()
    if comm.rank == 0:
        ipc.release_held(comm, {b"handle": block}, grace=0.05)  # the others come later
        assert time.monotonic() - start < 0.4
        assert [held for _, held in ipc._held_for_late_peers] == [{b"handle": block}]
    else:
        time.sleep(0.5)
        ipc.release_held(comm, {}, grace=30)
    comm.Barrier()  # every rank has posted its barrier of the second round
    deadline = time.monotonic() + 10
    while ipc._held_for_late_peers and time.monotonic() < deadline:
        ipc.reap_held()  # each call tests the barrier (MPI progresses it)
        time.sleep(0.01)
    assert ipc._held_for_late_peers == []
