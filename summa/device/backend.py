"""The NumPy/CuPy seam: which backend a rank gets (:func:`get_backend`), and
every backend name in one place.

The interface and the settings both read live in :mod:`summa.device.base`,
the backends in :mod:`summa.device.numpy_backend` and
:mod:`summa.device.cupy_backend`; their public names are imported here too,
so callers ask one module.

CuPy is imported only when it is asked for or detected, so CPU-only machines
never need it (as mpi4py registers its CuPy support only when CuPy imports).
"""

from __future__ import annotations

import importlib.util
import os

from .. import options
from ..options import GEMM_LIBRARIES, INT8_LIBRARIES, TRANSPOSE_A_SETTINGS, Options
from .base import (DTYPES, INT8_LT_MACS, Backend, compute_priority, cublaslt_path, gemm_library,
                   int8_library, resolve_dtype, transpose_a_setting, transpose_b_setting)
from .cupy_backend import CUDA_INVALID_VALUE, CupyBackend, clear_cuda_error, page_locked
from .numpy_backend import NumpyBackend

__all__ = ["Backend", "NumpyBackend", "CupyBackend", "get_backend", "cupy_available",
           "DTYPES", "resolve_dtype", "gemm_library", "GEMM_LIBRARIES", "compute_priority",
           "transpose_a_setting", "transpose_b_setting", "cublaslt_path", "TRANSPOSE_A_SETTINGS",
           "int8_library", "INT8_LIBRARIES", "CUDA_INVALID_VALUE", "clear_cuda_error",
           "page_locked", "INT8_LT_MACS"]


def cupy_available() -> bool:
    """True when CuPy imports and sees at least one CUDA device."""
    if importlib.util.find_spec("cupy") is None:
        return False
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # a CuPy without a driver raises CUDARuntimeError and others
        return False


def share_cpu_cores(ranks_on_node: int) -> int | None:
    """Give each rank's BLAS an equal share of the node's cores; return the share.

    Several ranks per node each running a BLAS thread pool sized for the whole
    node oversubscribe the cores, and spinning BLAS threads then starve MPI's
    progress (measured: 40x slower small multiplies with 2 ranks on 2 cores).
    Left alone when the user set OMP_NUM_THREADS / OPENBLAS_NUM_THREADS /
    MKL_NUM_THREADS, or when threadpoolctl is not installed (None returned).
    """
    if options.blas_threads_set():
        return None
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return None
    share = max(1, (os.cpu_count() or 1) // max(1, ranks_on_node))
    threadpool_limits(limits=share, user_api="blas")
    return share


def get_backend(name: str = "auto", local_rank: int = 0, opts: Options | None = None) -> Backend:
    """Choose a backend: ``"numpy"``, ``"cupy"`` or ``"auto"`` (CuPy when a GPU is seen).

    Parameters
    ----------
    name : str
        Requested backend.
    local_rank : int
        Node-local rank; the CuPy backend binds GPU ``local_rank % device_count``.
    opts : summa.options.Options, optional
        The settings the backend follows (default: the current ones, made and
        checked here: a bad ``SUMMA_*`` value is an error on CPU machines too).
    """
    if name not in ("auto", "numpy", "cupy"):
        raise ValueError(f"unknown backend {name!r}; choose auto, numpy or cupy")
    opts = opts if opts is not None else options.current()
    if name == "auto":
        name = "cupy" if cupy_available() else "numpy"
    if name == "numpy":
        return NumpyBackend(opts)
    if not cupy_available():
        raise ValueError("backend 'cupy' was requested but CuPy is not installed "
                         "or sees no GPU")
    import cupy
    return CupyBackend(local_rank % cupy.cuda.runtime.getDeviceCount(), opts)
