"""cuBLASLt matrix products with a measured choice of algorithm.

``cublasGemmEx`` runs the first algorithm its heuristic proposes. For large
GEMMs the fastest of the heuristic's first few candidates can be several
percent faster (XLA times them too, which is part of why JAX's products ran
faster per GPU than CuPy's in our measurements), so :class:`LtGemm` asks
cuBLASLt for up to :data:`CANDIDATES` algorithms that suit the full product
and keeps the fastest for that shape, layout and alignment for the life of
the process. Floating-point candidates are timed on a slice of the real
operands writing to a scratch output, so the same product always uses the
same algorithm and repeated runs give the same bits. INT8 candidates take
turns on the shape's own products (:class:`_Trial`; their products are
exact, the same bits by any algorithm), and the choice is kept on disk.

Chosen with ``SUMMA_GEMM=cublaslt`` (see :class:`summa.device.cupy_backend.CupyBackend`).
"""

from __future__ import annotations

import ctypes
import json
import math
import os
from dataclasses import dataclass

import numpy as np

from .. import options

__all__ = ["LtGemm", "Product", "Unavailable", "CANDIDATES"]

#: Algorithms proposed by the heuristic that are timed per shape.
CANDIDATES = 8
#: Largest scratch output used for timing, in elements.
TUNE_ELEMENTS = 1 << 26
#: INT8 candidates tried on a shape's own products (the heuristic's first few).
INT8_CANDIDATES = 6
#: Milliseconds of products each INT8 candidate runs, beyond its first (a
#: warm-up: CUDA loads a kernel at its first launch), before the fastest is
#: kept. The candidates take turns on the shape's real products as they come
#: (:class:`_Trial`): the GPU is as loaded as it will be, and nothing runs
#: for the timing's sake. Timing apart cost ~1.2 s a shape once per machine
#: (6 candidates in 200 ms bursts on the whole shape; single runs there ranked
#: them otherwise than the products ran, `benchmarks/fp64_int8_speed.py
#: --variants`), ~3 s of a fresh machine's first float64 40960³ call on INT8.
INT8_TRIAL_MS = 100.0
#: Smallest INT8 product (m n k multiply-adds) whose candidates are tried;
#: smaller ones (an out-of-core tile's row strips, its edges) take the
#: heuristic's first: timing gains nothing there (tiles by bursts 58.8
#: TFLOP/s against gemmEx's 58.9; in memory 75.8 against 58.7).
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
    for path in _candidates():
        try:
            return ctypes.CDLL(path)
        except (OSError, TypeError):
            continue
    raise Unavailable("cuBLASLt (libcublasLt.so) was not found")


def _candidates():
    """Where libcublasLt may be, in turn: the copy already loaded, by its
    soname; then where cuda-pathfinder finds it; then the NVIDIA wheel's
    files. Each is looked for only once those before it failed: this lookup
    took 0.27 s of a first fp64-int8 call where the soname served (cProfile
    of `benchmarks/fp64_int8_user_case.py`'s process on an H100), and the
    pathfinder's search imports a package and loads a library of its own."""
    yield from ("libcublasLt.so.13", "libcublasLt.so.12")
    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib
        yield load_nvidia_dynamic_lib("cublasLt").abs_path
    except Exception:  # not installed, or an older API: try the others
        pass
    try:
        import nvidia.cublas as wheel
    except ImportError:
        return
    for root in wheel.__path__:
        for sub in ("lib", os.path.join("..", "cu13", "lib"), os.path.join("..", "cu12", "lib")):
            lib = os.path.normpath(os.path.join(root, sub))
            if os.path.isdir(lib):
                yield from sorted(os.path.join(lib, f) for f in os.listdir(lib)
                                  if f.startswith("libcublasLt.so"))


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


