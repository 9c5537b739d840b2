"""cuBLASLt matrix products with a measured choice of algorithm.

``cublasGemmEx`` runs the first algorithm its heuristic proposes. For large
GEMMs the fastest of the heuristic's first few candidates can be several
percent faster (XLA times them too, which is part of why JAX's products ran
faster per GPU than CuPy's in our measurements), so :class:`LtGemm` asks
cuBLASLt for up to :data:`CANDIDATES` algorithms that suit the full product,
times each on a slice of the real operands writing to a scratch output, and
keeps the fastest for that shape, layout and alignment for the life of the
process. The same product then always uses the same algorithm, so repeated
runs give the same bits.

Chosen with ``SUMMA_GEMM=cublaslt`` (see :class:`summa.device.cupy_backend.CupyBackend`).
"""

from __future__ import annotations

import ctypes
import json
import os
from dataclasses import dataclass

import numpy as np

from .. import options

__all__ = ["LtGemm", "Product", "Unavailable", "CANDIDATES"]

#: Algorithms proposed by the heuristic that are timed per shape.
CANDIDATES = 8
#: Largest scratch output used for timing, in elements.
TUNE_ELEMENTS = 1 << 26
#: INT8 candidates timed on the product's whole shape (the heuristic's first few).
INT8_CANDIDATES = 6
#: Milliseconds each INT8 candidate runs back to back when timed: single
#: runs ranked them otherwise than the products ran (out-of-core tiles 55.9 TFLOP/s
#: against gemmEx's 59.5); 200 ms bursts chose what ran best in memory and
#: out of core (benchmarks/fp64_int8_speed.py --variants, docs/benchmarks.md).
INT8_BURST_MS = 200.0
#: Smallest INT8 product (m n k multiply-adds) whose candidates are timed;
#: smaller ones (an out-of-core tile's row strips, its edges) take the
#: heuristic's first. Each shape timed costs ~1.2 s once per machine (6
#: candidates in 200 ms bursts): float64 40960³ on INT8 under 24 GiB spent
#: 7.0 s in its products the first time against 2.0 again, its tiles and
#: strips making many shapes, where timing gains nothing out of core (tiles
#: by bursts 58.8 TFLOP/s against gemmEx's 58.9; in memory 75.8 against 58.7:
#: those products are far above this).
INT8_TUNE_MIN_MACS = 1 << 40
#: Workspace offered to cuBLASLt (split-K and stream-K algorithms use it).
WORKSPACE_BYTES = 64 << 20


class Unavailable(RuntimeError):
    """cuBLASLt cannot make a product here: no library found, or no
    algorithm for the shape (nothing was launched)."""


# cublasLt enums (stable in the CUDA ABI; cublasLt.h).
_DESC_TRANSA, _DESC_TRANSB = 3, 4
_PREF_MAX_WORKSPACE_BYTES = 1
_PREF_MIN_ALIGNMENT = {"a": 5, "b": 6, "c": 7, "d": 8}
_SCALE_TYPES = {"e": 0, "f": 0, "d": 1, "F": 4, "D": 5}  # cudaDataType of alpha/beta
_R_8I, _R_32I, _COMPUTE_32I, _OP_T = 3, 10, 72, 1  # int8 in, int32 out and scale


class _Algo(ctypes.Structure):
    _fields_ = [("data", ctypes.c_uint64 * 8)]


class _Heuristic(ctypes.Structure):
    _fields_ = [("algo", _Algo), ("workspace_size", ctypes.c_size_t), ("state", ctypes.c_int),
                ("waves_count", ctypes.c_float), ("reserved", ctypes.c_int * 4)]


