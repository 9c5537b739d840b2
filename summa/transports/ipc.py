"""Panels between the GPUs of one node by copy engines (CUDA IPC).

NCCL moves data with kernels that take streaming multiprocessors from the
concurrent GEMMs; on one node the same bytes can move by the GPUs' copy
engines instead, leaving every multiprocessor to the GEMMs.

Direct copies (the in-memory SUMMA loop: ``export``, ``connect``, ``iget``,
``release``). The operands do not change during a multiply, so each rank
exports its stored block once and every receiver copies each panel straight
out of the root's block, on its own copy stream, whenever its slot is free. No
message is exchanged per panel, so no rank's host ever waits for another's;
one barrier at the end keeps a block alive until every peer has finished
reading it (CUDA requires importers to close before the exporter frees).

Opening a peer's block costs ~1 ms up to 256 MiB and 10-20 ms above, as much
as a whole multiply at N = 16384 in TF32. Blocks up to 1/64 of the device's
memory therefore stay open after a multiply, their owner holding a reference
that keeps the allocation alive, so that multiplying the same blocks again
opens nothing. The next multiply closes the blocks it no longer reads, and
their owners drop them after its closing barrier; ``free`` drops them all
once the peers have closed them too (without waiting for a peer that does
not come: :func:`release_held`).
(CuPy's pool lets one hold a block, not its allocation alone: a new operand
cannot take a held block's memory, so a loop over new operands opens each.)

Paired broadcasts (``ibcast``: the self-test, calibration, out of core, and
blocks that cannot be exported). Each rank exports one staging buffer per
lookahead slot, and two interprocess events per slot ("ready": the root filled
its buffer; "done": a receiver finished copying out of it), once. Per
broadcast:

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

import ctypes
import functools
import time

import numpy as np

from ..runtime.mpi import MPI
from .comm import DevicePending, DeviceTimed, Pending
from ..runtime.cleanup import remove_cuda_ipc_files_at_exit
from ..runtime.watchdog import watch

__all__ = ["IpcBroadcaster"]

_MEMCPY_DEFAULT = 4  # cudaMemcpyDefault: unified addressing works out the direction


#: Blocks up to this share of the device's memory stay open between multiplies.
KEEP_OPEN_SHARE = 1 / 64


@functools.cache
def _libcuda():
    return ctypes.CDLL("libcuda.so.1")


def _allocation_base(ptr: int) -> int:
    """Start of the cudaMalloc allocation holding device address `ptr`.

    An IPC handle names a whole allocation, while a CuPy array may lie inside a
    larger pool block; the driver knows the allocation's range.
    """
    base, size = ctypes.c_uint64(), ctypes.c_size_t()
    status = _libcuda().cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size),
                                                ctypes.c_uint64(ptr))
    if status != 0:
        raise RuntimeError(f"cuMemGetAddressRange failed with CUDA driver status {status}")
    return base.value


def block_handle(block):
    """The IPC handle (bytes) of the allocation holding CuPy array `block`, and
    the block's offset in it; (b"", 0) for an empty block; None where it
    cannot be exported (rows not contiguous, or memory CUDA IPC cannot share,
    e.g. managed or stream-ordered)."""
    if not block.size:
        return b"", 0
    if block.ndim != 2 or block.strides[1] != block.itemsize:
        return None
    import cupy
    try:
        base = _allocation_base(block.data.ptr)
        return bytes(cupy.cuda.runtime.ipcGetMemHandle(base)), block.data.ptr - base
    except Exception:
        return None


def keeps_open(block, backend) -> bool:
    """Would `block`, on `backend`'s device, stay open at its readers after a
    multiply (see the module docstring)? Larger blocks open in time spent on
    GEMMs long enough to hide it, and holding them would keep too much memory
    from the user."""
    return stays_open(block.nbytes, backend.memory_total())


def stays_open(nbytes: int, device_bytes: int) -> bool:
    """Does a block of `nbytes` stay open on a device of `device_bytes`?"""
    return nbytes <= KEEP_OPEN_SHARE * device_bytes


#: How long ``free`` waits for the peers of a grid row/column to close the
#: blocks kept open (they free the grid at about the same time) before it
#: leaves the blocks held until they have.
FREE_GRACE_SECONDS = 2.0
#: Blocks whose peers had not closed them by then, with the barrier they post
#: once they have: (request, blocks).
_held_for_late_peers: list = []


def release_held(comm, held: dict, grace: float = FREE_GRACE_SECONDS) -> None:
    """Drop `held` (this rank's blocks its peers in `comm` may have open) once
    every rank of `comm` has closed them: each posts a barrier after closing.
    Where that takes longer than `grace` (a peer busy elsewhere, or stopped
    by an error on its side) the blocks stay held until a later call finds the
    barrier passed: neither a wait that may never end nor memory freed while
    a peer still maps it. Collective in the sense of a non-blocking barrier."""
    reap_held()
    request = comm.Ibarrier()
    deadline = time.monotonic() + grace
    while not request.Test():
        if time.monotonic() > deadline:
            _held_for_late_peers.append((request, held))
            return
        time.sleep(0.001)


def reap_held() -> None:
    """Drop the blocks of :func:`release_held` whose peers have closed them since."""
    _held_for_late_peers[:] = [(r, held) for r, held in _held_for_late_peers if not r.Test()]


class _Slot:
    """One rank's exported buffer and events for one lookahead slot, and the
    peers' opened counterparts."""

    def __init__(self, comm, nbytes: int):
        import cupy
        rt = cupy.cuda.runtime
        self.nbytes = nbytes
        me = comm.Get_rank()
        self.me, self.readers = me, None
        self.peer_buf, self.peer_ready, self.peer_done = [], [], []
        # Allocating (a full GPU) and exporting (a container without IPC) can
        # fail on some ranks only: agree first, so that all raise, none waits.
        try:
            # Straight from cudaMalloc, not the pool: an IPC handle opens at the
            # start of its allocation, and a pool block can lie inside a larger one.
            self.buf = cupy.cuda.Memory(max(nbytes, 1))
            remove_cuda_ipc_files_at_exit()  # the driver's file for the events
            self.ready = cupy.cuda.Event(disable_timing=True, interprocess=True)
            self.done = cupy.cuda.Event(disable_timing=True, interprocess=True)
            mine = (rt.ipcGetMemHandle(self.buf.ptr), rt.ipcGetEventHandle(self.ready.ptr),
                    rt.ipcGetEventHandle(self.done.ptr))
        except Exception as exc:
            mine = f"rank {me} cannot allocate or export a {nbytes}-byte CUDA IPC buffer ({exc})"
        everyone = comm.allgather(mine)
        whys = [m for m in everyone if isinstance(m, str)]
        if whys:
            raise RuntimeError("ipc broadcaster: " + "; ".join(whys))
        why = ""
        for rank, (mem, ready, done) in enumerate(everyone):
            if rank == me:
                self.peer_buf.append(self.buf.ptr)
                self.peer_ready.append(self.ready.ptr)
                self.peer_done.append(self.done.ptr)
                continue
            try:
                self.peer_buf.append(rt.ipcOpenMemHandle(mem))
                self.peer_ready.append(rt.ipcOpenEventHandle(ready))
                self.peer_done.append(rt.ipcOpenEventHandle(done))
            except Exception as exc:  # e.g. no peer access between the two GPUs
                why = f"rank {me} cannot open rank {rank}'s CUDA IPC handles ({exc})"
                break
        # Collective, so that a failure on one rank raises on all, none left waiting.
        whys = [w for w in comm.allgather(why) if w]
        if whys:
            self._close_opened()
            raise RuntimeError("ipc broadcaster: " + "; ".join(whys))
        # self.readers: MPI request, receivers' "done" tokens of my last turn as root
        self.tokens = np.zeros(comm.Get_size(), dtype=np.uint8)  # where they land

    def close(self) -> None:
        _await_readers(self)
        self._close_opened()

    def _close_opened(self) -> None:
        import cupy
        rt = cupy.cuda.runtime
        for opened, close in ((self.peer_buf, rt.ipcCloseMemHandle),
                              (self.peer_ready, rt.eventDestroy),
                              (self.peer_done, rt.eventDestroy)):
            for rank, handle in enumerate(opened):
                if rank != self.me:
                    close(handle)
        self.peer_buf, self.peer_ready, self.peer_done = [], [], []


def _await_readers(slot) -> None:
    """Wait (on the host, watched) for the receivers' "done" tokens of `slot`'s
    last turn as root, if any: only then may it be refilled or closed."""
    if slot.readers is not None:
        with watch("the other ranks of a grid row/column to finish copying a panel out of "
                   "this rank's staging buffer (ipc)"):
            slot.readers.Wait()
        slot.readers = None


class IpcBroadcaster(DeviceTimed):
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
        if not backend.supports_ipc:
            raise ValueError("the ipc broadcaster needs the cupy backend")
        self.comm, self.backend = comm, backend
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self._slots: dict[int, _Slot] = {}
        self._sends: list = []  # receivers' outstanding "done" tokens
        self._timings: list = []
        self._opened: dict = {}  # IPC handle: that peer allocation's address here
        self._mine = (None, 0, 0, False)  # this rank's export: (handle, offset, pitch, kept)
        self._block = None  # the exported block itself
        self._sources: list = []  # per rank: (address here, row pitch) of its block
        self._kept_open: set = set()  # peers' handles to leave open after this multiply
        # This rank's blocks its peers may still hold open, by handle: held, so
        # that their allocations cannot be freed before the peers close them.
        self._held: dict = {}
        self._ever_kept = False  # the same on every rank: some block was kept open
        self.opened_blocks = 0  # peers' blocks the last connect had to open
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
            with watch("the other ranks of a grid row/column to set up a staging buffer (ipc)"):
                current = self._slots[slot] = _Slot(self.comm, nbytes)
        return current

    def ibcast(self, buf, root: int, slot: int = 0, ready=None, own: bool = False):
        if self.comm.Get_size() == 1:
            return Pending(None)
        import cupy
        rt = cupy.cuda.runtime
        s = self._slot(slot, buf.nbytes)
        begin = cupy.cuda.Event()
        if self.comm.Get_rank() == root:
            if s.readers is not None:  # receivers of my last turn must be done reading
                _await_readers(s)
                for rank, done in enumerate(s.peer_done):
                    if rank != root:
                        rt.streamWaitEvent(self.stream.ptr, done, 0)
            if not own:  # the panel is filled (a block of its own is, before the multiply)
                self.stream.wait_event(self.backend.record_event())
            if ready is not None:
                self.stream.wait_event(ready)
            begin.record(self.stream)
            rt.memcpyAsync(s.buf.ptr, buf.data.ptr, buf.nbytes, _MEMCPY_DEFAULT,
                           self.stream.ptr)
            s.ready.record(self.stream)
            self._await_ready(root)
            s.readers = self.comm.Igather(MPI.IN_PLACE, s.tokens, root)
            end = cupy.cuda.Event()
            end.record(self.stream)
            self._time(begin, end)
            # The root's buffer already holds the panel, but whoever waits for
            # this broadcast (its GEMM) must also wait for the copy out of it:
            # only then may the buffer be refilled (out of core, the next upload
            # into this slot once that GEMM is done; it overwrote panels before
            # they were copied out, and float64 results came out wrong).
            return DevicePending(end)
        self._await_ready(root)  # the root has recorded "ready"
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
        return DevicePending(end)

    #: The SUMMA loop may copy panels straight out of the roots' blocks.
    reads_blocks = True

    def _await_ready(self, root: int) -> None:
        """The one host-side wait of a broadcast: until `root` has recorded its
        slot's "ready" (a step the watchdog names: a rank stuck elsewhere
        would otherwise leave its peers here for good)."""
        with watch(f"rank {root} of a grid row/column to stage a panel for copying (ipc)"):
            self.comm.Ibcast(self._ready_token, root).Wait()

    def staging_bytes(self) -> int:
        """Device bytes of this rank's staging buffers (outside CuPy's pool)."""
        return sum(s.nbytes for s in self._slots.values())

    def export(self, block) -> bool:
        """Name `block` (this rank's stored operand, its values already written
        on the GPU) for :meth:`connect`; False where it cannot be exported
        (rows not contiguous, or memory CUDA IPC cannot share).

        The block must not change until :meth:`release` returns on every rank.
        """
        named = block_handle(block)
        if named is None:
            self._mine, self._block = (None, 0, 0, False), None
            return False
        handle, offset = named
        self._mine = (handle or None, offset, block.strides[0] if block.size else 0,
                      bool(handle) and keeps_open(block, self.backend))
        self._block = block
        return True

    def connect(self) -> None:
        """Open the peers' exported blocks (collective; on H200s ~1 ms per block
        up to 256 MiB, 10-20 ms for larger ones, which the SUMMA loop hides
        behind the GEMMs of this rank's own panels), but not those still open
        from the last multiply; close those of the last multiply it no longer
        reads."""
        import cupy
        reap_held()
        with watch("the other ranks of a grid row/column to exchange their blocks (ipc)"):
            everyone = self.comm.allgather(self._mine)
        me = self.comm.Get_rank()
        wanted = {handle for rank, (handle, *_) in enumerate(everyone)
                  if rank != me and handle is not None}
        # Their owners drop them only after this multiply's closing barrier.
        self._close([h for h in self._opened if h not in wanted])
        self._kept_open = {handle for rank, (handle, _, _, kept) in enumerate(everyone)
                           if rank != me and kept}
        self._ever_kept |= any(kept for *_, kept in everyone)
        self._sources, self.opened_blocks = [], 0
        for rank, (handle, offset, pitch, _) in enumerate(everyone):
            if rank == me or handle is None:
                self._sources.append(None)  # never read: the root uses its own view
                continue
            if handle not in self._opened:  # one allocation may hold several blocks
                self._opened[handle] = cupy.cuda.runtime.ipcOpenMemHandle(handle)
                self.opened_blocks += 1
            self._sources.append((self._opened[handle] + offset, pitch))

    def iget(self, buf, root: int, rows: slice, cols: slice, after=None):
        """Queue a copy of ``rows x cols`` of `root`'s exported block into `buf`
        (C-contiguous, that shape), once event `after` (the last GEMM reading
        `buf`, if any) has passed. On the root nothing moves: it multiplies its
        own view."""
        if self.comm.Get_rank() == root or buf.size == 0:
            return Pending(None)
        import cupy
        src, pitch = self._sources[root]
        width = (cols.stop - cols.start) * buf.itemsize
        height = rows.stop - rows.start
        if after is not None:
            self.stream.wait_event(after)
        begin, end = cupy.cuda.Event(), cupy.cuda.Event()
        begin.record(self.stream)
        cupy.cuda.runtime.memcpy2DAsync(buf.data.ptr, width,
                                        src + rows.start * pitch + cols.start * buf.itemsize,
                                        pitch, width, height, _MEMCPY_DEFAULT, self.stream.ptr)
        end.record(self.stream)
        self._time(begin, end)
        return DevicePending(end)

    def release(self) -> None:
        """Finish this rank's copies, close the peers' blocks but those kept
        open, and wait for every peer to do the same (collective): CUDA requires
        importers to close before the exporter frees, so a block may be freed
        after this, unless its peers keep it open, when this broadcaster holds
        it until a later multiply no longer reads it."""
        self._close([h for h in self._opened if h not in self._kept_open])
        self.stream.synchronize()
        self._sources = []
        with watch("the other ranks of a grid row/column to finish copying panels (ipc)"):
            self.comm.Barrier()
        # Every peer has closed what it no longer reads (here and in connect).
        handle, *_, kept = self._mine
        self._held = {handle: self._block} if kept else {}
        self._block = None

    def release_local(self) -> None:
        """Close every peer block this rank has open (this rank only; the blocks
        this rank holds for its peers stay held, since they may still read
        them)."""
        self._close(list(self._opened))
        self._sources, self._block = [], None

    def _close(self, handles) -> None:
        import cupy
        if handles:
            self.stream.synchronize()
        for handle in handles:
            cupy.cuda.runtime.ipcCloseMemHandle(self._opened.pop(handle))

    def free(self) -> None:
        self.release_local()
        if self._ever_kept:  # the peers close the blocks this rank holds before it drops them
            release_held(self.comm, self._held)
        self._held = {}
        self.stream.synchronize()
        with watch("the roots of this rank's last ipc broadcasts to collect their tokens"):
            MPI.Request.Waitall(self._sends)
        self._sends = []
        for s in self._slots.values():
            s.close()
        self._slots.clear()
