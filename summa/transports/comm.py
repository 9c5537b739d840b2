"""Panel broadcasters and chunked point-to-point transfers.

A broadcaster moves one panel from a root to every rank of a grid row or grid
column. All of them share one nonblocking interface, ``ibcast(buf, root)``,
whose handle's ``wait()`` orders this rank's later work after the broadcast:
MPI broadcasters block the host until `buf` holds the root's data, the NCCL
broadcaster makes the compute stream wait on the GPU. The SUMMA loop overlaps
those broadcasts with GEMMs (lookahead).

Buffers travel as raw bytes in chunks of at most :data:`CHUNK_BYTES`, so a
message never exceeds the 2**31-1 count limit of MPI libraries without
large-count support.
"""

from __future__ import annotations

import ctypes
import os
import time

from ..runtime.mpi import MPI
import numpy as np

from .. import options

__all__ = ["CHUNK_BYTES", "HostStagedBroadcaster", "NcclBroadcaster", "CudaAwareBroadcaster",
           "BROADCASTER_NAMES", "choose_comm", "mpi_cuda_aware", "nccl_available",
           "send_array", "recv_array", "chunks", "Pending", "DevicePending", "DeviceTimed"]

#: Largest message in bytes. Module-level so tests can lower it to exercise
#: the chunked path on small data.
CHUNK_BYTES = 2**31 - 1


def chunks(nbytes: int, limit: int | None = None):
    """Yield ``(start, stop)`` byte ranges covering `nbytes` in pieces <= `limit`."""
    limit = CHUNK_BYTES if limit is None else limit
    if nbytes == 0:
        return
    for start in range(0, nbytes, limit):
        yield start, min(start + limit, nbytes)


def _as_bytes(buf):
    """A flat uint8 view of a C-contiguous NumPy or CuPy array."""
    if not buf.flags.c_contiguous:
        raise ValueError("communication buffers must be C-contiguous")
    return buf.reshape(-1).view(np.uint8)


def send_array(comm: MPI.Comm, buf: np.ndarray, dest: int, tag: int = 0) -> list:
    """Post nonblocking sends of host array `buf` in chunks; return the requests."""
    raw = _as_bytes(buf)
    return [comm.Isend([raw[a:b], MPI.BYTE], dest, tag) for a, b in chunks(raw.size)]


def recv_array(comm: MPI.Comm, buf: np.ndarray, source: int, tag: int = 0) -> list:
    """Post nonblocking receives into host array `buf` in chunks; return the requests."""
    raw = _as_bytes(buf)
    return [comm.Irecv([raw[a:b], MPI.BYTE], source, tag) for a, b in chunks(raw.size)]


def _ibcast_bytes(comm: MPI.Comm, raw, root: int) -> list:
    """Post nonblocking broadcasts of the flat byte buffer `raw` in chunks."""
    return [comm.Ibcast([raw[a:b], MPI.BYTE], root) for a, b in chunks(raw.size)]


class _HostTimed:
    """Accumulates the host seconds spent in a broadcaster's calls."""

    _seconds = 0.0

    def take_seconds(self) -> float:
        """Seconds spent in broadcasts since the last call."""
        seconds, self._seconds = self._seconds, 0.0
        return seconds


class Pending:
    """Handle of a started host (MPI) broadcast; ``wait()`` completes it exactly once.

    Parameters
    ----------
    requests : list of MPI.Request or None
        The broadcast's requests; None for a broadcast with nothing to wait for.
    finish : callable, optional
        Run once after the requests complete (e.g. copy staged data out).
    owner : broadcaster, optional
        Whose communication time the wait adds to.
    """

    def __init__(self, requests, finish=None, owner: _HostTimed | None = None):
        self._requests, self._finish, self._owner = requests, finish, owner

    def wait(self) -> None:
        if self._requests is None:
            return
        t0 = time.perf_counter()
        MPI.Request.Waitall(self._requests)
        if self._finish is not None:
            self._finish()
        if self._owner is not None:
            self._owner._seconds += time.perf_counter() - t0
        self._requests = self._finish = None

    #: Completing a send whose buffer is never rewritten: the same as wait().
    settle = wait


