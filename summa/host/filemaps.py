"""Which host memory is a memory map of a file, so that copies into or out of
it read or write the file itself.

The out-of-core multiply of ``.npy`` files streams blocks that
:mod:`summa.host.npyio` maps into memory. Copied through the map, every 4 KiB page
is a fault (a read from the disk or the page cache, one page at a time):
7 TFLOP/s from the page cache on the H200 machine, where the GPU multiplies
at 55. Copied by ``preadv``/``pwrite`` of whole rows straight into (or out
of) the staging chunks, each copy thread moves its rows in a few system
calls. The maps are registered here by :mod:`summa.host.npyio`;
:mod:`summa.device.staging` asks :func:`find` for the file behind a source or
destination.
"""

from __future__ import annotations

import ctypes
import functools
import mmap
import os
import threading

import numpy as np

from ..device import hostrows
from ..device.hostrows import copyable_rows
from ..runtime.cleanup import finalize

__all__ = ["register", "find", "view_span", "FileRows", "prefetch", "read_ahead", "write_out",
           "libc_call", "available_memory", "meminfo_available"]

# Reentrant, and the maps looked through as a copy: a map's finalizer
# (:func:`_forget`) runs wherever the garbage collector happens to, also in
# a thread inside :func:`find` holding the lock (with a plain lock the copy
# threads deadlocked there: test_a_map_forgotten_inside_find_...).
_lock = threading.RLock()
#: start address -> (end address, file descriptor, file offset of start, writable, path)
_maps: dict[int, tuple] = {}


def register(data: np.ndarray, path: str, offset: int, writable: bool) -> None:
    """Note that `data` (an array on a map of `path`, its first byte at file
    offset `offset`) is that file; forgotten, and the file closed, when
    `data` goes."""
    if not data.nbytes:
        return
    fd = os.open(path, os.O_RDWR if writable else os.O_RDONLY)
    start = data.ctypes.data
    with _lock:
        _maps[start] = (start + data.nbytes, fd, int(offset), bool(writable), path)
    finalize(data, _forget, start, fd)


def _forget(start: int, fd: int) -> None:
    with _lock:
        _maps.pop(start, None)
        stops = _stops.pop(start, [])
    for stop in stops:  # its read-aheads end with it
        stop.set()
    try:
        os.close(fd)
    except OSError:
        pass


class FileRows:
    """The rows of a 2-D view as they lie in its file."""

    def __init__(self, fd: int, offset: int, pitch: int, width: int, rows: int, path: str,
                 address: int = 0):
        self.fd, self.offset, self.pitch, self.width, self.rows = fd, offset, pitch, width, rows
        self.path, self.address = path, address

    def scattered_in_memory(self) -> bool:
        """Are the rows apart in the file (one system call each) and all in
        the page cache? Such rows copy faster through the map: one copy that
        holds no lock, where a call per row took Python's (a panel of 32 KiB
        rows from the page cache moved at 2.4 GB/s on twelve threads)."""
        if self.pitch == self.width or not self.address:
            return False
        resident = _resident(self.address, self.address + (self.rows - 1) * self.pitch
                             + self.width)
        return resident is not None and resident(0, (self.rows - 1) * self.pitch + self.width)

    def read_into(self, dest: np.ndarray) -> None:
        """Fill the C-contiguous `dest` (same rows and width) from the file."""
        self._move(os.preadv, dest)

    def write_from(self, src: np.ndarray) -> None:
        """Write the C-contiguous `src` (same rows and width) into the file,
        and start writing those pages to the disk (see :func:`write_out`)."""
        self._move(_pwrite, src)
        write_out(self.fd, self.offset, (self.rows - 1) * self.pitch + self.width)

    def _move(self, call, buf: np.ndarray) -> None:
        """`call` (preadv or pwrite) for the rows, in one call where they are
        contiguous in the file."""
        flat = buf.reshape(-1).view(np.uint8)
        if self.pitch == self.width:
            _all(call, self.fd, flat, self.offset, self.path)
            return
        for r in range(self.rows):
            _all(call, self.fd, flat[r * self.width:(r + 1) * self.width],
                 self.offset + r * self.pitch, self.path)


#: sync_file_range's flag: start writing the range's dirty pages, not waiting.
_SYNC_FILE_RANGE_WRITE = 2


def write_out(fd: int, offset: int, nbytes: int) -> None:
    """Start writing bytes just written to `fd` out to the disk now
    (``sync_file_range``), so the disk works while the rest is written: the
    kernel starts by itself only past a tenth of the memory in dirty pages,
    and a product of 4.8 GB then waited for the final ``fsync`` (2.2-2.7 s
    of a streamed multiply on the H200 machine). Nothing where the system
    has no such call; the final ``fsync`` still makes it durable."""
    call = libc_call("sync_file_range", (ctypes.c_int, ctypes.c_int64, ctypes.c_int64,
                                         ctypes.c_uint))
    if call is not None and nbytes > 0:
        call(fd, offset, nbytes, _SYNC_FILE_RANGE_WRITE)