class _Trial:
    """INT8 candidates taking turns on a shape's own products: each run timed
    by events on the product's stream and read once done, never waited for.
    A candidate has run enough once its runs beyond the first (a warm-up)
    took :data:`INT8_TRIAL_MS`; then the fastest is kept (:attr:`best`).
    INT8 products are exact, so every candidate gives the same bits.

    Attributes
    ----------
    found : list
        The candidates (cuBLASLt's heuristic results), best guess first.
    ms : list of list of float
        Each candidate's finished runs, in milliseconds, its warm-up first.
    launched : list of int
        Runs of each candidate launched so far.
    failed : set of int
        Candidates that refused a product (another ran it).
    """

    def __init__(self, found: list):
        self.found = found
        self.ms = [[] for _ in found]
        self.launched = [0] * len(found)
        self.failed: set = set()
        self._pending: list = []

    def collect(self, done, elapsed) -> None:
        """Move the runs whose stop event `done` says has passed into
        :attr:`ms` (`elapsed`: milliseconds between two events)."""
        waiting = []
        for index, start, stop in self._pending:
            if done(stop):
                self.ms[index].append(elapsed(start, stop))
            else:
                waiting.append((index, start, stop))
        self._pending = waiting

    def launch(self, index: int, start, stop) -> None:
        """Note a run of candidate `index` between the events `start` and `stop`."""
        self.launched[index] += 1
        self._pending.append((index, start, stop))

    def _timed(self, index: int) -> list:
        return self.ms[index][1:]

    def _needs(self, index: int) -> int:
        """Runs candidate `index` needs in all, by what its finished runs took."""
        timed = self._timed(index)
        if not timed:
            return 2
        return 1 + max(len(timed), math.ceil(INT8_TRIAL_MS / self._mean(index)))

    def _open(self) -> list:
        return [i for i in range(len(self.found))
                if i not in self.failed and sum(self._timed(i)) < INT8_TRIAL_MS]

    def next(self) -> tuple:
        """``(index, timed)``: the candidate to run the next product, and
        whether to time it; ``(None, False)`` once every candidate has run
        enough (then :attr:`best`)."""
        still = self._open()
        if not still:
            return None, False
        short = [i for i in still if self.launched[i] < self._needs(i)]
        if short:
            return min(short, key=lambda i: self.launched[i]), True
        return self.best, False  # enough launched; their times not yet back

    def _mean(self, index: int) -> float | None:
        """Candidate `index`'s mean milliseconds beyond its warm-up (None:
        none timed yet, or it refused)."""
        timed = self._timed(index)
        return None if index in self.failed or not timed else sum(timed) / len(timed)

    @property
    def best(self) -> int:
        """The candidate fastest so far (the first while none is timed)."""
        means = {i: m for i in range(len(self.found)) if (m := self._mean(i)) is not None}
        if means:
            return min(means, key=means.get)
        return next((i for i in range(len(self.found)) if i not in self.failed), 0)

    def summary(self) -> dict:
        """What :attr:`LtGemm.choices` keeps of it: the index kept, each
        candidate's runs and mean milliseconds (None: it refused)."""
        return {"index": self.best, "runs": [len(t) for t in self.ms],
                "ms": [self._mean(i) for i in range(len(self.found))]}


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
            plan = self._plans[key] = self._int8_plan(p, aligns, key)
        desc, la, lb, lc, algo = plan
        one, beta = np.ones(1, dtype=np.int32), np.full(1, int(accumulate), dtype=np.int32)

        def run(chosen):
            return self._run(desc, chosen, (one.ctypes.data, beta.ctypes.data),
                             (p.a_ptr, p.b_ptr, p.c_ptr), (la, lb, lc), p.stream)
        if isinstance(algo, _Trial):
            self._check(self._try(key, algo, run, p.stream), "cublasLtMatmul")
        else:
            self._check(run(algo), "cublasLtMatmul")

    def _try(self, key: tuple, trial: _Trial, run, stream: int) -> int:
        """Run a product of `key`'s shape by `trial`'s next candidate (timed)
        or, once every candidate has run enough, by the fastest, kept for the
        shape from then on and remembered across processes."""
        trial.collect(self._done, self._elapsed)
        index, timed = trial.next()
        if index is None:
            best = trial.best
            self._plans[key] = (*self._plans[key][:4], trial.found[best].algo)
            self.choices[key] = trial.summary()
            _remember(self, key, best)
            return run(trial.found[best].algo)
        start = self._record(stream) if timed else None
        status = run(trial.found[index].algo)
        if status != 0:  # this candidate refuses the operands: another runs it
            trial.failed.add(index)
            return self._try(key, trial, run, stream)
        if timed:
            trial.launch(index, start, self._record(stream))
        return status

    def _record(self, stream: int):
        """An event recorded on `stream` (a pointer; 0 the null stream)."""
        cupy = self.cupy
        event = cupy.cuda.Event()
        event.record(cupy.cuda.ExternalStream(stream) if stream else cupy.cuda.Stream.null)
        return event

    @staticmethod
    def _done(event) -> bool:
        return event.done

    def _elapsed(self, start, stop) -> float:
        return self.cupy.cuda.get_elapsed_time(start, stop)

    def _int8_plan(self, p: Product, aligns: dict, key: tuple) -> tuple:
        """``(desc, layouts..., algorithm)`` of :meth:`int8_tn`'s product `p`:
        the algorithm the heuristic's `key[-1]`-th, remembered, or a
        :class:`_Trial` of the candidates."""
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
            # Tried on the shape's own products, not on slices: short runs
            # on a quarter of N = 32768 chose the first, no faster than
            # gemmEx over the whole; its second ran 1.29 POPS there to
            # gemmEx's 1.00 on an H200.
            algo = _Trial(found[:INT8_CANDIDATES])
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
            algo = self._fastest(found, desc, p, layouts, scalar, np.dtype(char).itemsize)
        return (desc, *layouts, algo)

    def _fastest(self, found, desc, p: Product, layouts: tuple, scalar, itemsize: int):
        """Time each candidate on the first columns of the product `p` (as
        many as TUNE_ELEMENTS) into a scratch output: once to warm up, then
        once; the fastest."""
        cupy = self.cupy
        la, lb = layouts[:2]
        cols = max(1, min(p.n, TUNE_ELEMENTS // max(p.m, 1)))
        scratch = cupy.zeros(p.m * cols * itemsize, dtype=np.uint8)
        lt = self._layout(p.data_type, p.m, cols, p.m)
        lb_t = self._layout(p.data_type, p.k, cols, p.ldb) if cols != p.n else lb
        one, zero = np.ones(1, dtype=scalar), np.zeros(1, dtype=scalar)
        best, best_ms = found[0].algo, float("inf")
        try:
            for result in found:
                times = []
                while len(times) < 2:
                    start = self._record(p.stream)
                    status = self._run(desc, result.algo, (one.ctypes.data, zero.ctypes.data),
                                       (p.a_ptr, p.b_ptr, scratch.data.ptr), (la, lb_t, lt),
                                       p.stream)
                    stop = self._record(p.stream)
                    if status != 0:
                        break
                    stop.synchronize()
                    times.append(self._elapsed(start, stop))
                if len(times) == 2 and times[1] < best_ms:
                    best, best_ms = result.algo, times[1]
        finally:
            self.lib.cublasLtMatrixLayoutDestroy(lt)
            if lb_t is not lb:
                self.lib.cublasLtMatrixLayoutDestroy(lb_t)
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
            f"|tried {INT8_TRIAL_MS:g} ms")


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
