"""Copies between pageable host memory and a GPU at the speed of the link.

A copy from ordinary (pageable) host memory runs at a fraction of the link's
rate (6.5 GB/s against 54 GB/s page-locked, on the H200 machine), and
page-locking a whole array first costs more than the copy (10.6 GB/s on one
thread). So copies go through a small ring of page-locked buffers instead: a
pool of host threads fills them from the caller's arrays (9 GB/s on one
thread, 46-59 GB/s on 8-16) while the copy engine empties the ones already
full, and the other way round for results, whose host threads also touch a
fresh output array for the first time in parallel.

Each direction has a dispatcher thread that takes whole copies in order and
cuts them into chunks of rows; the chunks run on the pool. A copy is a
:class:`~summa.device.transfers.Transfer` (:mod:`summa.device.transfers`):
the caller queues it with a CUDA event to start after (the GEMMs done with
its device buffer) and later waits for it, on the GPU or on the host. An
error in any thread ends the transfer with that error, raised where it is
waited for.

Integer (and boolean) host rows meet float64 device rows in these copies:
the threads convert them as they fill a chunk, and convert a float64
product back as they drain one (:mod:`summa.device.casts`), so that an
integer product makes no whole float64 copy in host memory.
"""

from __future__ import annotations

import os
import queue
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .. import options
from . import hostrows
from .casts import cast_rows, converts
from .hostrows import copyable_rows, pitch
from .transfers import Touch, Transfer, page_parts

__all__ = ["Stager", "get_stager", "stager_for", "set_ranks_on_node",
           "ranks_on_node", "copy_threads", "ring_bytes", "CHUNK_BYTES"]

#: Bytes of one page-locked chunk: large enough that a copy engine streams it
#: at full rate, small enough that a ring of a few per thread stays small
#: (made once per process, page-locked at ~30 GB/s: :meth:`Stager._rings`).
CHUNK_BYTES = 8 << 20
_H2D, _D2H = 1, 2  # cudaMemcpyKind


def ring_bytes(threads: int) -> int:
    """Page-locked host memory a stager of `threads` threads takes at most:
    a ring of chunks each way, a few more than threads."""
    return 2 * (threads + RING_EXTRA) * CHUNK_BYTES


#: Chunks each ring holds beyond one per thread.
RING_EXTRA = 4

#: Share of the copy threads that fault in a fresh result (:meth:`Stager.touch`)
#: beside the uploads: all of them halved the uploads' rate (4.7 against 8
#: GB/s on one H200 host), and the touch has the whole sweep to finish in.
#: 0: no touch (the downloads fault the pages in). Huge pages for the result
#: (``madvise(MADV_HUGEPAGE)``) were tried and lost: 0.50 against 0.26 s for
#: N = 16384 float64 (faults of 2 MiB pages compact memory first).
TOUCH_SHARE = 0.25


class _NodeShare:
    """How many ranks share this node's cores, as the last process grid said:
    one explicit holder (not a ``global``) for the copies whose caller does not
    say (:func:`stager_for`).

    Attributes
    ----------
    ranks : int
        Ranks on this node (1 before any grid).
    """

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        """Forget the grids' word: one rank per node (the state at import)."""
        self.ranks = 1


_node_share = _NodeShare()


def set_ranks_on_node(count: int) -> None:
    """How many ranks share this node's cores (a process grid says so), for
    the copies whose caller does not (:func:`stager_for`)."""
    _node_share.ranks = max(1, int(count))


def ranks_on_node() -> int:
    """How many ranks share this rank's cores, as the last process grid said
    (1 before any): the copies' and the file reads' threads divide them."""
    return _node_share.ranks


def stager_for(device: int) -> "Stager":
    """This process's stager for `device`, its threads the node's cores shared
    by its ranks."""
    return get_stager(device, copy_threads(_node_share.ranks))


