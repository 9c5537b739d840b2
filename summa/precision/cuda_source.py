"""The CUDA source of fp64-int8's kernels (:mod:`summa.precision.kernels`
launches them), one module: a process loads it once, shipped compiled
(:mod:`summa.precision.binaries`) or compiled from :data:`SOURCE` (one NVRTC
compile, which CuPy keeps on disk).

One module, not CuPy's elementwise and reduction kernels: those compiled a
variant per number of dimensions and layout, each with CuPy's headers (the
fresh machine's first call compiled for 6 s one by one, 0.6-1.1 s side by
side), where this source is one compile and no variants. Every kernel
mirrors the NumPy code of :mod:`summa.precision.ozaki` (the same float64
formulas); tests/fake_cupy_kernels.py is them in NumPy.

Each kernel's element loops run rows on the grid's y axis and columns on x
(:func:`summa.precision.kernels.launch`): no 64-bit division per element (a
flat index cost the residues twice: 48 ms of a 1.25 s product at N = 32768
in `benchmarks/fp64_int8_speed.py`'s phases).
"""

from __future__ import annotations

import hashlib

__all__ = ["SOURCE", "OPTIONS", "NAMES", "digest"]

#: NVRTC's options for :data:`SOURCE` (none: exact rint, ldexp and division).
OPTIONS: tuple = ()

# C's element as the product ends it: the two sums' remainder by the moduli's
# product (exact: :func:`summa.precision.ozaki.finish`), unscaled, alpha and
# beta applied (beta 0: whatever C held, NaN too, is gone). And the element
# loops of every kernel but the reductions' (rows on the grid's y, columns on x).
_END = r"""
__device__ __forceinline__ void summa_end(double hi, double lo, double m_hi, double m_lo,
        int shift, double alpha, double beta, double* cj) {
    double q = rint((hi + lo) / (m_hi + m_lo));
    double d = (hi - q * m_hi) + (lo - q * m_lo);
    double v = alpha * ldexp(d, shift);
    *cj = beta == 0.0 ? v : v + beta * *cj;
}
#define SUMMA_ROWS(r, rows) for (long long r = blockIdx.y; r < (rows); r += gridDim.y)
#define SUMMA_COLS(j, cols) for (long long j = blockIdx.x * (long long)blockDim.x + threadIdx.x; \
                                 j < (cols); j += (long long)gridDim.x * blockDim.x)
"""

# Residues: four columns a thread, one 4-byte store per plane (cols_p is a
# multiple of 4, the planes 4-aligned).
_RESIDUES = r"""
extern "C" __global__ void residues(const double* x, const int* e, long long rows,
        long long rows_p, long long cols, long long cols_p, long long ld, int count,
        const double* moduli, const double* inverses, signed char* out) {
    long long plane = rows_p * cols_p, quads = cols_p / 4;
    SUMMA_ROWS(r, rows_p) {
        SUMMA_COLS(q, quads) {
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
    SUMMA_ROWS(r, rows) {
        SUMMA_COLS(j, cols) {
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
# The last fold ends the product with the sums in registers (summa_end: the
# finish kernel's formulas below).
_FOLD_FINISH = ('extern "C" __global__ void fold_finish(' + _FOLD_ARGS +
                ", const int* e, const int* f, double m_hi, double m_lo, int t, double alpha, "
                "double beta, double* c, long long ldc) {" + _FOLD_BODY.replace(
                    "FINISH", "summa_end(hi, lo, m_hi, m_lo, t - e[r] - f[j], alpha, beta, "
                    "c + r * ldc + j);"))

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
_REDUCE_INNER = 'extern "C" __global__ void reduce_inner(' + _REDUCE_ARGS + r""") {
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
_REDUCE_OUTER = 'extern "C" __global__ void reduce_outer(' + _REDUCE_ARGS + r""") {
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

# The scaling exponents from the reductions' largest magnitudes and norms:
# :func:`summa.precision.ozaki.exponents`' formulas in one pass.
_EXPONENTS = r"""
extern "C" __global__ void exponents(const double* amax, const double* norm, long long count,
        int bits, double cap, int* shift) {
    SUMMA_COLS(i, count) {
        int ex;
        frexp(amax[i], &ex);
        double nm = isfinite(norm[i]) ? fmax(norm[i], 0.5) : 0.5;
        double kept = fmin((double)bits, floor(cap - log2(nm * (1.0 + ldexp(1.0, -30))) - 1e-9));
        shift[i] = amax[i] > 0 ? (int)(kept - ex) : 0;
    }
}
"""

# The sums into a C whose rows are not contiguous (a transposed view): C's
# strides `sr`, `sc` in elements.
_FINISH = r"""
extern "C" __global__ void finish(const double* s_hi, const double* s_lo, const int* e,
        const int* f, long long rows, long long cols, double m_hi, double m_lo, int t,
        double alpha, double beta, double* c, long long sr, long long sc) {
    SUMMA_ROWS(r, rows) {
        SUMMA_COLS(j, cols) {
            long long idx = r * cols + j;
            summa_end(s_hi[idx], s_lo[idx], m_hi, m_lo, t - e[r] - f[j], alpha, beta,
                      c + r * sr + j * sc);
        }
    }
}
"""

# A complex product's two real ones into C in place, ``alpha (re + i im) +
# beta C`` (C's strides in complex elements): no C-size temporary beyond
# them (``real + 1j * imag`` and ``alpha *`` it were two, 32 bytes an element
# of C, that no plan counted). And a complex operand's parts, each
# contiguous, in one pass.
_COMPLEX = r"""
extern "C" __global__ void combine(const double* re, const double* im, long long rows,
        long long cols, double ar, double ai, double br, double bi, double* c, long long sr,
        long long sc) {
    SUMMA_ROWS(r, rows) {
        SUMMA_COLS(j, cols) {
            double x = re[r * cols + j], y = im[r * cols + j];
            double vr = ar * x - ai * y, vi = ar * y + ai * x;
            double* cj = c + 2 * (r * sr + j * sc);
            if (br != 0.0 || bi != 0.0) {
                double cr = cj[0], ci = cj[1];
                vr += br * cr - bi * ci;
                vi += br * ci + bi * cr;
            }
            cj[0] = vr;
            cj[1] = vi;
        }
    }
}
extern "C" __global__ void split(const double* x, long long rows, long long cols, long long sr,
        long long sc, double* re, double* im) {
    SUMMA_ROWS(r, rows) {
        SUMMA_COLS(j, cols) {
            const double* xj = x + 2 * (r * sr + j * sc);
            re[r * cols + j] = xj[0];
            im[r * cols + j] = xj[1];
        }
    }
}
"""

#: fp64-int8's kernels, one CUDA source.
SOURCE = (_END + _RESIDUES + _FOLD + _FOLD_FINISH + _REDUCE_COMMON + _REDUCE_INNER + _REDUCE_OUTER
          + _EXPONENTS + _FINISH + _COMPLEX)

#: The kernels :data:`SOURCE` defines.
NAMES = ("residues", "fold", "fold_finish", "reduce_inner", "reduce_outer", "exponents",
         "finish", "combine", "split")


def digest(source: str = SOURCE, options: tuple = OPTIONS) -> str:
    """sha256 of `source` and `options`: what a shipped binary was built from
    (:mod:`summa.precision.binaries`)."""
    return hashlib.sha256("\0".join((source,) + tuple(options)).encode()).hexdigest()
