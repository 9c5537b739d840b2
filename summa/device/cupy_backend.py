"""The GPU's backend: CuPy arrays on one GPU, GEMMs through cuBLAS (gemmEx,
or cuBLASLt), host copies staged through page-locked memory, and the CUDA
helpers its callers share (page-locked memory, refused copies).

CuPy is imported only when a :class:`CupyBackend` is made, so CPU-only
machines never need it.
"""

from __future__ import annotations

import contextlib
import functools
import inspect

import numpy as np

from .base import DTYPES, Backend, int8_library
from .lt import LtGemm, Product, Unavailable
from . import staging
from .hostrows import copyable_rows
from ..options import Options
from ..precision import ozaki, ozaki_gpu, warmup

__all__ = ["CupyBackend", "CUDA_INVALID_VALUE", "STAGED_MIN", "clear_cuda_error",
           "page_locked"]


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
            self._lt = LtGemm(cupy, self.options.cublaslt)

    def asarray(self, host):
        if self.stages(host):  # pageable and large: through page-locked chunks
            dev = self.xp.empty(host.shape, dtype=host.dtype)
            transfer = staging.stager_for(self.device).upload(dev, host)
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
            out = np.empty(arr.shape, dtype=arr.dtype) if out is None else out
            staging.stager_for(self.device).download(out, arr, self.record_event()).wait()
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
        return ozaki_gpu.same_b()

    def checked_later(self):
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
        (:func:`summa.precision.warmup.ready`), so that the free memory a
        plan reads after is what is left beside them."""
        if precision != "fp64-int8" or not self.has_int8_tensor_cores():
            return 0.0
        with self.xp.cuda.Device(self.device):
            seconds = warmup.ready(dtype, self)
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