class HostStagedBroadcaster(_HostTimed):
    """Broadcast through MPI from host memory.

    NumPy buffers go to MPI as they are. CuPy buffers are staged: the root copies
    the panel to a pinned host buffer, MPI broadcasts it, receivers copy it back
    to the GPU. Staging buffers are kept per slot and grow only when needed.

    Parameters
    ----------
    comm : MPI.Intracomm
        The grid row or column communicator.
    backend : Backend
        Where panels live.
    """

    name = "mpi"

    def __init__(self, comm: MPI.Intracomm, backend):
        self.comm, self.backend = comm, backend
        self._staging: dict[int, np.ndarray] = {}
        self._copies: dict[int, object] = {}  # slot -> event of its last host-to-device copy
        self._side = None  # stream for copying out a root's own block
        # Slots whose broadcast has started but not been waited for. Two
        # broadcasts in flight through one slot would share its staging buffer
        # (column strips once did that, one slot for all the ranks' pieces of
        # a strip, and products came out wrong): refused, on the CPU too.
        self._inflight: set = set()

    def _side_stream(self):
        if self._side is None:
            import cupy
            self._side = cupy.cuda.Stream(non_blocking=True)
        return self._side

    def _stage(self, slot: int, nbytes: int) -> np.ndarray:
        # The copy out of this staging buffer may still be queued on the GPU:
        # wait for it before MPI overwrites the buffer.
        copied = self._copies.pop(slot, None)
        if copied is not None:
            copied.synchronize()
        buf = self._staging.get(slot)
        if buf is None or buf.size < nbytes:
            buf = self.backend.host_buffer(nbytes)
            self._staging[slot] = buf
        return buf[:nbytes]

    def ibcast(self, buf, root: int, slot: int = 0, ready=None, own: bool = False) -> Pending:
        """Start broadcasting `buf` from `root`; return a handle to ``wait()`` on.

        `ready`, a CUDA event, is recorded where the root's `buf` is filled
        outside the compute stream (out-of-core uploads, or the operands'
        values before a multiply); None otherwise. `own` (on the root): `buf`
        is the root's stored block, which nothing writes during the multiply,
        so device broadcasters wait for `ready` only, not for the GEMMs queued
        so far. (This one stages through the host and ignores it.)
        """
        if self.comm.Get_size() == 1:
            return Pending(None)
        if slot in self._inflight:
            raise RuntimeError(f"host-staged broadcast into slot {slot!r}, whose last "
                               "broadcast has not been waited for")
        t0 = time.perf_counter()
        if not self.backend.is_gpu:
            raw = _as_bytes(buf)
            reqs = _ibcast_bytes(self.comm, raw, root)
            self._seconds += time.perf_counter() - t0
            self._inflight.add(slot)
            return Pending(reqs, lambda: self._inflight.discard(slot), owner=self)
        host = self._stage(slot, buf.nbytes)
        is_root = self.comm.Get_rank() == root
        if is_root:
            if ready is not None:
                ready.synchronize()
            # get() synchronizes the stream, so MPI reads finished data; a root's
            # own block is copied on a side stream, not after the GEMMs queued.
            _as_bytes(buf).get(out=host, stream=self._side_stream() if own else None)
        reqs = _ibcast_bytes(self.comm, host, root)
        self._seconds += time.perf_counter() - t0

        self._inflight.add(slot)

        def finish():
            self._inflight.discard(slot)
            if not is_root:
                _as_bytes(buf).set(host)
                self._copies[slot] = self.backend.record_event()
        return Pending(reqs, finish, owner=self)

    def free(self) -> None:
        for event in self._copies.values():
            event.synchronize()
        self._copies.clear()
        self._staging.clear()
        self._inflight.clear()


