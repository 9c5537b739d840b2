"""Operands of two dtypes, multiplied as NumPy's matmul multiplies them: in
their common type (``np.result_type``: float32 and float64 in float64, a
real and a complex type in the complex one, an integer and a float in the
float), the operand of another type copied once into it, where that type is
one summa computes in."""

from __future__ import annotations

import sys
from dataclasses import replace

import numpy as np

from ..device.backend import DTYPES
from ..host.copies import converted
from ..host.filemaps import available_memory

__all__ = ["promoted", "common_type"]

#: The types summa computes in.
_TYPES = frozenset(np.dtype(t) for t in DTYPES.values())


def common_type(a: np.dtype, b: np.dtype) -> np.dtype | None:
    """The type NumPy's matmul multiplies `a` and `b` in, where summa
    computes in it (float16 on GPUs only: the backend says so); else None."""
    try:
        common = np.result_type(a, b)
    except TypeError:  # (no common type: strings, objects ...)
        return None
    return common if common in _TYPES else None


def promoted(given):
    """`given` (:class:`summa.api.operands.Operands`, 2-D operands of two
    dtypes with a :func:`common_type`) with the operand of another type
    copied once into it: in host memory on host threads, where the memory
    the system has free holds it; on a GPU there. Others as they are (the
    checks refuse them, naming both types).

    Raises
    ------
    ValueError
        The copy does not fit in the host's available memory, or the GPU's.
    """
    a, b = given.a.array, given.b.array
    common = common_type(a.dtype, b.dtype) if a.dtype != b.dtype else None
    if common is None or a.ndim != 2 or b.ndim != 2:
        return given
    return replace(given, a=_converted(given.a, common, "a"),
                   b=_converted(given.b, common, "b"))


def _converted(operand, dtype: np.dtype, name: str):
    """`operand` (:class:`summa.api.operands.Operand`) with its array in
    `dtype`, laid out as it lies (a copy), or as it is where it is of it."""
    x = operand.array
    if x.dtype == dtype:
        return operand
    need = x.size * dtype.itemsize
    if operand.device is None:
        free = available_memory()
        if free and need > free:
            raise ValueError(f"{name} is {x.dtype.name} and the product {dtype.name}: its copy "
                             f"in {dtype.name} takes {need / 2**30:.2f} GiB of host memory, "
                             f"{free / 2**30:.2f} GiB are available; convert it yourself "
                             "(or the other operand) to one dtype")
        return replace(operand, array=converted(x, dtype))
    cupy = sys.modules["cupy"]
    with cupy.cuda.Device(operand.device):
        try:
            return replace(operand, array=x.astype(dtype))
        except cupy.cuda.memory.OutOfMemoryError:
            raise ValueError(f"{name} is {x.dtype.name} and the product {dtype.name}: its copy "
                             f"in {dtype.name} ({need / 2**30:.2f} GiB) does not fit in the "
                             f"memory of GPU {operand.device}; convert one operand to the "
                             "other's dtype") from None
