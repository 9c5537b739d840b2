"""The host's backend: NumPy arrays and the BLAS behind NumPy (one rank per
CPU socket, or the CPU side of tests and checks)."""

from __future__ import annotations

import numpy as np

from .base import Backend

__all__ = ["NumpyBackend"]


class NumpyBackend(Backend):
    """Host arrays and the BLAS behind NumPy."""

    name = "numpy"
    is_gpu = False
    xp = np
    dtypes = tuple(np.dtype(t) for t in (np.float64, np.float32, np.complex128, np.complex64))

    def asarray(self, host):
        return np.asarray(host)

    def to_host(self, arr, out=None):
        if out is None:
            return np.asarray(arr)
        out[...] = arr
        return out

    def gemm(self, alpha, a, b, c, beta=1.0, precision=None, conj=(False, False), scheme=None):
        if 0 in a.shape or 0 in b.shape:
            if beta == 0:
                c.fill(0)
            elif beta != 1:
                c *= beta
            return
        # BLAS reads either orientation as it lies; NumPy conjugates only by
        # copying. conj(a) @ conj(b) = conj(a @ b): where B is conjugated the
        # product is, after, so only `a` (a panel, or a strip of rows) is
        # ever copied, never all of B.
        flip = bool(conj[1])
        if bool(conj[0]) != flip:
            a = a.conj()
        # NaN/Inf inputs are reported once by the caller, not by every rank's BLAS.
        with np.errstate(invalid="ignore", over="ignore"):
            if beta == 0:  # straight into c: no product-sized temporary
                prod = np.matmul(a, b, out=c)
            else:
                prod = np.matmul(a, b)
            if flip:
                np.conjugate(prod, out=prod)
            if alpha != 1:
                prod *= alpha
            if beta != 0:
                if beta != 1:
                    c *= beta
                c += prod
