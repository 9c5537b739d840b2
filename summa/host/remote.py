"""Arrays in the memory of another process on this machine, read and written
there by ``process_vm_readv``/``process_vm_writev`` (Linux).

summa's pool (:mod:`summa.pool`) runs a plain Python process's multiply on
worker processes. Copying the caller's A and B into shared memory first cost
a third of the pool's overhead on one H200 (4.3 GB at 4.5 GB/s: the shared
pages are allocated as they are written), and twice the arrays' size in
memory. Instead, a worker stands for each of the caller's arrays with a
placeholder of the same size that no one may touch (an inaccessible map),
registered here, and its host-device copies (:mod:`summa.device.staging`,
:mod:`summa.execution.outofcore`) ask :func:`find` for the caller's bytes behind a view
of it and move them between the two processes in one system call per 1024
rows, like :mod:`summa.host.filemaps` does for files. The product lands in the
caller's own result array. Under mpirun on one node the ranks read the
root's arrays so too (:mod:`summa.host.blocks`).

The owner allows its readers' launcher and that one's descendants to read it
(:func:`allow_readers`, for Yama's ``ptrace_scope`` 1); where the system still
refuses (scope 2 or 3, a sandbox), :func:`readable` says so and the arrays
are copied into shared memory as before; ``SUMMA_IN_PLACE=0`` asks for that.
"""

from __future__ import annotations

import ctypes
import functools
import mmap
import os
import threading
import types

import numpy as np

from .. import options
from ..device import hostrows
from .filemaps import libc_call, view_span
from ..runtime.cleanup import finalize

__all__ = ["allowed", "allow_readers", "describe", "placeholder", "find", "readable",
           "RemoteRows"]

#: Most iovecs one call takes (Linux's UIO_MAXIOV).
IOV_MAX = 1024


class _Iovec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


# Reentrant, the maps looked through as a copy: see summa.host.filemaps's lock.
_lock = threading.RLock()
#: placeholder start address -> (end address, pid, the owner's start address)
_maps: dict[int, tuple] = {}
_VM_ARGS = (ctypes.c_int, ctypes.POINTER(_Iovec), ctypes.c_ulong, ctypes.POINTER(_Iovec),
            ctypes.c_ulong, ctypes.c_ulong)


@functools.lru_cache(maxsize=None)
def _calls():
    """libc's process_vm_readv and process_vm_writev, as attributes (None
    where the system has them not)."""
    calls = {name: libc_call(name, _VM_ARGS, ctypes.c_ssize_t)
             for name in ("process_vm_readv", "process_vm_writev")}
    return None if None in calls.values() else types.SimpleNamespace(**calls)


def allowed(opts=None) -> bool:
    """May arrays be read in place in other processes here? Not where
    ``SUMMA_IN_PLACE=0`` says so in `opts` (default: the current options;
    copies into shared memory instead), nor where the system has no such
    calls."""
    return (opts or options.current()).in_place and _calls() is not None


