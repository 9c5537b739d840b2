"""The backends' common ground: the :class:`Backend` interface (with the
host's answers as its defaults) and the settings and dtypes both backends read.

:class:`summa.device.numpy_backend.NumpyBackend` and
:class:`summa.device.cupy_backend.CupyBackend` build on it;
:func:`summa.device.backend.get_backend` chooses between them.
"""

from __future__ import annotations

import contextlib
import time

import numpy as np

from .. import options
from ..options import GEMM_LIBRARIES, INT8_LIBRARIES, TRANSPOSE_A_SETTINGS, Options

__all__ = ["Backend", "DTYPES", "resolve_dtype", "gemm_library", "GEMM_LIBRARIES",
           "compute_priority", "transpose_a_setting", "transpose_b_setting", "cublaslt_path",
           "TRANSPOSE_A_SETTINGS", "int8_library", "INT8_LIBRARIES", "INT8_LT_MACS"]


def _given(opts: Options | None) -> Options:
    """`opts`, else the current options (:func:`summa.options.current`)."""
    return opts if opts is not None else options.current()


def gemm_library(opts: Options | None = None) -> str:
    """The GPU GEMM library (``SUMMA_GEMM``, :data:`GEMM_LIBRARIES`) of `opts`
    (default: the current options).

    With ``cublaslt``, ``SUMMA_CUBLASLT`` may name the libcublasLt file to load
    (e.g. another CUDA release's, to compare its kernels); it must exist.
    """
    return _given(opts).gemm


#: Where "auto" starts timing cuBLASLt: a 32768 x 32768 x 32768 product ran
#: 1.29x gemmEx's rate through it (benchmarks/fp64_int8_speed.py); out-of-core
#: tiles of 2**41.4 gained nothing (its choice there was gemmEx's own), so smaller ones
#: skip the timing (~1.3 s a shape, once).
INT8_LT_MACS = 1 << 42


def int8_library(macs: int, opts: Options | None = None) -> tuple[str, int | None, bool]:
    """``(library, index, asked)`` for an INT8 product of `macs` multiply-adds
    under ``SUMMA_INT8_GEMM`` of `opts` (default: the current options;
    :data:`INT8_LIBRARIES`): "auto" (the default) sends products of at least
    :data:`INT8_LT_MACS` multiply-adds through cuBLASLt's fastest algorithm
    for their shape (timed once in bursts, remembered:
    :meth:`summa.device.lt.LtGemm.int8_tn`), the rest through ``cublasGemmEx``;
    "gemmex" all through gemmEx; "cublaslt" all from 2**30 on through
    cuBLASLt, "cublaslt:I" through its heuristic's I-th algorithm. Returns
    "gemmex" or "cublaslt", with cuBLASLt's heuristic's index asked or None
    (its timed fastest), and whether cuBLASLt was asked by name (else, where
    it cannot make the product, gemmEx does). Products under 2**30 stay on
    gemmEx whatever is asked (microseconds each: no timing pays)."""
    name, _, index = _given(opts).int8_gemm.partition(":")
    if name == "gemmex" or macs < (INT8_LT_MACS if name == "auto" else 1 << 30):
        return "gemmex", None, False
    return "cublaslt", int(index) if index else None, name == "cublaslt"


def cublaslt_path(opts: Options | None = None) -> str | None:
    """The libcublasLt file ``SUMMA_CUBLASLT`` of `opts` names (None: CuPy's)."""
    return _given(opts).cublaslt


def compute_priority(opts: Options | None = None) -> str:
    """``SUMMA_COMPUTE_PRIORITY`` of `opts`: ``default``, or ``high`` to run
    the SUMMA loop's GEMMs on a stream of the highest priority (experimental:
    the block scheduler then feeds GEMMs before NCCL's kernels, which run in
    the gaps)."""
    return _given(opts).compute_priority


def transpose_a_setting(opts: Options | None = None) -> str:
    """``SUMMA_TRANSPOSE_A`` of `opts`: whether in-memory panel GEMMs read A
    from a transposed (column-major) copy of each panel: ``auto`` (where
    measured faster, :func:`summa.planning.tuning.transposes_a`), ``yes`` or ``no``."""
    return _given(opts).transpose_a


