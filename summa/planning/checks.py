"""Checks of a product's inputs, made before anything is planned or moved.

Of DistMatrix operands, scalars, precision and schedule (:func:`check_operands`,
:func:`check_layouts`, :func:`check_scalars`, :func:`check_schedule`): every
rank makes them alike from metadata alone, before any communication, so a
bad call raises the same ValueError everywhere instead of hanging a
collective. Of arrays held on one rank (:func:`check_arrays`: NumPy arrays,
or CuPy arrays on one GPU, as :mod:`summa.api.arrayview` views every other
kind): made where they are held, the callers share the answer (the planner
of arrays, :mod:`summa.planning.arrays`, and the pool's owner). The entry
points, the planner and the executors all ask these."""

from __future__ import annotations

import sys

import numpy as np

from ..host.storage import copyable_rows

__all__ = ["check_operands", "check_layouts", "check_scalars", "check_schedule",
           "check_arrays", "is_array", "not_in_place", "op_shape", "precision_refusal",
           "PRECISIONS", "SCHEDULES"]


def check_operands(A, B, C=None, op_a: str = "N", op_b: str = "N",
                   dtypes=None) -> tuple[int, int, int]:
    """Raise the same ValueError on every rank if ``op(A) @ op(B)`` (into C)
    cannot be formed; return ``(M, N, K)``. Looks at metadata only. `dtypes`:
    the dtype names A, B and C must have where they differ (integers a plan
    converts as it stages them, :attr:`summa.planning.plan.Plan.host_integers`)."""
    others = [B] + ([] if C is None else [C])
    if any(X.grid is not A.grid for X in others):
        raise ValueError("A, B and C must live on the same ProcessGrid")
    if any(X.backend.name != A.backend.name for X in others):
        raise ValueError("A, B and C must use the same backend")
    if dtypes is not None:
        if tuple(X.dtype.name for X in [A] + others) != tuple(dtypes)[:1 + len(others)]:
            raise ValueError(f"the plan converts {', '.join(dtypes)} operands as it stages "
                             f"them, not A {A.dtype.name}, B {B.dtype.name}"
                             + ("" if C is None else f", C {C.dtype.name}"))
    elif any(X.dtype != A.dtype for X in others):
        raise ValueError(f"dtypes differ: A {A.dtype.name}, B {B.dtype.name}"
                         + ("" if C is None else f", C {C.dtype.name}"))
    m, k = A.shape if op_a == "N" else A.shape[::-1]
    k2, n = B.shape if op_b == "N" else B.shape[::-1]
    if k != k2:
        raise ValueError(f"inner dimensions differ: op(A) is {m}x{k}, op(B) is {k2}x{n}")
    if C is not None and C.shape != (m, n):
        raise ValueError(f"C is {C.shape[0]}x{C.shape[1]}, expected {m}x{n}")
    return m, n, k


def check_layouts(A, B, C) -> None:
    """A's rows must be distributed like C's rows, B's columns like C's columns."""
    if A.layout.rows != C.layout.rows:
        raise ValueError(f"A's rows ({A.layout.rows}) and C's rows ({C.layout.rows}) "
                         "are distributed differently")
    if B.layout.cols != C.layout.cols:
        raise ValueError(f"B's columns ({B.layout.cols}) and C's columns "
                         f"({C.layout.cols}) are distributed differently")


#: The values of ``precision``: float64 as it is, TF32 tensor cores for
#: float32 and complex64, float64 from INT8 tensor cores (:mod:`summa.precision.ozaki`).
PRECISIONS = (None, "default", "tf32", "fp64-int8")


def check_scalars(alpha, beta, dtype, precision, backend) -> None:
    """Raise ValueError for complex scalars with real data, or a bad precision."""
    for name, value in (("alpha", alpha), ("beta", beta)):
        if dtype.kind != "c" and np.iscomplexobj(value) and np.imag(value) != 0:
            raise ValueError(f"{name}={value} is complex but the matrices are {dtype.name}")
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS[1:])}, "
                         f"got {precision!r}")
    if precision == "fp64-int8":
        if dtype not in (np.float64, np.complex128):
            raise ValueError(f"precision fp64-int8 emulates float64 and complex128 products; "
                             f"the data are {dtype.name}")
        if not backend.is_gpu:
            raise ValueError("precision fp64-int8 needs the cupy backend (INT8 tensor cores "
                             "of a GPU); on CPUs use the default precision")
        if not backend.has_int8_tensor_cores():
            raise ValueError(f"precision fp64-int8 needs INT8 tensor cores (compute capability "
                             f"7.5 or later); this GPU is {backend.describe()}")
    if precision == "tf32" and dtype.char not in "fFe":
        raise ValueError(f"precision tf32 applies to float32, complex64 and float16 data, "
                         f"not {dtype.name}")
    if precision == "tf32" and not backend.supports_tf32:
        raise ValueError("precision tf32 needs the cupy backend (TF32 is a GPU tensor-core mode)")


#: How the inner dimension is worked through: SUMMA's K panels, or column strips.
SCHEDULES = ("panels", "strips")


def check_schedule(schedule: str, grid_shape, out_of_core: bool = False) -> str:
    """Raise the same ValueError on every rank if `schedule` cannot run on a
    grid of `grid_shape` (no communication); return it."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}; got {schedule!r}")
    if schedule == "strips":
        if out_of_core:
            raise ValueError("schedule 'strips' runs in device memory only, not out of core")
        if isinstance(grid_shape, str):  # "PRxPC", as the API takes it
            grid_shape = grid_shape.lower().split("x")
        pr, pc = (int(d) for d in grid_shape)
        if pc != 1:
            raise ValueError(f"schedule 'strips' needs a grid of one column (P x 1), "
                             f"not {pr}x{pc}; give --grid {pr * pc}x1")
    return schedule


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
    types = (a.dtype, b.dtype)
    if out_dtype is not None and all(t.kind in "biu" for t in types):
        # integers kept as they lie, multiplied in float64 (converted as they are staged)
        types = (np.dtype(np.float64),) * 2
    if types[0] != types[1]:  # (pairs of a common type summa computes in are promoted first)
        return (f"a is {a.dtype.name} but b is {b.dtype.name}, and NumPy's type for their "
                "product is not one summa multiplies (float64, float32, complex128, "
                "complex64; float16 on GPUs): convert them")
    try:
        dtype = backend.check_dtype(types[0])
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
    """A NumPy array, or a CuPy one (an array on a GPU, :mod:`summa.api.arrayview`;
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


def precision_refusal(given, precision) -> str | None:
    """Why `precision` cannot be asked of the described operands `given`
    (integers, multiplied exactly in float64), or None."""
    if given.result_dtype is None or precision in (None, "default"):
        return None
    return (f"precision={precision!r} does not apply to integer operands: summa "
            "multiplies them exactly in float64")