def _library(cupy, path=None):
    """libcublasLt: the file `path` (``SUMMA_CUBLASLT``) when given, else the copy
    CuPy's cuBLAS already loaded (found by its soname), else the one
    cuda-pathfinder, the NVIDIA wheel or the system provides."""
    if path:
        try:
            return ctypes.CDLL(path)
        except OSError as exc:  # the user's file: a usage error, not a crash
            raise ValueError(f"SUMMA_CUBLASLT={path!r} cannot be loaded: {exc}") from None
    cupy.cuda.device.get_cublas_handle()  # loads libcublas, which loads libcublasLt
    candidates = ["libcublasLt.so.13", "libcublasLt.so.12"]
    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib
        candidates.append(load_nvidia_dynamic_lib("cublasLt").abs_path)
    except Exception:  # not installed, or an older API: try the others
        pass
    try:
        import nvidia.cublas as wheel
        for root in wheel.__path__:
            for sub in ("lib", os.path.join("..", "cu13", "lib"),
                        os.path.join("..", "cu12", "lib")):
                lib = os.path.normpath(os.path.join(root, sub))
                if os.path.isdir(lib):
                    candidates += sorted(os.path.join(lib, f) for f in os.listdir(lib)
                                         if f.startswith("libcublasLt.so"))
    except ImportError:
        pass
    for path in candidates:
        try:
            return ctypes.CDLL(path)
        except (OSError, TypeError):
            continue
    raise Unavailable("cuBLASLt (libcublasLt.so) was not found")


def _alignment(ptr: int) -> int:
    """Largest power of two up to 256 that divides the address `ptr`."""
    align = 256
    while align > 1 and ptr % align:
        align //= 2
    return align


@dataclass(frozen=True)
class Product:
    """A column-major ``C (m x n) = alpha A (m x k) B (k x n) + beta C`` on the
    device as cuBLASLt takes it: the element type, the sizes, the device
    pointers with their leading dimensions, and the stream it runs on."""

    data_type: int
    m: int
    n: int
    k: int
    a_ptr: int
    lda: int
    b_ptr: int
    ldb: int
    c_ptr: int
    ldc: int
    stream: int

    def alignments(self) -> dict:
        """Each pointer's alignment, by cuBLASLt's names (D is C)."""
        return {"a": _alignment(self.a_ptr), "b": _alignment(self.b_ptr),
                "c": _alignment(self.c_ptr), "d": _alignment(self.c_ptr)}


@dataclass(frozen=True)
class _Timing:
    """How :meth:`LtGemm._fastest` times candidates: the output's element
    size and type (None: the operands'), how many columns (None: as many as
    :data:`TUNE_ELEMENTS`), an output to time into (None: a scratch one), the
    key its choice is recorded under, and each candidate's burst."""

    itemsize: int
    c_type: int | None = None
    columns: int | None = None
    scratch_ptr: int | None = None
    key: tuple | None = None
    burst_ms: float = 0.0