def transpose_b_setting(opts: Options | None = None) -> str:
    """``SUMMA_TRANSPOSE_B`` of `opts`: whether panel GEMMs read B's panels
    that lie by columns from a row-major copy of each: ``auto`` (where
    measured faster, :func:`summa.planning.tuning.transposes_b`), ``yes`` or ``no``."""
    return _given(opts).transpose_b


#: dtypes summa computes in, by the names the CLI accepts.
DTYPES = {
    "float64": np.float64, "float32": np.float32, "float16": np.float16,
    "complex128": np.complex128, "complex64": np.complex64,
}


def resolve_dtype(dtype) -> np.dtype:
    """Return the NumPy dtype for `dtype` or raise ValueError naming the choices."""
    try:
        dt = np.dtype(dtype)
    except TypeError:
        dt = None
    if dt is None or dt.type not in DTYPES.values():
        raise ValueError(f"unsupported dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    if not dt.isnative:  # (a big-endian file's, say): NumPy's name would hide why
        native = dt.newbyteorder("=")
        raise ValueError(f"dtype {dt.str} is {native.name} in non-native byte order; summa "
                         f"multiplies native {native.name} ({native.str}): convert it, "
                         f"e.g. x.astype('{native.str}')")
    return dt



class _NothingChecked:
    """No product checked anything (NumPy: it has no float64 on INT8)."""

    @staticmethod
    def finite() -> bool:
        return True


#: Elements the host's finiteness check looks at a time (a piece of rows).
FINITE_PIECE = 1 << 20


class _DoneEvent:
    """Host work is synchronous: every event has already happened."""

    def synchronize(self) -> None:
        pass


class Backend:
    """Array operations one rank needs; subclasses bind NumPy or CuPy.

    Attributes
    ----------
    name : str
        ``"numpy"`` or ``"cupy"``.
    xp : module
        The array module.
    device : int or None
        The GPU this rank uses, None on the CPU.
    options : summa.options.Options
        The settings it was made with (default: the current ones), which
        the work given to it follows.
    is_gpu : bool
        Arrays and GEMMs live on a GPU (device memory, streams, events).
        Callers ask this, or the capabilities below, never the name.
    """

    name = "?"
    is_gpu = False

    @property
    def overlaps_gemm(self) -> bool:
        """Do broadcasts progress while a GEMM runs? On a device, yes; CPU
        ranks move MPI data only while they are inside MPI calls."""
        return self.is_gpu

    @property
    def supports_ipc(self) -> bool:
        """Can peers on the node copy this rank's blocks directly (CUDA IPC)?"""
        return self.is_gpu

    @property
    def supports_tf32(self) -> bool:
        """Does precision ``tf32`` (GPU tensor cores) apply?"""
        return self.is_gpu
    xp = np
    device = None
    dtypes = ()

    def __init__(self, opts: Options | None = None):
        self.options = _given(opts)

    def check_dtype(self, dtype) -> np.dtype:
        dt = resolve_dtype(dtype)
        if dt not in self.dtypes:
            raise ValueError(f"dtype {dt.name} is not supported on the {self.name} backend "
                             f"(supported: {', '.join(d.name for d in self.dtypes)})")
        return dt

    def asarray(self, host: np.ndarray):
        """Copy a host array to this backend's memory (no copy on NumPy)."""
        raise NotImplementedError

    def to_host(self, arr, out: np.ndarray | None = None) -> np.ndarray:
        """Return `arr` as a NumPy array (written into `out` when given)."""
        raise NotImplementedError

    def gemm(self, alpha, a, b, c, beta=1.0, precision: str | None = None,
             conj: tuple = (False, False), scheme=None) -> None:
        """``c = alpha * (op(a) @ op(b)) + beta * c`` in place (accumulates by
        default), op conjugating where `conj` (A's, B's) says.

        `a` and `b` may be row-strided views (unit stride along their last
        axis), so panels can be multiplied where they lie, or column-major
        (``t.T`` of a C-ordered `t`: read transposed, no copy); `c` has unit
        stride along its rows.
        `precision` ``"tf32"`` lets float32 products use TF32 tensor cores;
        ``"fp64-int8"`` makes float64 from INT8 products as `scheme` says
        (:class:`summa.precision.ozaki_gpu.Scheme`, a plan's
        :attr:`summa.planning.Plan.scheme`: the rows a product takes at a
        time; None: the defaults).
        """
        raise NotImplementedError

    def transpose(self, x, out, conj: bool = False) -> None:
        """``out[...] = x.T`` (conjugated where `conj`); `out` is C-contiguous."""
        if conj:
            self.xp.conjugate(x.T, out=out)
        else:
            out[...] = x.T

    def conjugate(self, x) -> None:
        """``x[...] = x.conj()`` in place (where it lies: on the device)."""
        self.xp.conjugate(x, out=x)

    def on_device(self):
        """A context in which the work queued runs on this backend's GPU, the
        caller's current device given back on leaving (nothing on NumPy)."""
        return contextlib.nullcontext()

    def synchronize(self) -> None:
        """Wait for all queued device work (no-op on NumPy)."""

    def prepare(self, precision, dtype) -> float:
        """Make ready what products of `dtype` in `precision` compile on
        first use in this process; seconds it took (0: nothing to do)."""
        return 0.0

    def compile_seconds(self) -> float:
        """Seconds :meth:`prepare` spent compiling since this was last asked."""
        return 0.0

    def has_int8_tensor_cores(self) -> bool:
        """Can this backend's device multiply int8 on tensor cores?"""
        return False

    def same_b(self):
        """A context in which products given the same `b` may reuse what they
        made of it (float64 on INT8: its residues); `b` must not change."""
        return contextlib.nullcontext()

    def checked_later(self):
        """A context in which float64-on-INT8 products check their inputs for
        Inf/NaN without waiting; its object's ``finite()`` says at the end."""
        return contextlib.nullcontext(_NothingChecked())

    def finite_probe(self, x):
        """A value, queued and not waited for, that :meth:`probed_finite`
        turns into "every element of `x` is finite" (False: perhaps not).
        On the host in pieces of rows, so that the check of a product makes
        no temporary of its size (one CPU rank's call takes no more memory
        than its result)."""
        if x.ndim != 2:
            return bool(np.isfinite(x).all())
        step = max(1, FINITE_PIECE // max(1, x.shape[1]))
        return all(bool(np.isfinite(x[i:i + step]).all()) for i in range(0, x.shape[0], step))

    def probed_finite(self, probe) -> bool:
        """The answer of a :meth:`finite_probe` (waits for it): True where
        every element was finite, False where perhaps not."""
        return bool(probe)

    def all_finite(self, x) -> bool:
        """Is every element of `x` finite?"""
        return self.probed_finite(self.finite_probe(x)) or bool(self.xp.isfinite(x).all())

    def int8_product(self, a8, b8):
        """``a8 @ b8`` of int8 operands, exactly, as int32 (the caller keeps K
        at most :data:`summa.precision.ozaki.K_EXACT`, so no sum overflows)."""
        return (np.asarray(a8).astype(np.int64) @ np.asarray(b8).astype(np.int64)).astype(
            np.int32)

    def host_buffer(self, nbytes: int) -> np.ndarray:
        """Flat uint8 host buffer for staging, pinned where that helps."""
        return np.empty(nbytes, dtype=np.uint8)

    def compute_stream(self):
        """Context in which the SUMMA loop queues its GEMMs (a no-op on the host)."""
        return contextlib.nullcontext()

    def record_event(self):
        """Mark the current point of the work queue; ``.synchronize()`` waits for it."""
        return _DoneEvent()

    def timing_mark(self):
        """A point in time of the work queue, for :meth:`elapsed`."""
        return time.perf_counter()

    def elapsed(self, start, stop) -> float:
        """Seconds between two marks (device time on GPUs; call after synchronizing)."""
        return stop - start

    def memory_in_use(self) -> int:
        """Bytes of live arrays in this backend's allocator (0 where unknown)."""
        return 0

    def memory_reserved(self) -> int:
        """Bytes the allocator holds from the device, freed blocks included (its
        high-water mark; 0 where unknown)."""
        return 0

    def memory_free(self) -> int | None:
        """Bytes an allocation could still get on the device: free device memory
        plus the allocator's freed blocks (None: host memory, not tracked here)."""
        return None

    def memory_total(self) -> int | None:
        """Bytes of device memory in all (None: host memory, not tracked here)."""
        return None

    def describe(self) -> str:
        return self.name

    def device_id(self) -> str:
        """An identifier of this rank's device unique on its node ("cpu" on NumPy)."""
        return "cpu"
