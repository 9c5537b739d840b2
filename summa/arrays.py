"""Checks of NumPy arrays handed to ``summa.matmul`` (local: the callers
share the answer), used by the multiply and by the worker pool's owner."""

from __future__ import annotations

import numpy as np

__all__ = ["check_arrays", "op_shape"]


def op_shape(shape, trans: str) -> tuple:
    """The shape of ``op(x)`` for `x` of `shape`, `trans` N, T or H."""
    return tuple(shape) if trans == "N" else tuple(shape[::-1])


def check_arrays(a, b, out, trans_a: str, trans_b: str, backend):
    """``(m, n, k, dtype string)`` of ``op(a) @ op(b)`` into `out` (None: a
    new array), or the message saying why they cannot be used; `backend`
    checks the dtype. Local: the caller makes the answer collective."""
    for name, t in (("trans_a", trans_a), ("trans_b", trans_b)):
        if t not in ("N", "T", "H"):
            return f"{name} must be N, T or H, got {t!r}"
    arrays = {}
    for name, x in (("a", a), ("b", b)):
        if x is None:
            return f"the root rank must pass the array {name}"
        if not isinstance(x, np.ndarray):
            try:
                x = np.asarray(x)
            except Exception as exc:  # noqa: BLE001 -- anything not array-like
                return f"{name} is not an array ({type(x).__name__}: {exc})"
        if x.ndim != 2:
            return f"{name} must be a 2-D array, got {x.ndim}-D"
        arrays[name] = x
    a, b = arrays["a"], arrays["b"]
    if a.dtype != b.dtype:
        return (f"a is {a.dtype.name} but b is {b.dtype.name}; convert one "
                "(summa does not promote silently)")
    try:
        dtype = backend.check_dtype(a.dtype)
    except ValueError as exc:
        return str(exc)
    (m, k), (k2, n) = op_shape(a.shape, trans_a), op_shape(b.shape, trans_b)
    if k != k2:
        return f"inner dimensions differ: op(a) is {m}x{k}, op(b) is {k2}x{n}"
    if out is not None:
        if not isinstance(out, np.ndarray):
            return f"out must be a NumPy array, not {type(out).__name__}"
        if out.shape != (m, n) or out.dtype != dtype:
            return (f"out is {out.shape} {out.dtype.name}, but the product is "
                    f"({m}, {n}) {dtype.name}")
        if not out.flags.writeable:
            return "out is read-only"
        if out.size and out.strides[1] != out.itemsize:
            return "out must have contiguous rows (C order, or a slice of columns of one)"
        for name, x in (("a", a), ("b", b)):
            if np.may_share_memory(out, x):  # C's blocks would overwrite panels still to come
                return f"out overlaps {name}: the product needs memory of its own"
    return m, n, k, dtype.str