@functools.lru_cache(maxsize=None)
def libc_call(name: str, argtypes: tuple | None = None, restype=None):
    """libc's function `name` (its argument and result types set, errno kept
    for ``ctypes.get_errno``), looked up once; None where the system has none."""
    try:
        fn = getattr(ctypes.CDLL(None, use_errno=True), name)
    except (OSError, AttributeError):
        return None
    if argtypes is not None:
        fn.argtypes = list(argtypes)
    if restype is not None:
        fn.restype = restype
    return fn


def _pwrite(fd, buffers, offset):
    return os.pwrite(fd, buffers[0], offset)


def _all(call, fd: int, buf: np.ndarray, offset: int, path: str) -> None:
    """`call` (preadv or pwrite) until all of `buf` has moved."""
    done = 0
    while done < buf.nbytes:
        try:
            moved = call(fd, [buf[done:]], offset + done)
        except OSError as exc:
            raise OSError(f"{path}: {exc.strerror or exc}") from None
        if moved <= 0:
            raise OSError(f"{path}: ends {buf.nbytes - done} bytes early at byte "
                          f"{offset + done} (changed while in use?)")
        done += moved


def view_span(view: np.ndarray) -> tuple[int, int] | None:
    """The addresses of the first and past the last byte of the rows of the
    2-D `view` (rows contiguous); None for other arrays."""
    if view.ndim != 2 or not view.size or not copyable_rows(view):
        return None  # (strided or reversed rows: copied element by element)
    start = view.ctypes.data
    return start, start + (view.shape[0] - 1) * view.strides[0] + view.shape[1] * view.itemsize


def find(view: np.ndarray, writable: bool = False) -> FileRows | None:
    """The file rows behind the 2-D `view` (rows contiguous), where all of it
    lies in one registered map (a writable one where `writable`); None
    elsewhere."""
    span = view_span(view)
    if span is None:
        return None
    (start, end), width = span, view.shape[1] * view.itemsize
    with _lock:
        for base, (stop, fd, offset, can_write, path) in _maps.copy().items():
            if base <= start and end <= stop and (can_write or not writable):
                return FileRows(fd, offset + start - base, view.strides[0], width,
                                view.shape[0], path, start)
    return None



def _reader(view: np.ndarray) -> FileRows | None:
    """The file rows behind `view` where reading them beats a copy through
    the map (:meth:`FileRows.scattered_in_memory`)."""
    rows = find(view)
    return None if rows is None or rows.scattered_in_memory() else rows


def _writer(view: np.ndarray) -> FileRows | None:
    """The file rows behind `view`, where its map is writable."""
    return find(view, writable=True)


# The host-device copies read and write mapped files' rows by system calls
# (through :func:`find` as it is named at each copy, which a test may wrap).
hostrows.add_finders(_reader, _writer)

#: Threads, and bytes per read, of a :func:`prefetch`.
PREFETCH_THREADS = 4
PREFETCH_CHUNK = 8 << 20


def prefetch_scratch(nbytes: int, threads: int = PREFETCH_THREADS) -> int:
    """Host bytes a :func:`prefetch` of a view spanning `nbytes` of its file
    reads into: a chunk of at most :data:`PREFETCH_CHUNK` a thread (beside
    a run's plan: the account allows it where a run maps its operands)."""
    return max(1, threads) * min(PREFETCH_CHUNK, max(0, int(nbytes)))


def prefetch(view: np.ndarray, threads: int = PREFETCH_THREADS) -> threading.Thread | None:
    """Read the file bytes under `view` (on a registered map: its first to
    its last row, whole) into the page cache in the background, in order,
    where they are not there yet and there is room; returns the thread
    (None where nothing is read).

    The copies then find their rows in memory. Left to the copies, a block's
    column panel is a read of a few KiB from every row, all over the file
    (2.6 TFLOP/s from a cold 2.3 GB/s disk on the H200 machine); the
    kernel's own read-ahead (``MADV_WILLNEED``) stops after its window, a
    few hundred KiB. Each chunk is read with ``preadv`` into a scratch buffer
    of its thread's: a copy of memory beside a read of the disk."""
    span = view_span(view)
    if span is None:
        return None
    start, end = span
    with _lock:
        hit = next(((base, info) for base, info in _maps.copy().items()
                    if base <= start and end <= info[0]), None)
    if hit is None:
        return None
    base, (_, _, offset, _, path) = hit
    first, last = offset + start - base, offset + end - base
    if last - first > available_memory() // 2:
        return None  # it would push out what it read before it is used
    stop = threading.Event()
    with _lock:
        if base not in _maps:
            return None
        _stops.setdefault(base, []).append(stop)  # set when the map goes
    return _start(path, first, last, _resident(start, end), threads, stop)


