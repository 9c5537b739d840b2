"""Reference computations shared by the tests."""

from __future__ import annotations

import numpy as np

from summa.verify import reference_dtype, scaled_error, unit_roundoff


def op(x: np.ndarray, t: str) -> np.ndarray:
    return {"N": x, "T": x.T, "H": x.conj().T}[t]


def gemm_scaled_error(c, a, b, c0=None, alpha=1.0, beta=0.0, trans_a="N", trans_b="N",
                      precision=None) -> float:
    """Scaled error of `c` against a float64/complex128 reference of
    ``alpha op(a) op(b) + beta c0``, gauge ``K eps (|alpha||A||B| + |beta||C0|)``."""
    ref_t = reference_dtype(c.dtype)
    A, B = op(a.astype(ref_t), trans_a), op(b.astype(ref_t), trans_b)
    ref = alpha * (A @ B)
    gauge = abs(alpha) * (np.abs(A) @ np.abs(B))
    if beta != 0:
        ref = ref + beta * c0.astype(ref_t)
        gauge = gauge + abs(beta) * np.abs(c0.astype(ref_t))
    k = max(A.shape[1], 1)
    return scaled_error(c, ref, k * unit_roundoff(c.dtype, precision) * gauge)


def random_array(rng, shape, dtype) -> np.ndarray:
    dtype = np.dtype(dtype)
    x = rng.uniform(-1, 1, shape)
    if dtype.kind == "c":
        x = x + 1j * rng.uniform(-1, 1, shape)
    return x.astype(dtype)
