"""Copies between host arrays on host threads: NumPy copies and fills run
without the GIL, so a node's cores move an array several times faster than
one (and a transposing copy, in tiles, far faster than NumPy's own)."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

__all__ = ["parallel_copy", "converted", "touched", "extremes", "TRANSPOSE_TILE",
           "THREADED_MIN"]

#: Arrays from this size on are moved on several threads (smaller: one call).
THREADED_MIN = 64 << 20


def touched(shape, dtype, threads: int | None = None) -> np.ndarray:
    """A new C-ordered array whose pages are faulted in (zeros) on host
    threads: first touch runs at 2.4 GB/s on one thread of the H200 machine,
    32 on sixteen."""
    x = np.empty(shape, dtype)
    _by_rows(x, lambda rows: x[rows].fill(0), threads)
    return x


#: Side of the square tiles a transposing copy moves at a time
#: (:func:`parallel_copy`): each tile's rows and columns stay in the caches.
#: A C-ordered 8192² float64 from a Fortran-ordered one on 2 cores: 3.7
#: GB/s in tiles of 128, 0.3 GB/s as one NumPy copy (row by row, each read
#: a column apart), 1.7 in row slices on both cores.
TRANSPOSE_TILE = 128


def parallel_copy(dst: np.ndarray, src: np.ndarray, threads: int | None = None) -> None:
    """``dst[...] = src`` by rows on `threads` host threads (NumPy copies
    without the GIL: 9 GB/s on one thread, 45 on 16 on the H200 machine);
    where one of the two 2-D arrays lies by rows and the other by columns
    (a transposing copy), in square tiles of :data:`TRANSPOSE_TILE`; a
    stack of matrices one matrix at a time."""
    if dst.ndim > 2:
        for index in np.ndindex(*dst.shape[:-2]):
            parallel_copy(dst[index], src[index], threads)
        return
    if dst.ndim == 2 and isinstance(src, np.ndarray) and src.ndim == 2 and \
            _by_columns(dst) != _by_columns(src):
        _by_rows(dst, lambda rows: _tiles(dst, src, rows), threads)
        return
    _by_rows(dst, lambda rows: np.copyto(dst[rows], src[rows], casting="unsafe"), threads)


def converted(x: np.ndarray, dtype) -> np.ndarray:
    """`x`'s values in `dtype` (another type, another byte order), laid out
    as `x` lies (its order), copied on host threads (:func:`parallel_copy`)."""
    y = np.empty_like(x, dtype=dtype, subok=False)
    parallel_copy(y, x)
    return y


def extremes(x: np.ndarray, threads: int | None = None) -> tuple:
    """``(x.min(), x.max())`` of a non-empty array, as Python numbers, by
    rows on host threads (NumPy's reductions run without the GIL); a stack
    of matrices one matrix at a time."""
    found = []
    for index in np.ndindex(*x.shape[:-2]):
        part = x[index]
        _by_rows(part, lambda rows: found.append((part[rows].min(), part[rows].max())), threads)
    return min(f[0] for f in found).item(), max(f[1] for f in found).item()


def _by_columns(x: np.ndarray) -> bool:
    """Do `x`'s columns lie closer together than its rows?"""
    return x.shape[0] > 1 and x.shape[1] > 1 and abs(x.strides[0]) < abs(x.strides[1])


def _tiles(dst: np.ndarray, src: np.ndarray, rows) -> None:
    """``dst[rows] = src[rows]`` a square tile at a time."""
    r0, r1, _ = (rows if isinstance(rows, slice) else slice(None)).indices(dst.shape[0])
    t = TRANSPOSE_TILE
    for i in range(r0, r1, t):
        i1 = min(i + t, r1)
        for j in range(0, dst.shape[1], t):
            np.copyto(dst[i:i1, j:j + t], src[i:i1, j:j + t], casting="unsafe")


def _by_rows(x: np.ndarray, move, threads: int | None) -> None:
    """``move(rows)`` for slices of `x`'s rows on `threads` host threads
    (default up to 16), or once for all of it (``...``) where it is small."""
    threads = threads or min(16, os.cpu_count() or 1)
    if x.ndim < 1 or x.shape[0] < 2 * threads or x.nbytes < THREADED_MIN:
        move(...)
        return
    step = -(-x.shape[0] // (4 * threads))
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda r: move(slice(r, r + step)), range(0, x.shape[0], step)))