class LtGemm:
    """Column-major ``D = alpha * A @ B + beta * C`` (C and D the same buffer) on
    one GPU, algorithms chosen per shape by timing (see module docstring)."""

    def __init__(self, cupy, path=None):
        self.cupy = cupy
        self.lib = _library(cupy, path)
        handle = ctypes.c_void_p()
        self._check(self.lib.cublasLtCreate(ctypes.byref(handle)), "cublasLtCreate")
        self.handle = handle
        self.workspace = cupy.empty(WORKSPACE_BYTES, dtype=np.uint8)
        self._plans: dict = {}
        #: per INT8 shape: the index of the algorithm taken among the
        #: heuristic's and each candidate's milliseconds (for probes)
        self.choices: dict = {}

    @staticmethod
    def _check(status: int, what: str) -> None:
        if status != 0:
            raise RuntimeError(f"{what} failed with cuBLAS status {status}")

    def _layout(self, data_type: int, rows: int, cols: int, ld: int):
        layout = ctypes.c_void_p()
        self._check(self.lib.cublasLtMatrixLayoutCreate(
            ctypes.byref(layout), ctypes.c_int(data_type), ctypes.c_uint64(rows),
            ctypes.c_uint64(cols), ctypes.c_int64(ld)), "cublasLtMatrixLayoutCreate")
        return layout

    def _desc(self, compute: int, scale_type: int):
        desc = ctypes.c_void_p()
        self._check(self.lib.cublasLtMatmulDescCreate(ctypes.byref(desc), ctypes.c_int(compute),
                                                      ctypes.c_int(scale_type)),
                    "cublasLtMatmulDescCreate")
        no = ctypes.c_int(0)  # CUBLAS_OP_N for both (the defaults, set to be explicit)
        for attr in (_DESC_TRANSA, _DESC_TRANSB):
            self._check(self.lib.cublasLtMatmulDescSetAttribute(
                desc, ctypes.c_int(attr), ctypes.byref(no), ctypes.c_size_t(4)),
                "cublasLtMatmulDescSetAttribute")
        return desc

    def _candidates(self, desc, layouts: tuple, aligns: dict) -> list:
        la, lb, lc = layouts
        pref = ctypes.c_void_p()
        self._check(self.lib.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)),
                    "cublasLtMatmulPreferenceCreate")
        try:
            ws = ctypes.c_uint64(WORKSPACE_BYTES)
            self._check(self.lib.cublasLtMatmulPreferenceSetAttribute(
                pref, ctypes.c_int(_PREF_MAX_WORKSPACE_BYTES), ctypes.byref(ws),
                ctypes.c_size_t(8)), "cublasLtMatmulPreferenceSetAttribute")
            for name, align in aligns.items():  # rule out algorithms our pointers cannot feed
                value = ctypes.c_uint32(align)
                self._check(self.lib.cublasLtMatmulPreferenceSetAttribute(
                    pref, ctypes.c_int(_PREF_MIN_ALIGNMENT[name]), ctypes.byref(value),
                    ctypes.c_size_t(4)), "cublasLtMatmulPreferenceSetAttribute")
            results = (_Heuristic * CANDIDATES)()
            found = ctypes.c_int(0)
            self._check(self.lib.cublasLtMatmulAlgoGetHeuristic(
                self.handle, desc, la, lb, lc, lc, pref, ctypes.c_int(CANDIDATES), results,
                ctypes.byref(found)), "cublasLtMatmulAlgoGetHeuristic")
            return [_Heuristic.from_buffer_copy(results[i]) for i in range(found.value)
                    if results[i].state == 0 and results[i].workspace_size <= WORKSPACE_BYTES]
        finally:
            self.lib.cublasLtMatmulPreferenceDestroy(pref)

    def _run(self, desc, algo, scalars: tuple, pointers: tuple, layouts: tuple,
             stream: int) -> int:
        """One cublasLtMatmul: `scalars` (alpha, beta) and `pointers` (A, B,
        C = D) as host and device addresses, `layouts` (A, B, C = D)."""
        (alpha, beta), (a_ptr, b_ptr, c_ptr), (la, lb, lc) = scalars, pointers, layouts
        return self.lib.cublasLtMatmul(
            self.handle, desc, ctypes.c_void_p(alpha), ctypes.c_void_p(a_ptr), la,
            ctypes.c_void_p(b_ptr), lb, ctypes.c_void_p(beta), ctypes.c_void_p(c_ptr), lc,
            ctypes.c_void_p(c_ptr), lc, ctypes.byref(algo),
            ctypes.c_void_p(self.workspace.data.ptr), ctypes.c_size_t(WORKSPACE_BYTES),
            ctypes.c_void_p(stream))

    def __call__(self, char: str, compute: int, product: Product, alpha_ptr: int,
                 beta_ptr: int, scalar) -> None:
        """`product` of `char`'s type (NumPy's code) computed in `compute`;
        `scalar` is the NumPy dtype of alpha and beta (the scale type)."""
        p, aligns = product, product.alignments()
        key = (char, compute, p.m, p.n, p.k, p.lda, p.ldb, p.ldc, tuple(aligns.values()))
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = self._plan(char, compute, p, aligns, scalar)
        desc, la, lb, lc, algo = plan
        self._check(self._run(desc, algo, (alpha_ptr, beta_ptr), (p.a_ptr, p.b_ptr, p.c_ptr),
                              (la, lb, lc), p.stream), "cublasLtMatmul")

    def int8_tn(self, product: Product, accumulate: bool, index: int | None = None) -> None:
        """Column-major ``C (m x n) = A^T B`` (``+=`` with `accumulate`) of int8
        A (stored k x m) and B (k x n), int32 C, exactly (`product`'s type and
        leading dimensions are these): the "TN" product
        :meth:`summa.device.cupy_backend.CupyBackend.int8_gemm_tn` makes, through the
        fastest of cuBLASLt's algorithms for the shape (timed once), or the
        heuristic's `index`-th."""
        p, aligns = product, product.alignments()
        key = ("int8 TN", p.m, p.n, p.k, tuple(aligns.values()), index)
        plan = self._plans.get(key)
        if plan is False:
            raise Unavailable(f"cuBLASLt offers no INT8 algorithm for {p.m} x {p.n} x {p.k}")
        if plan is None:
            plan = self._plans[key] = self._int8_plan(p, aligns, key, accumulate)
        desc, la, lb, lc, algo = plan
        one, beta = np.ones(1, dtype=np.int32), np.full(1, int(accumulate), dtype=np.int32)
        self._check(self._run(desc, algo, (one.ctypes.data, beta.ctypes.data),
                              (p.a_ptr, p.b_ptr, p.c_ptr), (la, lb, lc), p.stream),
                    "cublasLtMatmul")

    def _int8_plan(self, p: Product, aligns: dict, key: tuple, accumulate: bool) -> tuple:
        """``(desc, layouts..., algorithm)`` of :meth:`int8_tn`'s product `p`,
        the algorithm the heuristic's `key[-1]`-th, remembered, or timed."""
        index = key[-1]
        desc = self._desc(_COMPUTE_32I, _R_32I)
        trans = ctypes.c_int(_OP_T)
        self._check(self.lib.cublasLtMatmulDescSetAttribute(
            desc, ctypes.c_int(_DESC_TRANSA), ctypes.byref(trans), ctypes.c_size_t(4)),
            "cublasLtMatmulDescSetAttribute")
        layouts = (self._layout(_R_8I, p.k, p.m, p.k), self._layout(_R_8I, p.k, p.n, p.k),
                   self._layout(_R_32I, p.m, p.n, p.m))
        found = self._candidates(desc, layouts, aligns)
        if not found:  # (an older GPU, or operands aligned otherwise)
            for layout in layouts:
                self.lib.cublasLtMatrixLayoutDestroy(layout)
            self.lib.cublasLtMatmulDescDestroy(desc)
            self._plans[key] = False
            raise Unavailable(f"cuBLASLt offers no INT8 algorithm for {p.m} x {p.n} x {p.k}")
        algo = found[0].algo
        remembered = None if index is not None or len(found) < 2 else _remembered(self, key)
        if index is not None:
            algo = found[min(index, len(found) - 1)].algo
        elif remembered is not None and remembered < len(found):
            algo = found[remembered].algo
        elif len(found) > 1 and p.m * p.n * p.k >= INT8_TUNE_MIN_MACS:
            # Timed on the product's whole shape, into its own output
            # (overwritten by the call below): on slices short runs rank
            # them otherwise (a quarter of N = 32768 chose the first, no
            # faster than gemmEx over the whole; its second ran 1.29 POPS
            # there to gemmEx's 1.00 on an H200). Remembered across
            # processes: the timing costs ~16 products of the shape once.
            timing = _Timing(4, c_type=_R_32I, columns=p.n,
                             scratch_ptr=None if accumulate else p.c_ptr, key=key,
                             burst_ms=INT8_BURST_MS)
            algo = self._fastest(found[:INT8_CANDIDATES], desc, p, layouts, np.int32, timing)
            _remember(self, key, self.choices[key]["index"])
        return (desc, *layouts, algo)

    def _plan(self, char: str, compute: int, p: Product, aligns: dict, scalar) -> tuple:
        desc = self._desc(compute, _SCALE_TYPES[char])
        layouts = (self._layout(p.data_type, p.m, p.k, p.lda),
                   self._layout(p.data_type, p.k, p.n, p.ldb),
                   self._layout(p.data_type, p.m, p.n, p.ldc))
        found = self._candidates(desc, layouts, aligns)
        if not found:
            raise RuntimeError(f"cuBLASLt offers no algorithm for a {p.m} x {p.n} x {p.k} "
                               "product")
        algo = found[0].algo
        if len(found) > 1:
            algo = self._fastest(found, desc, p, layouts, scalar,
                                 _Timing(np.dtype(char).itemsize))
        return (desc, *layouts, algo)

    def _fastest(self, found, desc, p: Product, layouts: tuple, scalar, how: _Timing):
        """Time each candidate on the first ``how.columns`` columns of the
        product `p` (default as many as TUNE_ELEMENTS) into a scratch output
        of ``how.c_type`` (default the operands' type), or into
        ``how.scratch_ptr``; with ``how.key``, record the choice in
        :attr:`choices`. Each runs once to warm up, then once, or with
        ``how.burst_ms`` back to back until that long has passed (the mean
        counts: a GPU at its power cap ranks algorithms otherwise in short
        runs than in long ones)."""
        cupy = self.cupy
        la, lb = layouts[:2]
        cols = how.columns or max(1, min(p.n, TUNE_ELEMENTS // max(p.m, 1)))
        scratch = None if how.scratch_ptr else cupy.zeros(p.m * cols * how.itemsize,
                                                          dtype=np.uint8)
        out_ptr = how.scratch_ptr or scratch.data.ptr
        lt = self._layout(p.data_type if how.c_type is None else how.c_type, p.m, cols, p.m)
        lb_t = self._layout(p.data_type, p.k, cols, p.ldb) if cols != p.n else lb
        one, zero = np.ones(1, dtype=scalar), np.zeros(1, dtype=scalar)
        best, best_ms, spent = found[0].algo, float("inf"), []
        stream_obj = cupy.cuda.ExternalStream(p.stream) if p.stream else cupy.cuda.Stream.null
        try:
            for result in found:
                times = []
                while len(times) < 2 or (how.burst_ms and sum(times[1:]) < how.burst_ms):
                    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
                    start.record(stream_obj)
                    status = self._run(desc, result.algo, (one.ctypes.data, zero.ctypes.data),
                                       (p.a_ptr, p.b_ptr, out_ptr), (la, lb_t, lt), p.stream)
                    stop.record(stream_obj)
                    if status != 0:
                        break
                    stop.synchronize()
                    times.append(cupy.cuda.get_elapsed_time(start, stop))
                mean = sum(times[1:]) / (len(times) - 1) if len(times) >= 2 else None
                spent.append(mean)
                if mean is not None and mean < best_ms:
                    best, best_ms = result.algo, mean
        finally:
            self.lib.cublasLtMatrixLayoutDestroy(lt)
            if lb_t is not lb:
                self.lib.cublasLtMatrixLayoutDestroy(lb_t)
        if how.key is not None:
            self.choices[how.key] = {"index": spent.index(best_ms) if best_ms in spent else 0,
                                     "columns": cols, "ms": spent}
        return best


def _cache_path() -> str:
    """Where the INT8 choices persist: ``SUMMA_CACHE_DIR`` or ~/.cache/summa."""
    root = options.current().cache_dir or os.path.join(
        os.path.expanduser("~"), ".cache", "summa")
    return os.path.join(root, "cublaslt-int8.json")


def _cache_key(gemm: LtGemm, key) -> str:
    """The choice's key: the GPU, the cuBLASLt version, the candidates asked,
    the shape and alignments (the heuristic's list is the same for them)."""
    cupy = gemm.cupy
    name = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"]
    name = name.decode() if isinstance(name, bytes) else str(name)
    gemm.lib.cublasLtGetVersion.restype = ctypes.c_size_t
    # the timing in the key: choices an older summa timed otherwise are not taken
    return (f"{name}|{gemm.lib.cublasLtGetVersion()}|{CANDIDATES}|{key[1:5]}"
            f"|burst {INT8_BURST_MS:g} ms")


def _remembered(gemm: LtGemm, key) -> int | None:
    """The index chosen for `key` by an earlier process, if any."""
    try:
        with open(_cache_path()) as f:
            return int(json.load(f)[_cache_key(gemm, key)])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _remember(gemm: LtGemm, key, index: int) -> None:
    """Keep `index` for `key` (best effort: a read-only home keeps nothing)."""
    path = _cache_path()
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        try:
            with open(path) as f:
                known = json.load(f)
        except (OSError, ValueError):
            known = {}
        known[_cache_key(gemm, key)] = int(index)
        tmp = f"{path}.{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(known, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except OSError:
        pass
