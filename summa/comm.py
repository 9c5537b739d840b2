"""Panel broadcasters and chunked point-to-point transfers.

A broadcaster moves one panel from a root to every rank of a grid row or grid
column. All of them share one nonblocking interface, ``ibcast(buf, root)``,
whose handle's ``wait()`` returns once `buf` holds the root's data on this rank;
the SUMMA loop overlaps those waits with GEMMs (lookahead).

Buffers travel as raw bytes in chunks of at most :data:`CHUNK_BYTES`, so a
message never exceeds the 2**31-1 count limit of MPI libraries without
large-count support.
"""

from __future__ import annotations

from mpi4py import MPI
import numpy as np

__all__ = ["CHUNK_BYTES", "HostStagedBroadcaster", "make_broadcaster",
           "send_array", "recv_array", "chunks"]

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


def _as_bytes(buf: np.ndarray) -> np.ndarray:
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


class _Pending:
    """Handle of a started broadcast; ``wait()`` completes it exactly once."""

    def __init__(self, requests, finish=None):
        self._requests, self._finish = requests, finish

    def wait(self) -> None:
        if self._requests is None:
            return
        MPI.Request.Waitall(self._requests)
        if self._finish is not None:
            self._finish()
        self._requests = self._finish = None


class HostStagedBroadcaster:
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

    def ibcast(self, buf, root: int, slot: int = 0) -> _Pending:
        """Start broadcasting `buf` from `root`; return a handle to ``wait()`` on."""
        if self.comm.Get_size() == 1:
            return _Pending(None)
        if self.backend.name == "numpy":
            raw = _as_bytes(buf)
            return _Pending([self.comm.Ibcast([raw[a:b], MPI.BYTE], root)
                             for a, b in chunks(raw.size)])
        host = self._stage(slot, buf.nbytes)
        is_root = self.comm.Get_rank() == root
        if is_root:
            # get() synchronizes the stream, so MPI reads finished data.
            buf.reshape(-1).view(np.uint8).get(out=host)
        reqs = [self.comm.Ibcast([host[a:b], MPI.BYTE], root) for a, b in chunks(host.size)]
        def finish():
            buf.reshape(-1).view(np.uint8).set(host)
            self._copies[slot] = self.backend.record_event()
        return _Pending(reqs, None if is_root else finish)

    def free(self) -> None:
        for event in self._copies.values():
            event.synchronize()
        self._copies.clear()
        self._staging.clear()


def make_broadcaster(kind: str, comm: MPI.Intracomm, backend):
    """Return the broadcaster `kind` (``"auto"`` or ``"mpi"``) over `comm`."""
    if kind in ("auto", "mpi"):
        return HostStagedBroadcaster(comm, backend)
    raise ValueError(f"unknown communication mode {kind!r}; choose auto or mpi")