class DeviceTimed:
    """Mixin for GPU broadcasters: accumulates the device time of their work on
    their own ``stream`` (subclasses set ``stream`` and ``_timings``)."""

    def _time(self, begin, end) -> None:
        self._timings.append((begin, end))

    def take_seconds(self) -> float:
        """Device seconds of the broadcasts since the last call (synchronizes)."""
        import cupy
        self.stream.synchronize()
        seconds = sum(cupy.cuda.get_elapsed_time(a, b) for a, b in self._timings) / 1e3
        self._timings = []
        return seconds


class DevicePending:
    """Handle of a broadcast queued on a communication stream.

    ``wait()`` makes the compute (current) stream wait for it, without
    blocking the host.

    Parameters
    ----------
    done : cupy.cuda.Event or None
        Recorded on the communication stream after the broadcast.
    """

    def __init__(self, done):
        self._done = done

    def wait(self) -> None:
        if self._done is not None:
            import cupy
            cupy.cuda.get_current_stream().wait_event(self._done)
            self._done = None

    def settle(self) -> None:
        """Complete a send from a buffer that is never rewritten (a root's own
        block): nothing to do on the host, and no stream has to wait for it;
        the multiply's final synchronize covers it."""
        self._done = None


class NcclBroadcaster(DeviceTimed):
    """Broadcast CuPy buffers with NCCL on a stream of its own.

    The NCCL communicator spans the ranks of `comm`; its id travels over `comm`.
    A broadcast first waits (on the GPU) for everything already queued on the
    compute stream, which covers both the root filling the buffer and earlier
    GEMMs still reading it (a root sending its own block waits only for the
    operands' values); the handle then orders later GEMMs after it.
    """

    name = "nccl"

    def __init__(self, comm: MPI.Intracomm, backend):
        import cupy
        from cupy.cuda import nccl
        if not backend.is_gpu:
            raise ValueError("the nccl broadcaster needs the cupy backend")
        self.comm, self.backend = comm, backend
        self._nccl = None
        self._timings = []
        self.stream = cupy.cuda.Stream(non_blocking=True)
        if comm.Get_size() > 1:
            uid = nccl.get_unique_id() if comm.Get_rank() == 0 else None
            uid = comm.bcast(uid, root=0)
            self._nccl = nccl.NcclCommunicator(comm.Get_size(), uid, comm.Get_rank())

    def ibcast(self, buf, root: int, slot: int = 0, ready=None, own: bool = False):
        if self._nccl is None:
            return Pending(None)
        import cupy
        from cupy.cuda import nccl
        if not (own and self.comm.Get_rank() == root):  # see HostStagedBroadcaster.ibcast
            self.stream.wait_event(self.backend.record_event())
        if ready is not None:
            self.stream.wait_event(ready)
        begin = cupy.cuda.Event()
        begin.record(self.stream)
        self._nccl.bcast(buf.data.ptr, buf.nbytes, nccl.NCCL_UINT8, root, self.stream.ptr)
        done = cupy.cuda.Event()
        done.record(self.stream)
        self._time(begin, done)
        return DevicePending(done)

    def free(self) -> None:
        if self._nccl is not None:
            self.stream.synchronize()
            self._nccl.destroy()
            self._nccl = None


class CudaAwareBroadcaster(_HostTimed):
    """Broadcast CuPy buffers by passing them to MPI directly.

    Only for MPI libraries that report CUDA support (:func:`mpi_cuda_aware`):
    a device pointer given to one that does not can crash the process.
    """

    name = "cuda-aware"

    def __init__(self, comm: MPI.Intracomm, backend):
        if not backend.is_gpu:
            raise ValueError("the cuda-aware broadcaster needs the cupy backend")
        self.comm, self.backend = comm, backend

    def ibcast(self, buf, root: int, slot: int = 0, ready=None, own: bool = False) -> Pending:
        if self.comm.Get_size() == 1:
            return Pending(None)
        t0 = time.perf_counter()
        # MPI reads and writes the buffer outside any stream: finish queued work
        # first (a root's own block only needs its values: `ready`).
        if ready is not None:
            ready.synchronize()
        if not (own and self.comm.Get_rank() == root):
            self.backend.synchronize()
        raw = _as_bytes(buf)
        reqs = _ibcast_bytes(self.comm, raw, root)
        self._seconds += time.perf_counter() - t0
        return Pending(reqs, owner=self)

    def free(self) -> None:
        pass


