"""Host rows as a copy between host and device reaches them.

Whether a 2-D host array's rows are one 2-D copy (``cudaMemcpy2D``: rows
contiguous, one pitch apart), and, where host memory only stands for rows
that lie elsewhere (a memory map of a file, :mod:`summa.host.filemaps`;
another process's array, :mod:`summa.host.remote`), what moves them there.
Those modules add their finders here as they load: the host-device copies
(:mod:`summa.device.staging`) lie below the host package and import nothing
of it. A module not loaded has registered no memory, so it has nothing to
find either.
"""

from __future__ import annotations

import numpy as np

__all__ = ["copyable_rows", "pitch", "add_finders", "reader", "writer"]

#: finder(view) -> rows with ``read_into(dest)``, or None (see :func:`add_finders`).
_readers: list = []
#: finder(view) -> rows with ``write_from(src)``, or None.
_writers: list = []


def copyable_rows(x: np.ndarray) -> bool:
    """Does the 2-D `x` have contiguous rows one positive pitch apart (at
    least a row's width), as a 2-D copy (``cudaMemcpy2D``) takes them? Axes
    of length one count as contiguous whatever their stride says, and an
    empty array as copyable."""
    rows, cols = x.shape
    item = x.itemsize
    return 0 in x.shape or ((cols <= 1 or x.strides[1] == item)
                             and (rows <= 1 or x.strides[0] >= cols * item))


def pitch(x: np.ndarray) -> int:
    """Bytes from one row of `x` (:func:`copyable_rows`) to the next, as a 2-D
    copy is given them: a row's width where there is one row (whose stride
    may be anything)."""
    width = x.shape[1] * x.itemsize
    return int(x.strides[0]) if x.shape[0] > 1 else max(1, width)


def add_finders(read, write) -> None:
    """Have :func:`reader` ask `read` and :func:`writer` ask `write` (each
    ``finder(view) -> rows or None``) for the rows behind a view. The memory
    each finder knows is its own (a file's map is never another process's
    placeholder), so the order they are asked in does not matter."""
    _readers.append(read)
    _writers.append(write)


def reader(view: np.ndarray):
    """What reads the rows behind the 2-D host `view` faster than a copy of
    it (``rows.read_into(dest)``), or None: copy `view` itself."""
    return _first(_readers, view)


def writer(view: np.ndarray):
    """What writes rows into where the 2-D host `view` stands for
    (``rows.write_from(src)``), or None: write `view` itself."""
    return _first(_writers, view)


def _first(finders: list, view: np.ndarray):
    for find in finders:
        rows = find(view)
        if rows is not None:
            return rows
    return None
