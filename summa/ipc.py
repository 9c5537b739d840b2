"""Broadcasts between the GPUs of one node by copy engines (CUDA IPC).

NCCL moves data with kernels that take streaming multiprocessors from the
concurrent GEMMs; on one node the same bytes can move by the GPUs' copy
engines instead, leaving every multiprocessor to the GEMMs. Each rank exports
one staging buffer per lookahead slot, and two interprocess events per slot
("ready": the root filled its buffer; "done": a receiver finished copying out
of it), once. Per broadcast:

* the root copies its panel into its slot buffer on the broadcaster's stream
  and records "ready"; a one-byte MPI broadcast tells the receivers it is
  recorded;
* each receiver makes its stream wait for the root's "ready", copies the
  panel peer-to-peer into its own buffer, records its "done", and tells the
  root with a one-byte MPI gather;
* before a root refills a slot it waits (on the GPU) for every receiver's
  "done" of the last time it was root for that slot.

The MPI messages only order host-side event records; no data moves through
the host. All ranks of the communicator must be on one node.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from .comm import _DevicePending, _DeviceTimed, _Pending

__all__ = ["IpcBroadcaster"]

_MEMCPY_DEFAULT = 4  # cudaMemcpyDefault: unified addressing works out the direction


class _Slot:
    """One rank's exported buffer and events for one lookahead slot, and the
    peers' opened counterparts."""

    def __init__(self, comm, nbytes: int):
        import cupy
        rt = cupy.cuda.runtime
        self.nbytes = nbytes
        # Straight from cudaMalloc, not the pool: an IPC handle opens at the
        # start of its allocation, and a pool block can lie inside a larger one.
        self.buf = cupy.cuda.Memory(max(nbytes, 1))
        self.ready = cupy.cuda.Event(disable_timing=True, interprocess=True)
        self.done = cupy.cuda.Event(disable_timing=True, interprocess=True)
        mine = (rt.ipcGetMemHandle(self.buf.ptr), rt.ipcGetEventHandle(self.ready.ptr),
                rt.ipcGetEventHandle(self.done.ptr))
        me = comm.Get_rank()
        self.peer_buf, self.peer_ready, self.peer_done = [], [], []
        for rank, (mem, ready, done) in enumerate(comm.allgather(mine)):
            if rank == me:
                self.peer_buf.append(self.buf.ptr)
                self.peer_ready.append(self.ready.ptr)
                self.peer_done.append(self.done.ptr)
            else:
                self.peer_buf.append(rt.ipcOpenMemHandle(mem))
                self.peer_ready.append(rt.ipcOpenEventHandle(ready))
                self.peer_done.append(rt.ipcOpenEventHandle(done))
        self.me = me
        self.readers = None  # MPI request: receivers' "done" tokens of my last turn as root
        self.tokens = np.zeros(comm.Get_size(), dtype=np.uint8)  # where they land

    def close(self) -> None:
        import cupy
        rt = cupy.cuda.runtime
        if self.readers is not None:
            self.readers.Wait()
            self.readers = None
        for rank in range(len(self.peer_buf)):
            if rank == self.me:
                continue
            rt.ipcCloseMemHandle(self.peer_buf[rank])
            rt.eventDestroy(self.peer_ready[rank])
            rt.eventDestroy(self.peer_done[rank])
        self.peer_buf = self.peer_ready = self.peer_done = []


class IpcBroadcaster(_DeviceTimed):
    """Copy-engine broadcasts among ranks of one node (see module docstring).

    Parameters
    ----------
    comm : MPI.Intracomm
        A grid row or column, all on one node, each rank with its own GPU.
    backend : Backend
        The CuPy backend.
    """

    name = "ipc"

    def __init__(self, comm: MPI.Intracomm, backend):
        import cupy
        if backend.name != "cupy":
            raise ValueError("the ipc broadcaster needs the cupy backend")
        self.comm, self.backend = comm, backend
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self._slots: dict[int, _Slot] = {}
        self._sends: list = []  # receivers' outstanding "done" tokens
        self._timings: list = []
        # Separate one-byte buffers: the "ready" broadcast writes into its own,
        # while outstanding "done" gathers still read theirs.
        self._ready_token = np.zeros(1, dtype=np.uint8)
        self._done_token = np.zeros(1, dtype=np.uint8)

    def _slot(self, slot: int, nbytes: int) -> _Slot:
        # Every rank calls with the same sizes in the same order, so growing
        # (a collective exchange of handles) happens everywhere at once.
        current = self._slots.get(slot)
        if current is None or current.nbytes < nbytes:
            if current is not None:
                self.stream.synchronize()
                current.close()
            current = self._slots[slot] = _Slot(self.comm, nbytes)
        return current

    def ibcast(self, buf, root: int, slot: int = 0, ready=None):
        if self.comm.Get_size() == 1:
            return _Pending(None)
        import cupy
        rt = cupy.cuda.runtime
        s = self._slot(slot, buf.nbytes)
        begin = cupy.cuda.Event()
        if self.comm.Get_rank() == root:
            if s.readers is not None:  # receivers of my last turn must be done reading
                s.readers.Wait()
                s.readers = None
                for rank, done in enumerate(s.peer_done):
                    if rank != root:
                        rt.streamWaitEvent(self.stream.ptr, done, 0)
            self.stream.wait_event(self.backend.record_event())  # the panel is filled
            if ready is not None:
                self.stream.wait_event(ready)
            begin.record(self.stream)
            rt.memcpyAsync(s.buf.ptr, buf.data.ptr, buf.nbytes, _MEMCPY_DEFAULT,
                           self.stream.ptr)
            s.ready.record(self.stream)
            self.comm.Ibcast(self._ready_token, root).Wait()
            s.readers = self.comm.Igather(MPI.IN_PLACE, s.tokens, root)
            end = cupy.cuda.Event()
            end.record(self.stream)
            self._time(begin, end)
            return _Pending(None)  # the root's own buffer already holds the panel
        self.comm.Ibcast(self._ready_token, root).Wait()  # the root has recorded "ready"
        self.stream.wait_event(self.backend.record_event())  # GEMMs done with `buf`
        begin.record(self.stream)
        rt.streamWaitEvent(self.stream.ptr, s.peer_ready[root], 0)
        rt.memcpyAsync(buf.data.ptr, s.peer_buf[root], buf.nbytes, _MEMCPY_DEFAULT,
                       self.stream.ptr)
        s.done.record(self.stream)
        self._sends.append(self.comm.Igather(self._done_token, None, root))
        self._sends = [r for r in self._sends if not r.Test()]
        end = cupy.cuda.Event()
        end.record(self.stream)
        self._time(begin, end)
        return _DevicePending(end)

    def free(self) -> None:
        self.stream.synchronize()
        MPI.Request.Waitall(self._sends)
        self._sends = []
        for s in self._slots.values():
            s.close()
        self._slots.clear()