def _loaded_mpi_libraries() -> list[str]:
    """Paths of the MPI libraries mapped into this process (Linux)."""
    try:
        with open("/proc/self/maps") as fh:
            paths = {line.split()[-1] for line in fh if "libmpi" in line and "/" in line}
    except OSError:
        return []
    return sorted(paths)


def mpi_cuda_aware() -> tuple[bool, str]:
    """Does the MPI library accept CUDA device buffers? Returns ``(answer, how we know)``.

    Asks, never tries: ``SUMMA_CUDA_AWARE=0/1`` overrides; then the MPI-4.1
    info key ``mpi_memory_alloc_kinds``; then ``MPIX_Query_cuda_support()`` of
    the loaded library (Open MPI, MPICH). Unknown means no.
    """
    asked = options.current().cuda_aware
    if asked is not None:
        return asked, "SUMMA_CUDA_AWARE"
    try:
        info = MPI.COMM_WORLD.Get_info()
        kinds = info.Get("mpi_memory_alloc_kinds")
        info.Free()
        if kinds and "cuda" in kinds:
            return True, f"mpi_memory_alloc_kinds={kinds}"
    except (MPI.Exception, AttributeError, NotImplementedError):
        pass
    for path in _loaded_mpi_libraries():
        try:
            query = getattr(ctypes.CDLL(path), "MPIX_Query_cuda_support")
        except (OSError, AttributeError):
            continue
        query.restype = ctypes.c_int
        return bool(query()), f"MPIX_Query_cuda_support() in {os.path.basename(path)}"
    return False, "the MPI library reports no CUDA support"


def nccl_available() -> tuple[bool, str]:
    """Is CuPy's NCCL binding usable here? Returns ``(answer, version or reason)``."""
    try:
        from cupy.cuda import nccl
        version = nccl.get_version()
    except Exception as exc:  # ImportError, or the library failing to load
        return False, f"cupy.cuda.nccl unavailable ({type(exc).__name__})"
    return True, f"NCCL {version // 10000}.{version // 100 % 100}.{version % 100}"


#: The broadcasters by the names ``--comm`` accepts (classes in
#: :mod:`summa.transports.broadcasters`, which adds CUDA IPC's from :mod:`summa.transports.ipc`).
BROADCASTER_NAMES = ("nccl", "cuda-aware", "mpi", "ipc")


def choose_comm(kind: str, backend) -> str:
    """Resolve ``--comm`` to a broadcaster name, or raise ValueError.

    ``auto`` takes NCCL on the cupy backend when CuPy's NCCL loads, else
    CUDA-aware MPI when the library reports CUDA support, else host-staged MPI.
    ``ipc`` (copy engines between the GPUs of one node) is named here only when
    asked for; ``auto`` in the in-memory SUMMA loop takes it where the grid
    allows (:func:`summa.planning.selection.grid_broadcasters`).
    """
    if kind not in ("auto", *BROADCASTER_NAMES):
        raise ValueError(f"unknown communication mode {kind!r}; choose auto, "
                         + ", ".join(BROADCASTER_NAMES))
    if backend is None or not backend.is_gpu:
        if kind in ("nccl", "cuda-aware", "ipc"):
            raise ValueError(f"--comm {kind} needs the cupy backend")
        return "mpi"
    if kind == "auto":
        if nccl_available()[0]:
            return "nccl"
        return "cuda-aware" if mpi_cuda_aware()[0] else "mpi"
    if kind == "nccl" and not nccl_available()[0]:
        raise ValueError(f"--comm nccl: {nccl_available()[1]}")
    if kind == "cuda-aware" and not mpi_cuda_aware()[0]:
        raise ValueError(f"--comm cuda-aware: {mpi_cuda_aware()[1]}")
    return kind
