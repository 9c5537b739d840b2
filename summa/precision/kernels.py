"""The CUDA side of :mod:`summa.precision.ozaki_gpu`: fp64-int8's kernels
(:mod:`summa.precision.cuda_source`) as one module a process loads once
(:func:`module`: shipped compiled, :mod:`summa.precision.binaries`, else
compiled from the source), their launches (the reductions of the scaling,
the exponents, the residues, the folds of the integer products, the finish
and the complex products' parts), the moduli's device constants, and the
folds that rebuild C from a product's integer products (:class:`Folds`).
:mod:`summa.precision.ozaki_gpu` drives them into products.

Every kernel mirrors the NumPy code of :mod:`summa.precision.ozaki` (the same
float64 formulas); tests/fake_cupy_kernels.py is them in NumPy.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from . import binaries, ozaki
from .cuda_source import OPTIONS, SOURCE

__all__ = ["PLANES", "module", "kernel", "launch", "exponents", "finish", "combine", "split",
           "residue_planes", "moduli_constants", "planes_a_pass", "Encoding", "Folds",
           "Reduction", "cache"]


#: Integer products folded per pass by default (each pass reads and writes
#: the two sums once): the least a plan takes. A plan gives the folds more
#: where its memory leaves room (:attr:`summa.planning.memory.MemoryPlan.int8_planes`:
#: all 15 a pass ran a 40960³ product 3 % faster, a sweep's panel products
#: 5-9 %).
PLANES = 4

#: What this process made once: the kernels' module by device capability,
#: each device's kernels by ``(name, device)``, the reductions by name, the
#: moduli's device constants (:func:`moduli_constants`) and the dtypes made
#: ready (:func:`summa.precision.warmup.ready`) by key.
cache: dict = {}


def module():
    """fp64-int8's kernels for the current device's architecture, made once
    a process: the shipped binary loaded (:func:`summa.precision.binaries.load`)
    where it fits, else :data:`summa.precision.cuda_source.SOURCE` compiled
    (one NVRTC compile, which CuPy keeps on disk for the next process)."""
    import cupy
    key = ("module", cupy.cuda.Device().compute_capability)
    if key not in cache:
        cache[key] = binaries.load(cupy) or cupy.RawModule(code=SOURCE, options=OPTIONS)
    return cache[key]


#: The reductions' operations by name (the kernels' `op`).
_REDUCTIONS = {"amax": 0, "norm": 1}


class Reduction:
    """:data:`_REDUCTIONS`' `name` over an axis of a float64 device array, as
    CuPy's reductions are called: ``amax(x, axis=...)`` and ``norm(x, top,
    axis=...)`` (`top`: each output's largest, as ``amax`` gave it, in any
    shape of that many elements); ``amax(x, axis=None)`` reduces all (0-d
    result)."""

    def __init__(self, name: str):
        self.op = _REDUCTIONS[name]

    def __call__(self, x, top=None, *, axis):
        import cupy
        x = cupy.asarray(x, dtype=cupy.float64)
        if axis is None and self.op != _REDUCTIONS["amax"]:
            raise ValueError("a norm is taken along an axis")
        if axis is None and x.ndim > 1:  # all of it: its rows' first (max is exact)
            return self(self(x, axis=x.ndim - 1), axis=None)
        outer, inner, so, si = _reduced(x, axis)
        out = cupy.empty(outer, dtype=cupy.float64)
        top = out if top is None else cupy.ascontiguousarray(top.reshape(-1),
                                                             dtype=cupy.float64)
        args = (x, np.int64(outer), np.int64(inner), np.int64(so), np.int64(si),
                np.int32(self.op), top, out)
        if outer and abs(so) < abs(si):  # adjacent outputs: a warp along them
            kernel("reduce_outer")((-(-outer // 32),), (32, 16), args)
        elif outer:
            kernel("reduce_inner")((int(min(outer, 1 << 16)),), (256,), args)
        return out.reshape(()) if axis is None else out


def _reduced(x, axis) -> tuple:
    """``(outputs, elements each, output stride, element stride)`` (strides
    in elements) of reducing `x` (1-D or 2-D) along `axis` (None: all of a
    1-D `x`)."""
    if axis is None or x.ndim < 2:
        return 1, x.size, 0, (x.strides[0] // x.itemsize if x.ndim else 1)
    (s0, s1), (rows, cols) = (s // x.itemsize for s in x.strides), x.shape
    return (rows, cols, s0, s1) if axis == 1 else (cols, rows, s1, s0)


def kernel(name: str):
    """The kernel `name`: a :class:`Reduction` (``amax``, ``norm``), or a
    function of :data:`summa.precision.cuda_source.NAMES` on the current
    device (of its :func:`module`), made once a process."""
    if name in _REDUCTIONS:
        if name not in cache:
            cache[name] = Reduction(name)
        return cache[name]
    import cupy
    key = (name, cupy.cuda.Device().id)
    if key not in cache:
        cache[key] = module().get_function(name)
    return cache[key]


def launch(compiled, rows: int, width: int, args) -> None:
    """`compiled` (a kernel) over `rows` rows (the grid's y, looped past
    65535) of `width` threads' work each (x)."""
    threads = 256
    blocks = int(min(max(1, -(-width // threads)), 4096))
    compiled((blocks, int(min(max(1, rows), 65535))), (threads,), args)


def _strides(x) -> tuple:
    """`x`'s two strides in elements (np.int64, as the kernels take them)."""
    return tuple(np.int64(step // x.itemsize) for step in x.strides)


def exponents(amax, norm, bits: int, cap: float):
    """The int32 scaling exponents of rows whose largest magnitudes are
    `amax` and scaled norms `norm` (1-D, as :class:`Reduction` gives them):
    :func:`summa.precision.ozaki.exponents`' formulas."""
    import cupy
    amax = cupy.ascontiguousarray(amax, dtype=cupy.float64)
    norm = cupy.ascontiguousarray(norm, dtype=cupy.float64)
    shift = cupy.empty(amax.shape, dtype=cupy.int32)
    launch(kernel("exponents"), 1, amax.size,
           (amax, norm, np.int64(amax.size), np.int32(bits), np.float64(cap), shift))
    return shift


def finish(sums, ends, c) -> None:
    """C (rows not contiguous: any strides) from a product's two float64
    `sums` (``(s_hi, s_lo)``, ``m x n`` contiguous) and its `ends`
    (``(e, f, m_hi, m_lo, t, alpha, beta)``: exponents, the moduli's product
    in two parts, its scale, alpha and beta)."""
    (s_hi, s_lo), (e, f, m_hi, m_lo, t, alpha, beta) = sums, ends
    m, n = c.shape
    launch(kernel("finish"), m, n,
           (s_hi, s_lo, e, f, np.int64(m), np.int64(n), np.float64(m_hi), np.float64(m_lo),
            np.int32(t), np.float64(alpha), np.float64(beta), c) + _strides(c))


def combine(re, im, alpha, beta, c) -> None:
    """``c = alpha (re + i im) + beta c`` in place: a complex product's two
    real ones (``m x n``, contiguous) into C of any strides; beta 0: what C
    held is gone."""
    m, n = c.shape
    alpha, beta = complex(alpha), complex(beta)
    launch(kernel("combine"), m, n,
           (re, im, np.int64(m), np.int64(n), np.float64(alpha.real), np.float64(alpha.imag),
            np.float64(beta.real), np.float64(beta.imag), c) + _strides(c))


def split(x) -> tuple:
    """A complex matrix's (any strides) real and imaginary parts, each
    contiguous float64, in one pass."""
    import cupy
    m, n = x.shape
    re = cupy.empty((m, n), dtype=cupy.float64)
    im = cupy.empty((m, n), dtype=cupy.float64)
    launch(kernel("split"), m, n, (x, np.int64(m), np.int64(n)) + _strides(x) + (re, im))
    return re, im


def residue_planes(x, e, count: int, rows_p: int, cols_p: int, constants):
    """int8 planes (count, rows_p, cols_p) of `x`'s scaled rows mod each of
    the first `count` moduli, zeros in the padding."""
    import cupy
    out = cupy.empty((count, rows_p, cols_p), dtype=cupy.int8)
    rows, cols = x.shape
    if x.size and x.strides[1] != x.itemsize:
        x = cupy.ascontiguousarray(x)
    ld = x.strides[0] // x.itemsize if x.size else cols
    launch(kernel("residues"), rows_p, cols_p // 4,
           (x, e, np.int64(rows), np.int64(rows_p), np.int64(cols), np.int64(cols_p),
           np.int64(ld), np.int32(count), constants["moduli"],
           constants["inverses"], out))
    return out


def moduli_constants(count: int) -> dict:
    """The first `count` moduli's device constants (the moduli, their
    inverses, the CRT weights in two parts) and their host weights, made
    once a process."""
    import cupy
    key = ("constants", count)
    if key not in cache:
        chosen = ozaki.MODULI[:count]
        weights = ozaki.crt_weights(chosen)
        cache[key] = {
            "weights": weights,
            "moduli": cupy.asarray(np.array(chosen, dtype=np.float64)),
            "inverses": cupy.asarray(1.0 / np.array(chosen, dtype=np.float64)),
            "w_hi": cupy.asarray(np.array(weights["w_hi"])),
            "w_lo": cupy.asarray(np.array(weights["w_lo"]))}
    return cache[key]


def planes_a_pass(planes: int | None, count: int) -> int:
    """Integer products folded a pass: `planes` asked (None: :data:`PLANES`),
    within 1 and the `count` of moduli (:class:`Folds`, and :func:`summa.precision.ozaki_gpu.gemm`'s
    buffer for them)."""
    return max(1, min(int(PLANES if planes is None else planes), count))


@dataclasses.dataclass(frozen=True, eq=False)
class Encoding:
    """A product's moduli and scaling exponents: what its folds rebuild C
    from, beside the integer products.

    Attributes
    ----------
    count : int
        How many moduli (the first of :data:`summa.precision.ozaki.MODULI`).
    constants : dict
        Their device constants (:func:`moduli_constants` of `count`).
    e, f : device arrays
        The int32 scaling exponents of A's rows and of B's columns.
    """

    count: int
    constants: dict
    e: object
    f: object


class Folds:
    """The folds of a product's ``encoding.count`` integer products (int32
    planes of ``m x np_``, their pitch `n` padded to 4) into ``c = alpha a @
    b + beta c``, `planes` of them a pass: :attr:`groups` lists each pass's
    first plane and count; :meth:`fold` passes over group j's planes, the
    first starting the two float64 sums, the last writing C itself where C's
    rows are contiguous; :meth:`finish` ends the product otherwise (a
    transposed view of C goes through the finish kernel)."""

    def __init__(self, m: int, n: int, planes: int, encoding: Encoding, alpha, beta, c):
        import cupy
        count, constants = encoding.count, encoding.constants
        self.m, self.n, self.np_, self.constants = m, n, -(-n // 4) * 4, constants
        self.planes = planes_a_pass(planes, count)
        self.groups = [(l0, min(self.planes, count - l0)) for l0 in range(0, count, self.planes)]
        self.fused = c.strides[1] == c.itemsize
        sums = (m, n) if len(self.groups) > 1 or not self.fused else (1, 1)
        self.s_hi = cupy.empty(sums, dtype=cupy.float64)
        self.s_lo = cupy.empty(sums, dtype=cupy.float64)
        weights = constants["weights"]
        self.ends = (encoding.e, encoding.f, weights["m_hi"], weights["m_lo"],
                     np.int32(weights["t"]), np.float64(alpha), np.float64(beta), c,
                     np.int64(c.strides[0] // c.itemsize))

    def fold(self, j: int, g) -> None:
        """Fold group j's planes, the first planes of `g` (planes ``m np_`` apart)."""
        (l0, group), constants = self.groups[j], self.constants
        last = self.fused and j == len(self.groups) - 1
        m, n, np_ = self.m, self.n, self.np_
        launch(kernel("fold_finish" if last else "fold"), m, n,
               (g, np.int64(m), np.int64(n), np.int64(np_), np.int64(m * np_),
                np.int32(group), constants["moduli"][l0:], constants["inverses"][l0:],
                constants["w_hi"][l0:], constants["w_lo"][l0:], self.s_hi, self.s_lo,
                np.int32(j == 0)) + (self.ends if last else ()))

    def finish(self) -> None:
        """Where C's rows are not contiguous: the sums into C."""
        if self.fused:
            return
        finish((self.s_hi, self.s_lo), self.ends[:7], self.ends[7])