def copy_threads(ranks_on_node: int = 1, cores: int | None = None) -> int:
    """Host threads for one rank's copies: three quarters of the cores this
    process may run on (or `cores`, a node's that a plan for another
    machine names), shared with the node's ranks that may run on them
    too (:func:`summa.distribution.grid.core_share`), at most
    :data:`MAX_COPY_THREADS`; the other quarter is for the touch of a fresh
    result (:data:`TOUCH_SHARE`), the dispatchers and the thread queueing
    the GEMMs. ``SUMMA_COPY_THREADS`` overrides."""
    asked = options.current().copy_threads
    if asked is not None:
        return asked
    cores = cores or usable_cores()
    return max(1, min(MAX_COPY_THREADS, cores * 3 // 4 // max(1, ranks_on_node)))


#: Most copy threads of one rank. On the H200 machine's 16 cores 12 beat 16
#: (N = 16384 float64 from pageable arrays: 0.250 against 0.282 s; 16 threads
#: of memcpy alone were only 7 % faster than 12, 45.6 against 42.8 GB/s).
MAX_COPY_THREADS = 12


def usable_cores() -> int:
    """Cores this process may run on (its affinity, where the system says)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class Stager:
    """Host-GPU copies through rings of page-locked chunks (see the module).

    Parameters
    ----------
    device : int
        The CUDA device the copies go to and from.
    threads : int
        Host threads that fill and drain the chunks.
    chunk_bytes : int, optional
        Size of one chunk (a chunk holds at least one row); default
        :data:`CHUNK_BYTES`.
    cupy : module, optional
        CuPy, or a stand-in with the same calls (tests).
    """

    def __init__(self, device: int, threads: int, chunk_bytes: int | None = None, cupy=None):
        if cupy is None:
            import cupy
        self.cupy, self.device, self.threads = cupy, int(device), int(threads)
        self.chunk_bytes = int(CHUNK_BYTES if chunk_bytes is None else chunk_bytes)
        with cupy.cuda.Device(self.device):
            self.up = cupy.cuda.Stream(non_blocking=True)
            self.down = cupy.cuda.Stream(non_blocking=True)
        self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="summa-copy",
                                        initializer=self._bind)
        self._touch_pool = None
        # Per direction a ring of chunks: the free ones (uploading, with the
        # event of their last copy out), a few more than threads.
        self._ring = self.threads + RING_EXTRA
        self._free = {_H2D: queue.Queue(), _D2H: queue.Queue()}
        self._arena = None  # both rings' chunks, made at the first copy
        self._arena_lock = threading.Lock()  # the two dispatchers
        self._jobs = {_H2D: queue.Queue(), _D2H: queue.Queue()}
        # Downloaded chunks in the order their copies were queued: a thread of
        # its own waits for each, so that no pool thread sits waiting on the GPU
        # while uploads wait for a thread.
        self._landing = queue.Queue()
        self._closed = False
        self._dispatchers = [threading.Thread(target=self._dispatch, args=(kind,), daemon=True,
                                              name=f"summa-{'up' if kind == _H2D else 'down'}")
                             for kind in (_H2D, _D2H)]
        self._dispatchers.append(threading.Thread(target=self._land, daemon=True,
                                                  name="summa-landing"))
        for thread in self._dispatchers:
            thread.start()

    def _bind(self) -> None:
        self.cupy.cuda.runtime.setDevice(self.device)

    # -- the caller's side -----------------------------------------------------------
    def upload(self, dst, src: np.ndarray, after=None) -> Transfer:
        """Copy host array `src` (any strides: its rows are gathered into the
        chunks) into device array `dst` (same shape; float64 where `src` is
        integers or bools: converted as the chunks fill), once the GPU has
        reached CUDA event `after` (None: at once)."""
        return self._submit(_H2D, dst, src, after)

    def download(self, dst: np.ndarray, src, after=None, touch: Touch | None = None) -> Transfer:
        """Copy device array `src` into host array `dst` (same shape, any
        strides; integers or bools where `src` is float64 holding exact
        integers: converted as the chunks drain, :func:`summa.device.casts.exact_into`),
        once the GPU has reached `after`; where `dst` lies in an array being
        touched (:meth:`touch`), each chunk's rows once their pages' zeros
        have landed (:meth:`summa.device.transfers.Touch.ensure`)."""
        return self._submit(_D2H, src, dst, after, touch)

    def touch(self, x: np.ndarray) -> Touch:
        """Fault in the pages of a fresh array whose values do not matter (a
        result about to be overwritten) on threads of their own, so that the
        copies into it later run at the speed of touched memory (37 against
        16.5 GB/s on 16 threads; first touch itself 32 GB/s there). It
        writes zeros: a download into `x` given it (:meth:`download`'s
        `touch`) writes each chunk once the pages under it are done;
        anything else waits for all of it (:meth:`hurry` first, where the
        copy threads are free)."""
        if not x.size or TOUCH_SHARE <= 0 or hostrows.writer(x) is not None:
            return Touch([])  # (written by pwrite, or in another process: nothing here)
        if self._touch_pool is None:
            self._touch_pool = ThreadPoolExecutor(max(1, round(self.threads * TOUCH_SHARE)),
                                                  thread_name_prefix="summa-touch")
        if x.flags.c_contiguous:
            parts = page_parts(x.reshape(-1).view(np.uint8), 4 * self.threads)
        else:
            rows = max(1, x.shape[0] // (4 * self.threads))
            parts = [x[r:r + rows] for r in range(0, x.shape[0], rows)]
        touch = Touch(parts)
        for _ in parts:
            self._touch_pool.submit(touch.fill_one)
        return touch

    def hurry(self, touch: Touch) -> None:
        """Let the copy threads take the parts of `touch` still unclaimed
        (each is filled once, by whichever thread claims it first)."""
        if not self._closed:
            for _ in range(touch.unclaimed()):
                self._pool.submit(touch.fill_one)

    def _submit(self, kind, dev, host: np.ndarray, after, touch=None) -> Transfer:
        if self._closed:
            raise RuntimeError("the host-GPU copy threads were closed")
        if tuple(dev.shape) != tuple(host.shape) or (
                dev.dtype != host.dtype and not converts(host.dtype, dev.dtype)):
            raise ValueError(f"a copy between {host.shape} {host.dtype} host rows and a "
                             f"{tuple(dev.shape)} {dev.dtype} device array")
        # The host side may have any strides (a strided view, reversed rows):
        # the threads gather or scatter its rows through the chunks, never
        # a copy of the whole first.
        if host.ndim != 2 or (host.size and not copyable_rows(dev)):
            raise ValueError("host-GPU copies take 2-D host arrays and device arrays with "
                             "contiguous rows")
        rows = host.shape[0] if host.size else 0
        # (a chunk holds the device's rows: float64 where the host's are integers)
        step = max(1, self.chunk_bytes // max(1, host.shape[1] * dev.dtype.itemsize))
        cuts = [(r, min(r + step, rows)) for r in range(0, rows, step)]
        transfer = Transfer(len(cuts))
        if cuts:
            self._jobs[kind].put((transfer, dev, host, after, cuts, touch))
        return transfer

    def close(self) -> None:
        """Stop the threads once the copies queued so far are done."""
        if self._closed:
            return
        self._closed = True
        for kind in (_H2D, _D2H):
            self._jobs[kind].put(None)
        for thread in self._dispatchers[:2]:
            thread.join()
        self._landing.put(None)
        self._dispatchers[2].join()
        self._pool.shutdown(wait=True)
        if self._touch_pool is not None:
            self._touch_pool.shutdown(wait=True)
        self.up.synchronize()
        self.down.synchronize()
        if self._arena is not None and self._arena[1]:
            try:
                self.cupy.cuda.runtime.hostUnregister(self._arena[0].ctypes.data)
            except Exception:  # noqa: BLE001 -- at exit the context may be gone already
                pass
            self._arena = None

    # -- the dispatchers and the pool -------------------------------------------------
    def _chunk(self, kind, nbytes: int):
        """A free page-locked chunk of at least `nbytes`, the oldest returned
        (uploading: once its copy out is done)."""
        self._rings()
        buf, event = self._free[kind].get()
        if event is not None:
            event.synchronize()
        if buf.nbytes < nbytes:  # a row longer than a chunk: a longer one replaces it
            memory = self.cupy.cuda.alloc_pinned_memory(nbytes)
            buf = np.frombuffer(memory, np.uint8, nbytes)
        return buf

    def _rings(self) -> None:
        """Make both rings at the first copy, as one array that the pool's
        threads touch and CUDA then page-locks whole (``cudaHostRegister``):
        ``cudaHostAlloc`` ran at 1.6 GB/s on one H200 host, so the 160 MiB
        ring of 16 threads took 0.1 s of the first call; touched on threads
        and locked at once it takes ~10 ms. Where locking is refused, chunks
        come from CuPy's page-locked allocator instead."""
        with self._arena_lock:
            if self._arena is not None:
                return
            count = 2 * self._ring
            arena = np.empty(count * self.chunk_bytes, np.uint8)
            list(self._pool.map(lambda part: part.fill(0),
                                page_parts(arena, 4 * self.threads)))
            try:
                self.cupy.cuda.runtime.hostRegister(arena.ctypes.data, arena.nbytes, 0)
                locked = True
                chunks = [arena[i * self.chunk_bytes:(i + 1) * self.chunk_bytes]
                          for i in range(count)]
            except Exception:  # noqa: BLE001 -- not allowed here: CuPy's allocator
                locked, arena = False, None
                chunks = [np.frombuffer(self.cupy.cuda.alloc_pinned_memory(self.chunk_bytes),
                                        np.uint8, self.chunk_bytes) for _ in range(count)]
            for i, chunk in enumerate(chunks):
                self._free[_H2D if i < self._ring else _D2H].put((chunk, None))
            self._arena = (arena, locked)

    def _dispatch(self, kind) -> None:
        self._bind()
        stream = self.up if kind == _H2D else self.down
        while True:
            job = self._jobs[kind].get()
            if job is None:
                return
            transfer, dev, host, after, cuts, touch = job
            try:
                if after is not None:
                    stream.wait_event(after)
                for r0, r1 in cuts:
                    if transfer.error is not None:
                        break
                    part = host[r0:r1]
                    nbytes = part.size * dev.dtype.itemsize
                    buf = self._chunk(kind, nbytes)
                    stage = buf[:nbytes].view(dev.dtype).reshape(part.shape)
                    if kind == _H2D:
                        self._pool.submit(self._fill, transfer, dev[r0:r1], part, stage, buf)
                    else:  # the copy engine first, the host thread once it is done
                        self._memcpy(stage, dev[r0:r1], _D2H, stream)
                        self._landing.put((self._record(stream), transfer, part, stage, buf,
                                           touch))
                if kind == _D2H and transfer.error is None:
                    transfer._event = self._record(stream)
                    transfer._queued.set()
            except BaseException as exc:  # noqa: BLE001 -- raised where it is waited for
                transfer._fail(exc)
            # Held here until the next job, the arrays would stay allocated
            # (a C tile of 13 GB: the next multiply found that much less free).
            job = transfer = dev = host = part = stage = buf = touch = None

    def _fill(self, transfer, dev, part, stage, buf) -> None:
        event = None
        try:
            # Another process's array is read there, a mapped file's rows
            # from the file (no page faults), unless already in memory.
            source = hostrows.reader(part)
            if source is not None and stage.dtype == part.dtype:
                source.read_into(stage)
            elif source is not None:  # (read as they lie, then converted)
                rows = np.empty(part.shape, part.dtype)
                source.read_into(rows)
                cast_rows(stage, rows)
            else:  # integers converted into float64 in the same pass
                cast_rows(stage, part)
            self._memcpy(stage, dev, _H2D, self.up)
            event = self._record(self.up)
            transfer._chunk_done(lambda: self._record(self.up))
        except BaseException as exc:  # noqa: BLE001
            transfer._fail(exc)
        finally:
            self._free[_H2D].put((buf, event))

    def _land(self) -> None:
        """Hand each downloaded chunk to the pool once its copy is done."""
        self._bind()
        while True:
            item = self._landing.get()
            if item is None:
                return
            event, transfer, part, stage, buf, touch = item
            try:
                event.synchronize()
            except BaseException as exc:  # noqa: BLE001
                transfer._fail(exc)
                self._free[_D2H].put((buf, None))
                continue
            self._pool.submit(self._drain, transfer, part, stage, buf, touch)
            item = transfer = part = stage = buf = touch = None  # see _dispatch

    def _drain(self, transfer, part, stage, buf, touch) -> None:
        try:
            if touch is not None:  # (zeros landing after the product would overwrite it)
                touch.ensure(part)
            # A mapped file: write its rows (through the map, page faults in
            # parallel measured slower: 4.7 against 3.4 s for 4.8 GB in
            # benchmarks/files.py's in-memory write phase).
            target = hostrows.writer(part)
            if target is not None:  # another process's array, or a mapped file
                if stage.dtype != part.dtype:
                    rows = np.empty(part.shape, part.dtype)
                    cast_rows(rows, stage)
                    stage = rows
                target.write_from(stage)
            else:  # float64 back into integers in the same pass
                cast_rows(part, stage)
            transfer._chunk_done()
        except BaseException as exc:  # noqa: BLE001
            transfer._fail(exc)
        finally:
            self._free[_D2H].put((buf, None))

    def _record(self, stream):
        event = self.cupy.cuda.Event(disable_timing=True)
        event.record(stream)
        return event

    def _memcpy(self, stage: np.ndarray, dev, kind, stream) -> None:
        """One 2-D copy between a contiguous host chunk and device rows."""
        width = stage.shape[1] * stage.itemsize
        host, dptr = stage.ctypes.data, dev.data.ptr
        dst, dpitch, src, spitch = ((dptr, pitch(dev), host, width) if kind == _H2D
                                    else (host, width, dptr, pitch(dev)))
        self.cupy.cuda.runtime.memcpy2DAsync(dst, dpitch, src, spitch, width, stage.shape[0],
                                             kind, stream.ptr)


_stagers: dict = {}


def get_stager(device: int, threads: int) -> Stager:
    """This process's stager for `device` with `threads` threads, made on first
    use and kept, so that later calls find their page-locked chunks ready."""
    key = (int(device), int(threads))
    stager = _stagers.get(key)
    if stager is None or stager._closed:
        stager = _stagers[key] = Stager(device, threads)
    return stager


def close_stagers() -> None:
    """Stop every stager's threads (at exit, and in tests)."""
    while _stagers:
        _stagers.popitem()[1].close()
