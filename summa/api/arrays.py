"""Checks of arrays handed to ``summa.matmul`` (local: the callers share the
answer), used by the multiply and by the worker pool's owner: NumPy arrays,
or CuPy arrays on one GPU (:mod:`summa.api.operands` views every other kind as
one of the two first)."""

from __future__ import annotations

import sys

import numpy as np

from ..host.storage import copyable_rows

__all__ = ["check_arrays", "is_array", "not_in_place", "op_shape"]


def op_shape(shape, trans: str) -> tuple:
    """The shape of ``op(x)`` for `x` of `shape`, `trans` N, T or H."""
    return tuple(shape) if trans == "N" else tuple(shape[::-1])


def check_arrays(a, b, out, trans_a: str, trans_b: str, backend, out_in_place: bool = True,
                 out_dtype=None):
    """``(m, n, k, dtype string)`` of ``op(a) @ op(b)`` into `out` (None: a
    new array), or the message saying why they cannot be used; `backend`
    checks the dtype. `a`, `b` and `out` are NumPy arrays (others are
    converted), or CuPy arrays where they lie on a GPU. `out_in_place`
    False: `out` is filled from a product of its own at the end
    (:attr:`summa.api.operands.Operands.out_in_place`), so its layout and
    what it shares do not matter; `out_dtype`, the type it must have where
    the product is given back in another (integers computed in float64).
    Local: the caller makes the answer collective."""
    for name, t in (("trans_a", trans_a), ("trans_b", trans_b)):
        if t not in ("N", "T", "H"):
            return f"{name} must be N, T or H, got {t!r}"
    arrays = {}
    for name, x in (("a", a), ("b", b)):
        if x is None:
            return f"the root rank must pass the array {name}"
        if not is_array(x):
            try:
                x = np.asarray(x)
            except Exception as exc:  # noqa: BLE001 -- anything not array-like
                return f"{name} is not an array ({type(x).__name__}: {exc})"
        if x.ndim != 2:
            return (f"{name} must be a 2-D array (or 1-D, a vector), got {x.ndim}-D"
                    + (": summa.matmul multiplies stacks of matrices; a Matmul is planned "
                       "for one pair (execute it for each)" if x.ndim > 2 else ""))
        arrays[name] = x
    a, b = arrays["a"], arrays["b"]
    if a.dtype != b.dtype:  # (pairs of a common type summa computes in are promoted first)
        return (f"a is {a.dtype.name} but b is {b.dtype.name}, and NumPy's type for their "
                "product is not one summa multiplies (float64, float32, complex128, "
                "complex64; float16 on GPUs): convert them")
    try:
        dtype = backend.check_dtype(a.dtype)
    except ValueError as exc:
        return str(exc)
    (m, k), (k2, n) = op_shape(a.shape, trans_a), op_shape(b.shape, trans_b)
    if k != k2:
        return f"inner dimensions differ: op(a) is {m}x{k}, op(b) is {k2}x{n}"
    if out is not None:
        if not is_array(out):
            return f"out must be a NumPy array, not {type(out).__name__}"
        want = dtype if out_dtype is None else np.dtype(out_dtype)
        if out.shape != (m, n) or out.dtype != want:
            return (f"out is {out.shape} {out.dtype.name}, but the product is "
                    f"({m}, {n}) {want.name}")
        if not getattr(out.flags, "writeable", True):  # (CuPy's arrays are all writeable)
            return "out is read-only"
        refusal = not_in_place(out, a, b) if out_in_place else None
        if refusal:
            return refusal
    return m, n, k, dtype.str


def not_in_place(out, a, b) -> str | None:
    """Why the product cannot be written into `out` where it lies while `a`
    and `b` are read (NumPy or CuPy arrays), or None where it can."""
    if not copyable_rows(out):  # (written a row at a time, one positive pitch apart)
        return "out must have contiguous rows (C order, or a slice of columns of one)"
    for name, x in (("a", a), ("b", b)):
        if _overlap(out, x):  # C's blocks would overwrite panels still to come
            return f"out overlaps {name}: the product needs memory of its own"
    return None


def is_array(x) -> bool:
    """A NumPy array, or a CuPy one (an array on a GPU, :mod:`summa.api.operands`;
    CuPy is imported already where there is one)."""
    cupy = sys.modules.get("cupy")
    device_array = getattr(cupy, "ndarray", None)
    return isinstance(x, np.ndarray) or (device_array is not None and isinstance(x, device_array))


def _overlap(out, x) -> bool:
    """May `out` and `x` share memory? Arrays in different memories cannot."""
    if isinstance(out, np.ndarray) != isinstance(x, np.ndarray):
        return False
    if isinstance(out, np.ndarray):
        return bool(np.may_share_memory(out, x))
    return bool(sys.modules["cupy"].may_share_memory(out, x))  # both on a GPU: CuPy is in
