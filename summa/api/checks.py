"""Checks of a multiply's operands, scalars and precision that every rank
makes alike from metadata alone, before any communication (so a bad call
raises the same ValueError everywhere instead of hanging a collective)."""

from __future__ import annotations

import numpy as np

__all__ = ["check_operands", "check_layouts", "check_scalars"]


def check_operands(A, B, C=None, op_a: str = "N", op_b: str = "N") -> tuple[int, int, int]:
    """Raise the same ValueError on every rank if ``op(A) @ op(B)`` (into C)
    cannot be formed; return ``(M, N, K)``. Looks at metadata only."""
    others = [B] + ([] if C is None else [C])
    if any(X.grid is not A.grid for X in others):
        raise ValueError("A, B and C must live on the same ProcessGrid")
    if any(X.backend.name != A.backend.name for X in others):
        raise ValueError("A, B and C must use the same backend")
    if any(X.dtype != A.dtype for X in others):
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
