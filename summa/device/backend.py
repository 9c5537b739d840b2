"""The NumPy/CuPy seam: array module, device binding, in-place GEMM, host copies.

CuPy is imported only when it is asked for or detected, so CPU-only machines
never need it (as mpi4py registers its CuPy support only when CuPy imports).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import inspect
import os
import time

import numpy as np

from .. import options
from ..options import GEMM_LIBRARIES, INT8_LIBRARIES, TRANSPOSE_A_SETTINGS, Options
from ..host.storage import copyable_rows

__all__ = ["Backend", "NumpyBackend", "CupyBackend", "get_backend", "cupy_available",
           "DTYPES", "resolve_dtype", "gemm_library", "GEMM_LIBRARIES", "compute_priority",
           "transpose_a_setting", "transpose_b_setting", "cublaslt_path", "TRANSPOSE_A_SETTINGS",
           "int8_library", "INT8_LIBRARIES", "CUDA_INVALID_VALUE", "clear_cuda_error",
           "page_locked"]


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


def cupy_available() -> bool:
    """True when CuPy imports and sees at least one CUDA device."""
    if importlib.util.find_spec("cupy") is None:
        return False
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # a CuPy without a driver raises CUDARuntimeError and others
        return False


class _NothingChecked:
    """No product checked anything (NumPy: it has no float64 on INT8)."""

    @staticmethod
    def finite() -> bool:
        return True


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


#: cublasPointerMode_t: scalar results written to device memory.
_CUBLAS_POINTER_MODE_DEVICE = 1
# cudaDataType, cublasComputeType_t and cublasGemmAlgo_t values (stable in the CUDA ABI).
_CUDA_R_16F, _CUDA_R_32F, _CUDA_R_64F, _CUDA_C_32F, _CUDA_C_64F = 2, 0, 1, 4, 5
_CUBLAS_COMPUTE_32F, _CUBLAS_COMPUTE_32F_FAST_TF32, _CUBLAS_COMPUTE_64F = 68, 77, 70
_CUBLAS_GEMM_DEFAULT = -1
_CUDA_R_8I, _CUDA_R_32I, _CUBLAS_COMPUTE_32I = 3, 10, 72
#: ``cudaErrorInvalidValue``: the status of a copy or registration CUDA refuses
#: for memory it cannot use that way (callers recover and clear it).
CUDA_INVALID_VALUE = 1

#: Host arrays from this size on go through the stager (CupyBackend copies).
STAGED_MIN = 64 << 20


def page_locked(cupy, host: np.ndarray) -> bool:
    """Does CUDA know `host`'s memory as page-locked (allocated so, or
    registered)?"""
    try:
        attributes = cupy.cuda.runtime.pointerGetAttributes(host.ctypes.data)
    except cupy.cuda.runtime.CUDARuntimeError:
        clear_cuda_error(cupy)
        return False
    return attributes.type == 1  # cudaMemoryTypeHost


def clear_cuda_error(cupy) -> None:
    """Reset CUDA's last error after a refused copy we recover from.

    Otherwise it is reported later as someone else's (CuPy may not wrap the
    call).

    Parameters
    ----------
    cupy : module
        The imported ``cupy`` module.
    """
    clear = getattr(cupy.cuda.runtime, "getLastError", None)
    if clear is not None:
        clear()
#: dtype char -> (data type, compute type, dtype of alpha/beta)
_GEMM_TYPES = {
    "e": (_CUDA_R_16F, _CUBLAS_COMPUTE_32F, np.float32),  # fp16 inputs, fp32 accumulation
    "f": (_CUDA_R_32F, _CUBLAS_COMPUTE_32F, np.float32),
    "d": (_CUDA_R_64F, _CUBLAS_COMPUTE_64F, np.float64),
    "F": (_CUDA_C_32F, _CUBLAS_COMPUTE_32F, np.complex64),
    "D": (_CUDA_C_64F, _CUBLAS_COMPUTE_64F, np.complex128),
}


def _output_ld(c) -> int:
    """The leading dimension of GEMM output `c`, which must have unit stride
    along its rows (row-strided views, such as a column strip of C, are fine)."""
    item = c.itemsize
    if c.shape[0] <= 1:
        return max(c.shape[1], 1)
    if (c.shape[1] > 1 and c.strides[1] != item) or c.strides[0] % item \
            or c.strides[0] // item < c.shape[1]:
        raise ValueError("gemm needs an output with unit stride along its rows")
    return c.strides[0] // item


def _operand(xp, x, transposable: bool = True):
    """GEMM operand `x` as cuBLAS reads it: ``(array, leading dimension,
    transposed)``. Row-major views (unit stride along rows) pass as they are;
    column-major ones (unit stride down columns: a transposed copy's ``.T``),
    where `transposable`, as cuBLAS's transposed operand; anything else is
    copied to C order."""
    item = x.itemsize
    rows, cols = x.shape
    if cols == 1 or x.strides[1] == item:
        ld = x.strides[0] // item if rows > 1 else cols
        if ld >= max(1, cols) and x.strides[0] % item == 0:
            return x, max(ld, 1), False
    if transposable and (rows == 1 or x.strides[0] == item):
        ld = x.strides[1] // item if cols > 1 else rows
        if ld >= max(1, rows) and x.strides[1] % item == 0:
            return x, max(ld, 1), True
    x = xp.ascontiguousarray(x)
    return x, max(cols, 1), False


#: cublasOperation_t: as it lies, transposed, conjugate transposed.
_OP_N, _OP_T, _OP_C = 0, 1, 2


def _cublas_operand(xp, x, conj: bool, transposable: bool = True):
    """GEMM operand `x` (conjugated where `conj`) as cuBLAS takes it:
    ``(array, leading dimension, cublasOperation_t)``. A column-major one
    (:func:`_operand`) is conjugated by the GEMM itself (op C: op H of a
    C-ordered host array costs nothing); cuBLAS has no conjugate without
    transpose, so a row-major one is conjugated into a copy on the device."""
    x, ld, t = _operand(xp, x, transposable)
    if t:
        return x, ld, _OP_C if conj else _OP_T
    if conj:
        x = xp.conj(x)  # C-ordered
        ld = max(x.shape[1], 1)
    return x, ld, _OP_N


#: Elements the host's finiteness check looks at a time (a piece of rows).
FINITE_PIECE = 1 << 20


class _DoneEvent:
    """Host work is synchronous: every event has already happened."""

    def synchronize(self) -> None:
        pass


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


def _on_its_device(cls):
    """Every public method of `cls` (its own and inherited) runs on the
    backend's GPU (:meth:`Backend.on_device`), whatever device is current in
    the calling thread: a process may hold backends of several GPUs (a test
    session, calls on sub-communicators), and each construction makes its
    own GPU current. On a machine of two GPUs, a rank's GEMMs queued on the
    other rank's GPU made its timing events unready at the end, and its NCCL
    communicator was made on that GPU: NCCL refused two ranks on one GPU."""
    for name in dir(cls):
        method = inspect.getattr_static(cls, name)
        if name.startswith("_") or name == "on_device" or not inspect.isfunction(method):
            continue
        setattr(cls, name, _device_bound(method))
    return cls


def _device_bound(method):
    """`method` run on its backend's GPU (:func:`_on_its_device`)."""
    @functools.wraps(method)
    def bound(self, *args, **kwargs):
        with self.xp.cuda.Device(self.device):
            return method(self, *args, **kwargs)
    return bound


@_on_its_device
class CupyBackend(Backend):
    """CuPy arrays on one GPU, chosen by the node-local rank.

    Parameters
    ----------
    device : int
        CUDA device index this rank uses.
    opts : summa.options.Options, optional
        Its GEMM library (``gemm``, ``cublaslt``, ``int8_gemm``) and
        stream priority among them; default: the current options.
    """

    name = "cupy"
    is_gpu = True

    def __init__(self, device: int = 0, opts: Options | None = None):
        import cupy
        super().__init__(opts)
        library, priority = self.options.gemm, self.options.compute_priority
        self.xp = cupy
        self.device = int(device)
        cupy.cuda.Device(self.device).use()
        self.dtypes = tuple(np.dtype(t) for t in DTYPES.values())
        self.library = library
        self._stream = None
        if priority == "high":
            # CuPy may not wrap the range query; CUDA clamps a priority beyond
            # the device's range to its end, so a very low number means "highest".
            query = getattr(cupy.cuda.runtime, "deviceGetStreamPriorityRange", None)
            greatest = query()[1] if query is not None else -1000
            self._stream = cupy.cuda.Stream(non_blocking=True, priority=greatest)
        self._lt = self._int8_lt = None
        self._compiled = 0.0
        if library == "cublaslt":
            from .lt import LtGemm
            self._lt = LtGemm(cupy, self.options.cublaslt)

    def asarray(self, host):
        if self.stages(host):  # pageable and large: through page-locked chunks
            from .staging import stager_for
            dev = self.xp.empty(host.shape, dtype=host.dtype)
            transfer = stager_for(self.device).upload(dev, host)
            transfer.wait()
            self.xp.cuda.get_current_stream().wait_event(transfer.event())
            return dev
        try:
            return self.xp.asarray(host)
        except self.xp.cuda.runtime.CUDARuntimeError as exc:
            if exc.status != CUDA_INVALID_VALUE or not isinstance(host, np.ndarray):
                raise
        # CUDA refuses a copy whose host range is partly page-locked, as a small
        # array sharing a page with a locked one is (locking takes whole pages):
        # go through a page-locked buffer of our own.
        clear_cuda_error(self.xp)
        stage = self._pinned(host.shape, host.dtype)
        stage[...] = host
        arr = self.xp.asarray(stage)
        self.xp.cuda.get_current_stream().synchronize()  # before `stage` is reused
        return arr

    def to_host(self, arr, out=None):
        if isinstance(arr, self.xp.ndarray) and arr.ndim == 2 and \
                arr.nbytes >= STAGED_MIN and arr.flags.c_contiguous and \
                (out is None or self.stages(out)):
            from .staging import stager_for
            out = np.empty(arr.shape, dtype=arr.dtype) if out is None else out
            stager_for(self.device).download(out, arr, self.record_event()).wait()
            return out
        try:
            return self.xp.asnumpy(arr, out=out)
        except self.xp.cuda.runtime.CUDARuntimeError as exc:
            if exc.status != CUDA_INVALID_VALUE:
                raise
        clear_cuda_error(self.xp)
        stage = self._pinned(arr.shape, arr.dtype)
        arr.get(out=stage)
        self.xp.cuda.get_current_stream().synchronize()
        if out is None:
            return stage.copy()
        out[...] = stage
        return out

    def stages(self, host) -> bool:
        """Does a copy of `host` go through the stager (:mod:`summa.device.staging`):
        a large 2-D NumPy array, not page-locked or strided (its host threads
        gather it into the page-locked chunks: no copy of it first)? From
        pageable memory a plain copy runs at 6.5 GB/s, staged at ~40."""
        if not (isinstance(host, np.ndarray) and host.ndim == 2 and host.nbytes >= STAGED_MIN):
            return False
        return not copyable_rows(host) or not page_locked(self.xp, host)

    def _pinned(self, shape, dtype) -> np.ndarray:
        import cupyx
        return cupyx.empty_pinned(shape, dtype=dtype)

    def gemm(self, alpha, a, b, c, beta=1.0, precision=None, conj=(False, False), scheme=None):
        from cupy_backends.cuda.libs import cublas
        m, k = a.shape
        n = b.shape[1]
        if 0 in (m, n):
            return
        if precision == "fp64-int8":  # float64 from INT8 tensor cores
            from ..precision import ozaki, ozaki_gpu
            a, b = (self.xp.conj(x) if c_ else x for x, c_ in zip((a, b), conj))
            conj = (False, False)
            if k >= ozaki.K_NATIVE:
                ozaki_gpu.gemm(alpha, a, b, c, beta, backend=self,
                               scheme=scheme or ozaki_gpu.Scheme())
                return
            # a short sum (an edge panel): native float64 is faster and
            # within the gauge, where the scaling's rounding is not
            ozaki_gpu.refuse_not_finite(a, b)
            precision = None
        if k == 0:
            if beta != 1:
                c *= beta
            return
        # cuBLASLt's plans here take untransposed operands only.
        lt = self._lt is not None
        a, lda, a_t = _cublas_operand(self.xp, a, conj[0], transposable=not lt)
        b, ldb, b_t = _cublas_operand(self.xp, b, conj[1], transposable=not lt)
        ldc = _output_ld(c)  # a row-strided view (a column strip of C) is written in place
        data_type, compute, scalar = _GEMM_TYPES[c.dtype.char]
        if precision == "tf32" and c.dtype.char in "fF":
            compute = _CUBLAS_COMPUTE_32F_FAST_TF32
        alpha_h = np.array(alpha, dtype=scalar)
        beta_h = np.array(beta, dtype=scalar)
        # Row-major C = A B is column-major C^T = B^T A^T: swap the operands.
        # A column-major operand is the transpose of what that view expects.
        # beta=1 accumulates in place, so no C-sized temporary is ever made.
        if lt:
            from .lt import Product
            product = Product(data_type, n, m, k, b.data.ptr, ldb, a.data.ptr, lda, c.data.ptr,
                              ldc, self.xp.cuda.get_current_stream().ptr)
            self._lt(c.dtype.char, compute, product, alpha_h.ctypes.data, beta_h.ctypes.data,
                     scalar)
            return
        cublas.gemmEx(self.xp.cuda.device.get_cublas_handle(), b_t, a_t, n, m, k,
                      alpha_h.ctypes.data, b.data.ptr, data_type, ldb,
                      a.data.ptr, data_type, lda, beta_h.ctypes.data,
                      c.data.ptr, data_type, ldc, compute, _CUBLAS_GEMM_DEFAULT)

    def has_int8_tensor_cores(self) -> bool:
        # CuPy spells the capability as digits: "75" for 7.5, "90", "120"
        return int(self.xp.cuda.Device(self.device).compute_capability) >= 75

    def int8_product(self, a8, b8):
        """``a8 @ b8`` exactly in int32 through cuBLAS's integer tensor cores
        (:meth:`int8_gemm_tn`): B goes transposed, K and N are padded with
        zeros to multiples of 4, as those kernels need."""
        xp = self.xp
        m, k = a8.shape
        n = b8.shape[1]
        kp, np_ = -(-k // 4) * 4, -(-n // 4) * 4
        a = xp.zeros((m, kp), dtype=xp.int8)
        a[:, :k] = a8
        bt = xp.zeros((np_, kp), dtype=xp.int8)
        bt[:n, :k] = b8.T
        c = xp.empty((m, np_), dtype=xp.int32)
        self.int8_gemm_tn(a, bt, c)
        return c[:, :n]

    def int8_gemm_tn(self, a8, bt8, out, accumulate: bool = False) -> None:
        """``out = a8 @ bt8.T`` (``+=`` with `accumulate`), int8 in, int32
        out, exactly (K at most :data:`summa.precision.ozaki.K_EXACT`), 8I x 8I -> 32I,
        compute 32I: through ``cublasGemmEx``, or for large products cuBLASLt's
        fastest algorithm (:func:`int8_library`). Only this "TN" form (both
        operands with K contiguous) reaches the fast kernels on Hopper (1.0-1.3
        POPS against ~130 TOPS, DESIGN.md). All three C-contiguous; K and the
        columns of `out` multiples of 4."""
        from cupy_backends.cuda.libs import cublas
        m, k = a8.shape
        n = bt8.shape[0]
        library, index, asked = int8_library(m * n * k, self.options)
        if library == "cublaslt" and (asked or self._int8_lt is not False):
            from .lt import LtGemm, Product, Unavailable
            try:
                if not self._int8_lt:
                    self._int8_lt = self._lt or LtGemm(self.xp, self.options.cublaslt)
                product = Product(_CUDA_R_8I, n, m, k, bt8.data.ptr, k, a8.data.ptr, k,
                                  out.data.ptr, n, self.xp.cuda.get_current_stream().ptr)
                self._int8_lt.int8_tn(product, accumulate, index)
                return
            except Unavailable:
                if asked:
                    raise
                if self._int8_lt is None:  # no library: gemmEx from now on
                    self._int8_lt = False
                # else no algorithm for this shape (remembered there): gemmEx
        one = np.array(1, dtype=np.int32)
        beta = np.array(1 if accumulate else 0, dtype=np.int32)
        # Row-major out (m x n) is column-major out^T (n x m) = op_T(bt8^T) a8^T:
        # the first operand is bt8 read transposed, the second a8 as it lies.
        cublas.gemmEx(self.xp.cuda.device.get_cublas_handle(), 1, 0, n, m, k,
                      one.ctypes.data, bt8.data.ptr, _CUDA_R_8I, k, a8.data.ptr, _CUDA_R_8I, k,
                      beta.ctypes.data, out.data.ptr, _CUDA_R_32I, n, _CUBLAS_COMPUTE_32I,
                      _CUBLAS_GEMM_DEFAULT)

    def same_b(self):
        from ..precision import ozaki_gpu
        return ozaki_gpu.same_b()

    def checked_later(self):
        from ..precision import ozaki_gpu
        return ozaki_gpu.checked_later()

    def finite_probe(self, x):
        """Sums of ``|x|`` (complex: ``|re| + |im|``) over pieces of `x`, on the
        device, queued on the current stream: cuBLAS asum, so no kernel is
        compiled (CuPy's isfinite compiled for 4.6 s on a fresh machine). The
        sums are finite exactly where the elements are, but where a sum of
        finite elements overflows (then "perhaps not")."""
        from cupy_backends.cuda.libs import cublas
        asum = {"f": cublas.sasum, "d": cublas.dasum, "F": cublas.scasum,
                "D": cublas.dzasum}.get(x.dtype.char)
        if asum is None or not x.flags.c_contiguous:
            return self.xp.isfinite(x).all()  # float16, or a view: CuPy's kernels
        real = np.dtype(x.dtype.char.lower())
        step = 2**31 - 1  # cuBLAS's int n
        sums = self.xp.zeros(max(1, -(-x.size // step)), dtype=real)
        handle = self.xp.cuda.device.get_cublas_handle()
        mode = cublas.getPointerMode(handle)
        cublas.setPointerMode(handle, _CUBLAS_POINTER_MODE_DEVICE)  # results stay on the GPU
        try:
            for i, start in enumerate(range(0, x.size, step)):
                asum(handle, min(step, x.size - start), x.data.ptr + start * x.itemsize, 1,
                     sums.data.ptr + i * real.itemsize)
        finally:
            cublas.setPointerMode(handle, mode)
        return sums

    def probed_finite(self, probe) -> bool:
        value = probe.get()
        return bool(value.all() if value.dtype == bool else np.isfinite(value).all())

    def transpose(self, x, out, conj: bool = False) -> None:
        """``out[...] = x.T`` (conjugated where `conj`) on the current stream;
        `out` with contiguous rows (C-contiguous, or a strip of columns of
        such an array), `x` row-strided (cuBLAS geam, a tiled transpose, op C
        where conjugated; float16 by CuPy)."""
        from cupy_backends.cuda.libs import cublas
        m, n = x.shape
        geam = {"f": cublas.sgeam, "d": cublas.dgeam, "F": cublas.cgeam,
                "D": cublas.zgeam}.get(x.dtype.char)
        if geam is None or 0 in (m, n) or (m > 1 and out.strides[1] != out.itemsize):
            super().transpose(x, out, conj)
            return
        ld_out = out.strides[0] // out.itemsize if n > 1 else m
        x, ld, _ = _operand(self.xp, x, transposable=False)
        scalar = _GEMM_TYPES[x.dtype.char][2]
        one, zero = np.array(1, dtype=scalar), np.array(0, dtype=scalar)
        # Column-major: out^T (m x n, ld `ld_out`) = op_T(x viewed as n x m, ld
        # `ld`); beta 0 with B = C (in place, allowed) reads nothing.
        geam(self.xp.cuda.device.get_cublas_handle(), _OP_C if conj else _OP_T, _OP_N, m, n,
             one.ctypes.data, x.data.ptr, ld, zero.ctypes.data, out.data.ptr, ld_out,
             out.data.ptr, ld_out)

    def on_device(self):
        return self.xp.cuda.Device(self.device)

    def synchronize(self):
        self.xp.cuda.Device(self.device).synchronize()

    def prepare(self, precision, dtype) -> float:
        """fp64-int8's kernels compiled (or loaded from CuPy's cache on disk)
        and cuBLASLt's workspace made before a run
        (:func:`summa.precision.ozaki_gpu.ready`), so that the free memory a
        plan reads after is what is left beside them."""
        if precision != "fp64-int8" or not self.has_int8_tensor_cores():
            return 0.0
        from ..precision import ozaki_gpu
        with self.xp.cuda.Device(self.device):
            seconds = ozaki_gpu.ready(dtype, self)
        self._compiled += seconds
        return seconds

    def compile_seconds(self) -> float:
        """Seconds :meth:`prepare` spent compiling since this was last asked
        (a call's figure: prepared when it planned, reported when it ran)."""
        seconds, self._compiled = self._compiled, 0.0
        return seconds

    @contextlib.contextmanager
    def compute_stream(self):
        """The high-priority compute stream, when asked for, ordered after the
        caller's queued work on entry and before its later work on exit."""
        if self._stream is None:
            yield
            return
        caller = self.xp.cuda.get_current_stream()
        self._stream.wait_event(caller.record())
        try:
            with self._stream:
                yield
        finally:
            caller.wait_event(self._stream.record())

    def host_buffer(self, nbytes):
        return self._pinned(nbytes, np.uint8)

    def record_event(self):
        event = self.xp.cuda.Event(block=False, disable_timing=True)
        event.record()
        return event

    def timing_mark(self):
        event = self.xp.cuda.Event()
        event.record()
        return event

    def elapsed(self, start, stop):
        return self.xp.cuda.get_elapsed_time(start, stop) / 1e3

    def memory_in_use(self):
        return int(self.xp.get_default_memory_pool().used_bytes())

    def memory_reserved(self):
        return int(self.xp.get_default_memory_pool().total_bytes())

    def memory_free(self):
        # the GPU's unused memory and what CuPy's pool caches unused (a call
        # has it give those back: summa.device.account)
        with self.xp.cuda.Device(self.device):
            return int(self.xp.cuda.runtime.memGetInfo()[0]
                       + self.xp.get_default_memory_pool().free_bytes())

    def memory_total(self):
        return int(self.xp.cuda.runtime.memGetInfo()[1])

    def device_id(self):
        return self.xp.cuda.Device(self.device).pci_bus_id

    def describe(self):
        props = self.xp.cuda.runtime.getDeviceProperties(self.device)
        name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
        lt = ", cuBLASLt GEMM" if self._lt is not None else ""
        high = ", high-priority GEMM stream" if self._stream is not None else ""
        return f"cupy on GPU {self.device} ({name}{lt}{high})"


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
    opts = _given(opts)
    if name == "auto":
        name = "cupy" if cupy_available() else "numpy"
    if name == "numpy":
        return NumpyBackend(opts)
    if not cupy_available():
        raise ValueError("backend 'cupy' was requested but CuPy is not installed "
                         "or sees no GPU")
    import cupy
    return CupyBackend(local_rank % cupy.cuda.runtime.getDeviceCount(), opts)