def read_ahead(path: str, first: int, last: int,
               threads: int = PREFETCH_THREADS) -> threading.Event | None:
    """Read bytes `first`..`last` of `path` into the page cache in the
    background, in order after the read-aheads asked before, where they are
    not there yet and there is room; set the returned event to stop it (None
    where nothing is read). A multiply of files starts its inputs' reading so
    before it starts CUDA and plans, then maps its blocks."""
    if last <= first or last - first > available_memory() // 2:
        return None
    stop = threading.Event()
    _start(path, first, last, _file_resident(path, first, last), threads, stop)
    return stop


def _start(path, first, last, resident, threads, stop) -> threading.Thread:
    with _lock:  # in the order asked: the copies want A's rows before B's
        thread = threading.Thread(target=_read_ahead,
                                  args=(path, first, last, resident, threads, stop,
                                        _queue.last),
                                  name="summa-prefetch", daemon=True)
        _queue.last = thread
        thread.start()
    return thread


class _ReadAheadQueue:
    """This process's read-aheads, in the order started: one explicit holder
    (not a ``global``), since each waits for the one before.

    Attributes
    ----------
    last : threading.Thread or None
        The last read-ahead started (the next one waits for it to end).
    """

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        """Forget the last read-ahead (the state at import; a thread still
        running goes on and is not waited for)."""
        self.last: threading.Thread | None = None


_queue = _ReadAheadQueue()
#: Map start address -> the events that stop its read-aheads.
_stops: dict[int, list] = {}


def _read_ahead(path: str, first: int, last: int, resident, threads: int,
                stop: threading.Event, after: threading.Thread | None) -> None:
    """Once read-ahead `after` has ended, read bytes `first`..`last` of `path`
    in chunks on `threads` threads, in order, skipping the chunks `resident`
    says are in memory, until `stop` is set (the map it was for is gone, or
    the multiply that wanted it has ended or failed); errors are left to the
    copies (which report them). One file after the other: a streamed multiply
    whose first GEMM needs all of A's rows waited 6.3 s of a cold start while
    A and B were read side by side (benchmarks/files.py, N = 24576 on an H200),
    where reading A alone takes 2.7 s at that disk's rate."""
    while after is not None and after.is_alive() and not stop.is_set():
        after.join(0.05)
    if stop.is_set():
        return
    try:
        fd = os.open(path, os.O_RDONLY)  # its own read-ahead state, not the copies'
    except OSError:
        return
    chunks = iter(range(first, last, PREFETCH_CHUNK))
    lock = threading.Lock()

    def reader() -> None:
        scratch = np.empty(min(PREFETCH_CHUNK, last - first), dtype=np.uint8)
        while True:
            with lock:
                at = next(chunks, None)
            if at is None or stop.is_set():
                return
            if resident is not None and resident(at - first, min(last, at + PREFETCH_CHUNK)
                                                 - first):
                continue
            try:
                os.preadv(fd, [scratch[:min(PREFETCH_CHUNK, last - at)]], at)
            except OSError:
                return
    workers = [threading.Thread(target=reader, name="summa-prefetch", daemon=True)
               for _ in range(max(1, threads))]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    os.close(fd)


def meminfo_available() -> int | None:
    """The memory the system can give without swapping, in bytes
    (/proc/meminfo's MemAvailable); None where the system does not say."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def available_memory() -> int:
    """:func:`meminfo_available`, 0 where the system does not say (no room
    to read ahead into, nor to convert in)."""
    return meminfo_available() or 0


def _file_resident(path: str, first: int, last: int):
    """:func:`_resident` for bytes `first`..`last` of `path`, through a map of
    its own made for the question (None where it cannot be asked)."""
    try:
        with open(path, "rb") as fh:
            lo = first - first % mmap.ALLOCATIONGRANULARITY
            mm = mmap.mmap(fh.fileno(), last - lo, offset=lo, access=mmap.ACCESS_READ)
    except (OSError, ValueError):
        return None
    try:
        view = np.frombuffer(mm, dtype=np.uint8)
        resident = _resident(view.ctypes.data + first - lo, view.ctypes.data + last - lo)
        del view
    finally:
        try:
            mm.close()
        except BufferError:
            pass
    return resident


def _resident(start: int, end: int):
    """A test "are bytes a..b after `start` all in memory" for the mapped
    range `start`..`end` (mincore, looked at once now), or None where the
    system cannot say."""
    mincore = libc_call("mincore")
    if mincore is None:
        return None
    page = mmap.PAGESIZE
    lo = start - start % page
    vec = np.zeros(-(-(end - lo) // page), dtype=np.uint8)
    if mincore(ctypes.c_void_p(lo), ctypes.c_size_t(end - lo),
               vec.ctypes.data_as(ctypes.c_void_p)) != 0:
        return None
    shift = start - lo

    def resident(a: int, b: int) -> bool:
        return bool((vec[(a + shift) // page:-(-(b + shift) // page)] & 1).all())
    return resident