def allow_readers(pid: int) -> None:
    """Let process `pid` and its descendants (a launcher and the workers it
    starts) read this process's memory where Yama lets only ancestors do so
    (``PR_SET_PTRACER``; it names one process at a time); nothing elsewhere."""
    try:
        ctypes.CDLL(None).prctl(0x59616D61, ctypes.c_ulong(pid), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def describe(x: np.ndarray) -> dict | None:
    """Where another process finds the C-contiguous array `x` of this one
    (None for other arrays, or where the system has no such calls)."""
    if _calls() is None or not isinstance(x, np.ndarray) or not x.size or \
            not x.flags.c_contiguous:
        return None
    return {"pid": os.getpid(), "address": int(x.ctypes.data), "nbytes": int(x.nbytes)}


def readable(where: dict) -> bool:
    """Can this process read the memory `where` (:func:`describe`) names?"""
    calls = _calls()
    if calls is None:
        return False
    probe = np.empty(1, dtype=np.uint8)
    local, remote = _Iovec(probe.ctypes.data, 1), _Iovec(where["address"], 1)
    return calls.process_vm_readv(where["pid"], ctypes.byref(local), 1, ctypes.byref(remote),
                                  1, 0) == 1


def placeholder(where: dict, shape, dtype) -> np.ndarray:
    """An array standing for the other process's array `where`: the same size,
    on memory no one may read or write (a stray touch faults at once instead
    of reading zeros), registered so that copies of its views move the
    owner's bytes (:func:`find`); forgotten when it goes."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape)) * dtype.itemsize
    if nbytes != where["nbytes"]:
        raise ValueError(f"the owner's array has {where['nbytes']} bytes, not {nbytes}")
    # Mapped writable (a writable array: the product's placeholder is `out`),
    # then made inaccessible; no memory is reserved for it.
    mm = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
                   | getattr(mmap, "MAP_NORESERVE", 0x4000))
    flat = np.frombuffer(mm, dtype=dtype)  # every view's base: it lives as long as they do
    start = flat.ctypes.data
    if ctypes.CDLL(None).mprotect(ctypes.c_void_p(start), ctypes.c_size_t(len(mm)), 0) != 0:
        raise OSError("mprotect refused to make a placeholder inaccessible")
    with _lock:
        _maps[start] = (start + nbytes, int(where["pid"]), int(where["address"]))
    finalize(flat, _forget, start, mm)
    return flat.reshape(shape)


def _forget(start: int, mm) -> None:
    with _lock:
        _maps.pop(start, None)
    try:
        mm.close()
    except (BufferError, ValueError):
        pass  # views still export it: it goes with the last


class RemoteRows:
    """The rows of a 2-D view of a placeholder, as they lie in its owner."""

    def __init__(self, pid: int, address: int, pitch: int, width: int, rows: int):
        self.pid, self.address, self.pitch, self.width, self.rows = \
            pid, address, pitch, width, rows

    def read_into(self, dest: np.ndarray) -> None:
        """Fill the C-contiguous `dest` (same rows and width) from the owner."""
        self._move("process_vm_readv", dest)

    def write_from(self, src: np.ndarray) -> None:
        """Write the C-contiguous `src` (same rows and width) into the owner."""
        self._move("process_vm_writev", src)

    def _move(self, name: str, buf: np.ndarray) -> None:
        call = getattr(_calls(), name)
        flat = buf.reshape(-1).view(np.uint8)
        rows = 1 if self.pitch == self.width else self.rows  # one range where contiguous
        width = self.width * (self.rows if rows == 1 else 1)
        for first in range(0, rows, IOV_MAX):
            count = min(IOV_MAX, rows - first)
            # The owner's rows as struct iovec pairs (base, length), made by NumPy: a
            # ctypes object per row held Python's lock ~1 us a row, all the copy
            # threads' rows in turn (a 256-column piece has 2 KiB rows).
            remote = np.empty((count, 2), dtype=np.uint64)
            remote[:, 0] = np.uint64(self.address) + (
                np.arange(first, first + count, dtype=np.uint64) * np.uint64(self.pitch))
            remote[:, 1] = width
            done, want = 0, count * width
            while done < want:  # a call may move less than asked: go on from there
                local = _Iovec(flat.ctypes.data + first * width + done, want - done)
                skip, rest = divmod(done, width)
                tail = remote[skip:]
                if rest:  # the first row's part already moved: past it, that much shorter
                    tail = tail.copy()
                    tail[0, 0] += np.uint64(rest)
                    tail[0, 1] -= np.uint64(rest)
                moved = call(self.pid, ctypes.byref(local), 1,
                             tail.ctypes.data_as(ctypes.POINTER(_Iovec)), count - skip, 0)
                if moved <= 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"the pool's owner (pid {self.pid}): its array cannot "
                                  f"be {'read' if 'read' in name else 'written'} "
                                  f"({os.strerror(err) if moved < 0 else 'it ended'})")
                done += moved


def find(view: np.ndarray) -> RemoteRows | None:
    """The owner's rows behind the 2-D `view` (rows contiguous) of a
    placeholder, or None where `view` is not one."""
    span = view_span(view) if _maps else None
    if span is None:
        return None
    (start, end), width = span, view.shape[1] * view.itemsize
    with _lock:
        for base, (stop, pid, owner) in _maps.copy().items():
            if base <= start and end <= stop:
                return RemoteRows(pid, owner + start - base, view.strides[0], width,
                                  view.shape[0])
    return None


def _found(view: np.ndarray) -> RemoteRows | None:
    return find(view)  # (as :func:`find` is named at each copy, which a test may wrap)


# The host-device copies read and write the owner's rows behind a placeholder.
hostrows.add_finders(_found, _found)
