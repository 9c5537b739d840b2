"""Operands of two dtypes, multiplied as NumPy's matmul multiplies them: in
their common type (``np.result_type``: float32 and float64 in float64, a
real and a complex type in the complex one, an integer and a float in the
float), the operand of another type copied once into it, where that type is
one summa computes in.

Integer and boolean operands (of any two such types) multiply exactly: both
are copied into float64, whose GEMM sums integers exactly while every sum
stays below 2**53 (checked first: the largest magnitudes' product times K),
and the float64 product is converted into NumPy's result type, wrapping as
NumPy's integer matmul wraps (a narrower type keeps the low bits; bool: any
term true). Where the plan stages host operands through page-locked chunks
(out of core on one GPU rank), they are kept as they lie and converted
inside those copies instead, the product too
(:attr:`summa.planning.plan.Plan.host_integers`): no whole float64 copy."""

from __future__ import annotations

import sys
from dataclasses import replace

import numpy as np

from ..device.backend import DTYPES
from ..host.copies import converted, extremes
from ..host.filemaps import available_memory

__all__ = ["promoted", "common_type", "product_type", "exact_integers", "as_float64"]

#: The types summa computes in.
_TYPES = frozenset(np.dtype(t) for t in DTYPES.values())

#: The largest integer below which float64 holds every integer: sums of
#: integer products below it are exact in a float64 GEMM.
EXACT = 2 ** 53


def product_type(a: np.dtype, b: np.dtype) -> np.dtype | None:
    """The dtype of summa's product of operands of dtypes `a` and `b`:
    NumPy's matmul's, where summa computes it (:func:`common_type`, or both
    integer or boolean); else None."""
    if _integral(a) and _integral(b):
        return np.result_type(a, b)
    return common_type(a, b)


def _integral(dtype: np.dtype) -> bool:
    return np.dtype(dtype).kind in "biu"


def common_type(a: np.dtype, b: np.dtype) -> np.dtype | None:
    """The type NumPy's matmul multiplies `a` and `b` in, where summa
    computes in it (float16 on GPUs only: the backend says so); else None."""
    try:
        common = np.result_type(a, b)
    except TypeError:  # (no common type: strings, objects ...)
        return None
    return common if common in _TYPES else None


def promoted(given, keep_integers: bool = False):
    """`given` (:class:`summa.api.operands.Operands`, operands of two
    dtypes with a :func:`common_type`: matrices, or stacks of them) with the
    operand of another type
    copied once into it: in host memory on host threads, where the memory
    the system has free holds it; on a GPU there. Others as they are (the
    checks refuse them, naming both types). Integer operands both in
    host memory are kept as they lie where `keep_integers`
    (:func:`exact_integers`).

    Raises
    ------
    ValueError
        The copy does not fit in the host's available memory, or the GPU's.
    """
    a, b = given.a.array, given.b.array
    if a.ndim == 0 or b.ndim == 0:  # (refused by name: not matrices)
        return given
    if _integral(a.dtype) and _integral(b.dtype):
        return exact_integers(given, keep_integers)
    common = common_type(a.dtype, b.dtype) if a.dtype != b.dtype else None
    if common is None:
        return given
    return replace(given, a=_converted(given.a, common, "a"),
                   b=_converted(given.b, common, "b"))


def exact_integers(given, keep: bool = False):
    """`given` (integer or boolean operands: matrices, or stacks of them)
    copied into float64, their
    product's type (:func:`product_type`) its ``result_dtype``: the float64
    product, exact, is converted into it
    (:meth:`summa.api.operands.Operands.give_back`), and an `out` filled
    from it (never written in place). With `keep`, operands both in host
    memory are not copied: ``kept_integers`` says so, and the plan decides
    (:meth:`summa.api.operands.Operands.held_arrays`: converted as they are
    staged, or whole, :func:`as_float64`).

    Raises
    ------
    ValueError
        A sum of their products may reach 2**53 (float64 would round it),
        or a copy does not fit in memory (:func:`promoted`)."""
    a, b = given.a.array, given.b.array
    k = max(a.shape[-2:])  # (K is one of the sides of a's matrices)
    largest = _largest(a), _largest(b)  # (each a pass over the operand)
    bound = largest[0] * largest[1] * k
    if bound >= EXACT:
        raise ValueError(
            f"a is {a.dtype.name} and b {b.dtype.name}: summa multiplies integers exactly in "
            f"float64, whose sums are exact below 2**53, and these values' products summed "
            f"over K may reach 2**{np.log2(float(bound)):.1f} (the largest magnitudes "
            f"{largest[0]} and {largest[1]}, K up to {k}): convert them to "
            "float64 yourself (rounded sums), or multiply smaller values")
    typed = replace(given, result_dtype=np.result_type(a.dtype, b.dtype), out_in_place=False)
    if keep and given.a.device is None and given.b.device is None:
        return replace(typed, kept_integers=True)
    return as_float64(typed)


def as_float64(given):
    """`given`'s operands copied whole into float64 (:func:`exact_integers`'s
    copies, made where a plan does not convert them as it stages them).

    Raises
    ------
    ValueError
        A copy does not fit in memory (:func:`promoted`)."""
    f64 = np.dtype(np.float64)
    return replace(given, a=_converted(given.a, f64, "a"), b=_converted(given.b, f64, "b"),
                   kept_integers=False)


def _largest(x) -> int:
    """The largest magnitude among the integers of `x` (NumPy or CuPy), as a
    Python int (``abs`` of the most negative one overflows its type)."""
    if x.size == 0:
        return 0
    low, high = extremes(x) if isinstance(x, np.ndarray) else (x.min(), x.max())
    return max(abs(int(low)), abs(int(high)))


def _converted(operand, dtype: np.dtype, name: str):
    """`operand` (:class:`summa.api.arrayview.Operand`) with its array in
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
