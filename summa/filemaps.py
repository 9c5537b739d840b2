"""Which host memory is a memory map of a file, so that copies into or out of
it read or write the file itself.

The out-of-core multiply of ``.npy`` files streams blocks that
:mod:`summa.io` maps into memory. Copied through the map, every 4 KiB page
is a fault (a read from the disk or the page cache, one page at a time):
7 TFLOP/s from the page cache on the H200 machine, where the GPU multiplies
at 55. Copied by ``preadv``/``pwrite`` of whole rows straight into (or out
of) the staging chunks, each copy thread moves its rows in a few system
calls. The maps are registered here by :mod:`summa.io`;
:mod:`summa.staging` asks :func:`find` for the file behind a source or
destination.
"""

from __future__ import annotations

import os
import threading
import weakref

import numpy as np

__all__ = ["register", "find", "FileRows"]

_lock = threading.Lock()
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
    weakref.finalize(data, _forget, start, fd)


def _forget(start: int, fd: int) -> None:
    with _lock:
        _maps.pop(start, None)
    try:
        os.close(fd)
    except OSError:
        pass


class FileRows:
    """The rows of a 2-D view as they lie in its file."""

    def __init__(self, fd: int, offset: int, pitch: int, width: int, rows: int, path: str):
        self.fd, self.offset, self.pitch, self.width, self.rows = fd, offset, pitch, width, rows
        self.path = path

    def read_into(self, dest: np.ndarray) -> None:
        """Fill the C-contiguous `dest` (same rows and width) from the file."""
        self._move(os.preadv, dest)

    def write_from(self, src: np.ndarray) -> None:
        """Write the C-contiguous `src` (same rows and width) into the file."""
        self._move(_pwrite, src)

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


def find(view: np.ndarray, writable: bool = False) -> FileRows | None:
    """The file rows behind the 2-D `view` (rows contiguous), where all of it
    lies in one registered map (a writable one where `writable`); None
    elsewhere."""
    if view.ndim != 2 or not view.size or view.strides[1] != view.itemsize:
        return None
    start = view.ctypes.data
    width = view.shape[1] * view.itemsize
    end = start + (view.shape[0] - 1) * view.strides[0] + width
    with _lock:
        for base, (stop, fd, offset, can_write, path) in _maps.items():
            if base <= start and end <= stop and (can_write or not writable):
                return FileRows(fd, offset + start - base, view.strides[0], width,
                                view.shape[0], path)
    return None
