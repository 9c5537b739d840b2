"""How each operand of a product lies in host memory: recorded by the planner
(:attr:`summa.planning.Plan.storage`) and followed by every executor, so that
no layout costs a copy of a whole operand on the host.

``op(x)`` (`x`, or ``x.T`` for op T and H) lies one of four ways:

``"rows"``
    Its rows are contiguous, one pitch apart (a C-ordered array, a slice of
    one): read as it lies; a copy engine takes any of its tiles as one 2-D
    copy.
``"cols"``
    Its columns are (a Fortran-ordered array, a ``.T`` view, op T of a
    C-ordered array): its transpose has contiguous rows. A tile is read as
    the rows of that transpose and kept so on the device, where the GEMM
    takes it as its transposed operand (cuBLAS and NumPy's BLAS read either
    way at the same rate, with no copy).
``"strided rows"``, ``"strided cols"``
    Neither (every other element, reversed, broadcast): tiles are gathered
    into contiguous memory by the host threads that copy them anyway (the
    page-locked staging chunks, :mod:`summa.device.staging`), by rows or by columns,
    whichever axis has the shorter step.

Op H of a complex array is op T conjugated: the GEMM conjugates (cuBLAS's op
C on a transposed operand; the backends' :meth:`summa.device.backend.Backend.gemm`,
``conj``), never a copy on the host.

Examples
--------
>>> import numpy as np
>>> x = np.zeros((4, 3))
>>> storage_of(x, "N"), storage_of(x, "T"), storage_of(np.asfortranarray(x), "N")
('rows', 'cols', 'cols')
>>> storage_of(x[::2, ::2], "N"), storage_of(x[::-1], "N")
('strided rows', 'strided rows')
"""

from __future__ import annotations

import numpy as np

# (what a 2-D copy takes lives with the device copies, below this package)
from ..device.hostrows import copyable_rows, pitch

__all__ = ["STORAGES", "storage_of", "op_view", "as_rows", "rows_shape", "transposed",
           "conjugated", "copyable_rows", "pitch"]

#: The ways an operand may lie (see the module).
STORAGES = ("rows", "cols", "strided rows", "strided cols")


def op_view(x: np.ndarray, trans: str) -> np.ndarray:
    """``op(x)`` but for the conjugation of op H: `x`, or the view ``x.T``."""
    return x if trans == "N" else x.T


def storage_of(x: np.ndarray, trans: str = "N") -> str:
    """How ``op(x)`` lies (:data:`STORAGES`): by rows where it can be read as
    it is, by columns where its transpose can, else strided along the axis
    of the shorter step."""
    view = op_view(x, trans)
    if copyable_rows(view):
        return "rows"
    if copyable_rows(view.T):
        return "cols"
    # (an axis of one or of stride 0, broadcast, has no step to follow)
    steps = [abs(s) if n > 1 and s else np.inf for n, s in zip(view.shape, view.strides)]
    return "strided cols" if steps[0] < steps[1] else "strided rows"


def transposed(storage: str) -> bool:
    """Is an operand of this storage read as its transpose's rows?"""
    return storage.endswith("cols")


def as_rows(x, storage: str):
    """`x` as its rows are copied: its transpose (a view) where `storage` is
    by columns. Its own inverse: on the device the copied rows, given back
    to it, are the operand the GEMM reads."""
    return x.T if transposed(storage) else x


def rows_shape(shape, storage: str) -> tuple:
    """The shape of :func:`as_rows` of an array of `shape`."""
    return tuple(shape)[::-1] if transposed(storage) else tuple(shape)


def conjugated(trans: str, dtype) -> bool:
    """Does op `trans` conjugate operands of `dtype` (H of a complex dtype)?"""
    return trans == "H" and np.dtype(dtype).kind == "c"
