"""The CUDA side of :mod:`summa.precision.ozaki_gpu`: the kernels of the
fp64-int8 products (the residues, the folds of the integer products, the
reductions and elementwise steps, as CUDA sources and CuPy's kernel
arguments), each made once a process (:func:`kernel`), their launches, the
moduli's device constants, and the folds that rebuild C from a product's
integer products (:class:`Folds`). :mod:`summa.precision.ozaki_gpu` drives
them into products.

Every kernel mirrors the NumPy code of :mod:`summa.precision.ozaki` (the same
float64 formulas); tests/fake_cupy_kernels.py is them in NumPy.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from . import ozaki

__all__ = ["PLANES", "kernel", "launch", "residue_planes", "moduli_constants",
           "planes_a_pass", "Encoding", "Folds", "Reduction", "cache"]


#: Integer products folded per pass by default (each pass reads and writes
#: the two sums once): the least a plan takes. A plan gives the folds more
#: where its memory leaves room (:attr:`summa.planning.memory.MemoryPlan.int8_planes`:
#: all 15 a pass ran a 40960³ product 3 % faster, a sweep's panel products
#: 5-9 %).
PLANES = 4


# Rows on the grid's y axis and columns on x: no 64-bit division per element
# (a flat index cost it twice per element; the residues took 48 ms of a
# 1.25 s product at N = 32768 in `benchmarks/fp64_int8_speed.py`'s phases).
# Residues: four columns a thread, one 4-byte store per plane (cols_p is a
# multiple of 4, the planes 4-aligned).
_RESIDUES = r"""
extern "C" __global__ void residues(const double* x, const int* e, long long rows,
        long long rows_p, long long cols, long long cols_p, long long ld, int count,
        const double* moduli, const double* inverses, signed char* out) {
    long long plane = rows_p * cols_p, quads = cols_p / 4;
    for (long long r = blockIdx.y; r < rows_p; r += gridDim.y) {
        for (long long q = blockIdx.x * (long long)blockDim.x + threadIdx.x; q < quads;
             q += (long long)gridDim.x * blockDim.x) {
            long long j = 4 * q;
            double xb[4];
            for (int t = 0; t < 4; ++t)
                xb[t] = (r < rows && j + t < cols) ? rint(ldexp(x[r * ld + j + t], e[r])) : 0.0;
            for (int l = 0; l < count; ++l) {
                double m = moduli[l], inv = inverses[l];
                unsigned int packed = 0;  // little-endian: column j in the lowest byte
                for (int t = 0; t < 4; ++t) {
                    double v = xb[t] - m * rint(xb[t] * inv);
                    if (v > 127.0) v -= m;
                    if (v < -128.0) v += m;
                    packed |= (unsigned int)(unsigned char)(signed char)v << (8 * t);
                }
                *(unsigned int*)(out + l * plane + r * cols_p + j) = packed;
            }
        }
    }
}
"""

# The folds: the first of a product starts from zero (no pass to clear the
# sums, no read of them), the last can end the product itself (fold_finish:
# the sums never go to memory), so 16 products folded 4 at a time pass over
# C's sums 3 times instead of 5 (the folds took ~80 ms of the 1.25 s in
# `benchmarks/fp64_int8_speed.py`'s phases).
_FOLD_BODY = r"""
    for (long long r = blockIdx.y; r < rows; r += gridDim.y) {
        for (long long j = blockIdx.x * (long long)blockDim.x + threadIdx.x; j < cols;
             j += (long long)gridDim.x * blockDim.x) {
            long long idx = r * cols + j;
            double hi = first ? 0.0 : s_hi[idx], lo = first ? 0.0 : s_lo[idx];
            for (int p = 0; p < count; ++p) {
                double gd = (double)g[p * plane + r * ldg + j];
                double u = gd - moduli[p] * rint(gd * inverses[p]);
                hi += u * w_hi[p];
                lo += u * w_lo[p];
            }
            FINISH
        }
    }
}
"""
_FOLD_ARGS = ("const int* g, long long rows, long long cols, long long ldg, long long plane, "
              "int count, const double* moduli, const double* inverses, const double* w_hi, "
              "const double* w_lo, double* s_hi, double* s_lo, int first")
_FOLD = ('extern "C" __global__ void fold(' + _FOLD_ARGS + ") {" +
         _FOLD_BODY.replace("FINISH", "s_hi[idx] = hi;\n            s_lo[idx] = lo;"))
# The finish's formulas (the "finish" kernel below), on the sums in registers.
_FOLD_FINISH = ('extern "C" __global__ void fold_finish(' + _FOLD_ARGS +
                ", const int* e, const int* f, double m_hi, double m_lo, int t, double alpha, "
                "double beta, double* c, long long ldc) {" + _FOLD_BODY.replace("FINISH", r"""
            double q = rint((hi + lo) / (m_hi + m_lo));
            double d = (hi - q * m_hi) + (lo - q * m_lo);
            double v = alpha * ldexp(d, t - e[r] - f[j]);
            double* cj = c + r * ldc + j;
            *cj = beta == 0.0 ? v : v + beta * *cj;"""))

#: The kernels made in this process by name, and the moduli's device
#: constants (:func:`moduli_constants`) and the dtypes made ready
#: (:func:`summa.precision.warmup.ready`) by key.
cache: dict = {}


# The reductions of the scaling (:func:`summa.precision.ozaki_gpu.scaling_exponents`):
# each row's (or column's) largest magnitude, Inf where it holds Inf or NaN
# (one reduction scales and checks), and its 2-norm with each value scaled by
# its row's largest's 2**-exponent into [0.5, 1) first (the exponent frexp
# gives, as :func:`summa.precision.ozaki.norms`: no square overflows). Raw
# kernels, one for any shape and strides: CuPy's ReductionKernels compiled a
# variant per shape class, 1.3-8.3 s each side by side on a fresh H100 (the
# longest of a 40960³ first call's 8.5 s in ready(); its products then
# compiled more variants for 4.7 s: `benchmarks/fp64_int8_user_case.py`'s
# fresh process under cProfile). "inner": a block an output, its threads
# along the reduced axis (rows stored by rows); "outer": a warp along 32
# adjacent outputs (columns stored by rows), so that either way the reads
# coalesce.
_REDUCE_COMMON = r"""
__device__ __forceinline__ double summa_term(double v, int op, int shift) {
    if (op == 0) return isfinite(v) ? fabs(v) : __longlong_as_double(0x7ff0000000000000LL);
    double s = ldexp(v, shift);
    return s * s;
}
__device__ __forceinline__ double summa_join(double a, double b, int op) {
    return op == 0 ? fmax(a, b) : a + b;
}
__device__ __forceinline__ int summa_shift(const double* top, long long o, int op) {
    int e = 0;
    if (op == 1) frexp(top[o], &e);
    return -e;
}
"""
_REDUCE_ARGS = ("const double* x, long long outer, long long inner, long long so, long long si, "
                "int op, const double* top, double* out")
_REDUCE_INNER = _REDUCE_COMMON + 'extern "C" __global__ void reduce_inner(' + _REDUCE_ARGS + r""") {
    __shared__ double part[256];
    for (long long o = blockIdx.x; o < outer; o += gridDim.x) {
        int shift = summa_shift(top, o, op);
        double acc = 0.0;
        for (long long i = threadIdx.x; i < inner; i += blockDim.x)
            acc = summa_join(acc, summa_term(x[o * so + i * si], op, shift), op);
        part[threadIdx.x] = acc;
        __syncthreads();
        for (int half = blockDim.x / 2; half > 0; half >>= 1) {
            if (threadIdx.x < half)
                part[threadIdx.x] = summa_join(part[threadIdx.x], part[threadIdx.x + half], op);
            __syncthreads();
        }
        if (threadIdx.x == 0) out[o] = op == 1 ? sqrt(part[0]) : part[0];
        __syncthreads();
    }
}
"""
_REDUCE_OUTER = _REDUCE_COMMON + 'extern "C" __global__ void reduce_outer(' + _REDUCE_ARGS + r""") {
    __shared__ double part[16][33];
    long long o = blockIdx.x * 32LL + threadIdx.x;
    double acc = 0.0;
    if (o < outer) {
        int shift = summa_shift(top, o, op);
        for (long long i = threadIdx.y; i < inner; i += blockDim.y)
            acc = summa_join(acc, summa_term(x[o * so + i * si], op, shift), op);
    }
    part[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && o < outer) {
        for (int y = 1; y < blockDim.y; ++y) acc = summa_join(acc, part[y][threadIdx.x], op);
        out[o] = op == 1 ? sqrt(acc) : acc;
    }
}
"""
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
        self.inner, self.outer = kernel("reduce_inner"), kernel("reduce_outer")

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
            self.outer((-(-outer // 32),), (32, 16), args)
        elif outer:
            self.inner((int(min(outer, 1 << 16)),), (256,), args)
        return out.reshape(()) if axis is None else out


def _reduced(x, axis) -> tuple:
    """``(outputs, elements each, output stride, element stride)`` (strides
    in elements) of reducing `x` (1-D or 2-D) along `axis` (None: all of a
    1-D `x`)."""
    if axis is None or x.ndim < 2:
        return 1, x.size, 0, (x.strides[0] // x.itemsize if x.ndim else 1)
    (s0, s1), (rows, cols) = (s // x.itemsize for s in x.strides), x.shape
    return (rows, cols, s0, s1) if axis == 1 else (cols, rows, s1, s0)


#: CuPy's elementwise kernels by name: ElementwiseKernel's arguments.
_ELEMENTWISE = {
    # summa.precision.ozaki.exponents' formulas in one kernel (its ~12 CuPy
    # operations were as many kernels to compile on a fresh machine)
    "exponents": ("float64 amax, float64 norm, int32 bits, float64 cap", "int32 shift",
                  "int ex; frexp(amax, &ex);"
                  "double nm = isfinite(norm) ? fmax(norm, 0.5) : 0.5;"
                  "double kept = fmin((double)bits,"
                  "                   floor(cap - log2(nm * (1.0 + ldexp(1.0, -30))) - 1e-9));"
                  "shift = amax > 0 ? (int)(kept - ex) : 0;", "summa_ozaki_exponents"),
    "finish": ("float64 s_hi, float64 s_lo, int32 e, int32 f, float64 m_hi, float64 m_lo, "
               "int32 t, float64 alpha, float64 beta", "float64 c",
               "double q = rint((s_hi + s_lo) / (m_hi + m_lo));"
               "double d = (s_hi - q * m_hi) + (s_lo - q * m_lo);"
               "double v = alpha * ldexp(d, t - e - f);"
               "c = beta == 0.0 ? v : v + beta * c;", "summa_ozaki_finish"),
    # a complex product's two real ones into C in place: no C-size temporary
    # beyond them (``real + 1j * imag`` and ``alpha *`` it were two, 32 bytes
    # an element of C, that no plan counted)
    "combine": ("float64 re, float64 im, complex128 alpha, complex128 beta", "complex128 c",
                "complex<double> v = alpha * complex<double>(re, im);"
                "c = (beta.real() == 0.0 && beta.imag() == 0.0) ? v : v + beta * c;",
                "summa_ozaki_combine"),
}


def kernel(name: str):
    """The kernel `name` (a :class:`Reduction` of :data:`_REDUCTIONS`,
    :data:`_ELEMENTWISE`, or the CUDA sources' ``residues``, ``fold``,
    ``fold_finish``, ``reduce_inner``, ``reduce_outer``), made once a process."""
    import cupy
    if name not in cache:
        if name in _REDUCTIONS:
            cache[name] = Reduction(name)
        elif name in _ELEMENTWISE:
            cache[name] = cupy.ElementwiseKernel(*_ELEMENTWISE[name])
        else:
            source = {"residues": _RESIDUES, "fold": _FOLD, "fold_finish": _FOLD_FINISH,
                      "reduce_inner": _REDUCE_INNER, "reduce_outer": _REDUCE_OUTER}[name]
            cache[name] = cupy.RawKernel(source, name)
    return cache[name]


def launch(compiled, rows: int, width: int, args) -> None:
    """`compiled` (a kernel) over `rows` rows (the grid's y, looped past
    65535) of `width` threads' work each (x)."""
    threads = 256
    blocks = int(min(max(1, -(-width // threads)), 4096))
    compiled((blocks, int(min(max(1, rows), 65535))), (threads,), args)


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
        e, f, m_hi, m_lo, t, alpha, beta, c, _ = self.ends
        kernel("finish")(self.s_hi, self.s_lo, e.reshape(self.m, 1), f.reshape(1, self.n),
                         m_hi, m_lo, t, float(alpha), float(beta), c)
