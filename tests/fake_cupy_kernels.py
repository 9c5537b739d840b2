"""Just enough of CuPy for summa.precision.ozaki_gpu on a machine without a GPU.

Device arrays are NumPy arrays; the kernels are NumPy versions of the CUDA
source in summa/precision/cuda_source.py (same formulas, element for element),
run at once when launched; streams and events only record the order of calls. What
this checks is ozaki_gpu's own work: the residue planes and their padding,
the grouping of products per fold, K in pieces, chunks of rows, complex
products, alpha and beta, the Inf/NaN checks, and that the pitches a kernel
is given are where its arrays' elements lie. The CUDA kernels
themselves are checked against the CPU on the GPU (tests/test_gpu.py).
"""

from __future__ import annotations

import types

import numpy as np


class _Event:
    def record(self, stream=None):
        return self


class _Stream:
    current = None

    def __init__(self, non_blocking=False):
        self.waits = 0

    def record(self):
        return _Event()

    def wait_event(self, event):
        self.waits += 1

    def synchronize(self):
        pass

    def __enter__(self):
        self._saved, _Stream.current = _Stream.current, self
        return self

    def __exit__(self, *exc):
        _Stream.current = self._saved
        return False


_Stream.current = _Stream()


def _laid_out(x, pitch, plane=None) -> None:
    """A kernel reads `x` from its first element, rows `pitch` elements apart
    (and planes `plane` apart) with contiguous rows: that must be where its
    NumPy view's elements lie (along axes of more than one element)."""
    steps = (1, int(pitch)) if plane is None else (1, int(pitch), int(plane))
    for length, stride, step in zip(x.shape[::-1], x.strides[::-1], steps):
        assert x.size == 0 or length == 1 or stride == step * x.itemsize


def _residues(x, e, rows, rows_p, cols, cols_p, ld, count, moduli, inverses, out):
    _laid_out(x, ld)
    _laid_out(out.reshape(int(count), int(rows_p), int(cols_p)), cols_p)
    xb = np.zeros((int(rows_p), int(cols_p)))
    rows, cols = int(rows), int(cols)
    xb[:rows, :cols] = np.rint(np.ldexp(x[:rows, :cols], e[:rows, None]))
    planes = out.reshape(int(count), int(rows_p), int(cols_p))
    for l in range(int(count)):
        m = moduli[l]
        v = xb - m * np.rint(xb * inverses[l])
        v = np.where(v > 127.0, v - m, v)
        v = np.where(v < -128.0, v + m, v)
        planes[l] = v.astype(np.int8)


def _sums(g, rows, cols, count, moduli, inverses, w_hi, w_lo, s_hi, s_lo, first):
    rows, cols = int(rows), int(cols)
    hi = np.zeros((rows, cols)) if first else s_hi.copy()
    lo = np.zeros((rows, cols)) if first else s_lo.copy()
    for p in range(int(count)):
        gd = g[p, :rows, :cols].astype(np.float64)
        u = gd - moduli[p] * np.rint(gd * inverses[p])
        hi += u * w_hi[p]
        lo += u * w_lo[p]
    return hi, lo


def _fold(g, rows, cols, ldg, plane, count, moduli, inverses, w_hi, w_lo, s_hi, s_lo, first):
    _laid_out(g, ldg, plane)
    s_hi[...], s_lo[...] = _sums(g, rows, cols, count, moduli, inverses, w_hi, w_lo, s_hi,
                                 s_lo, first)


def _finish(s_hi, s_lo, e, f, m_hi, m_lo, t, alpha, beta, c):
    q = np.rint((s_hi + s_lo) / (m_hi + m_lo))
    d = (s_hi - q * m_hi) + (s_lo - q * m_lo)
    v = alpha * np.ldexp(d, int(t) - e - f)
    c[...] = v if beta == 0.0 else v + beta * c


def _fold_finish(g, rows, cols, ldg, plane, count, moduli, inverses, w_hi, w_lo, s_hi, s_lo,
                 first, e, f, m_hi, m_lo, t, alpha, beta, c, ldc):
    _laid_out(c, ldc)
    _laid_out(g, ldg, plane)
    hi, lo = _sums(g, rows, cols, count, moduli, inverses, w_hi, w_lo, s_hi, s_lo, first)
    _finish(hi, lo, e.reshape(-1, 1), f.reshape(1, -1), m_hi, m_lo, t, alpha, beta, c)


def _combine(re, im, alpha, beta, c):
    v = alpha * (re + 1j * im)
    c[...] = v if beta == 0 else v + beta * c


def _strided(c, sr, sc) -> None:
    """A kernel writes `c`'s element (r, j) at ``r sr + j sc`` elements
    from its first: that must be where its NumPy view's elements lie."""
    for length, stride, step in zip(c.shape, c.strides, (sr, sc)):
        assert c.size == 0 or length == 1 or stride == int(step) * c.itemsize


def _exponents(amax, norm, count, bits, cap, shift):
    from summa.precision import ozaki
    shift[...] = ozaki.exponents(amax, int(bits), np, norm, float(cap))


def _finish_apart(s_hi, s_lo, e, f, rows, cols, m_hi, m_lo, t, alpha, beta, c, sr, sc):
    _strided(c, sr, sc)
    _finish(s_hi, s_lo, e.reshape(-1, 1), f.reshape(1, -1), m_hi, m_lo, t, alpha, beta, c)


def _combine_apart(re, im, rows, cols, ar, ai, br, bi, c, sr, sc):
    _strided(c, sr, sc)
    _combine(re, im, complex(ar, ai), complex(br, bi), c)


def _split(x, rows, cols, sr, sc, re, im):
    _strided(x, sr, sc)
    re[...], im[...] = x.real, x.imag


def _reduce(x, outer, inner, so, si, op, top, out):
    """Both reduction kernels: `outer` outputs, each over `inner` elements of
    `x` (strides `so`, `si` in elements from its first), the largest
    magnitude (Inf for Inf/NaN; op 0) or the 2-norm scaled by 2**-exponent
    of `top`'s (op 1)."""
    rows = np.lib.stride_tricks.as_strided(x, (int(outer), int(inner)),
                                           (int(so) * 8, int(si) * 8))
    if op == 0:
        out[...] = np.where(np.isfinite(rows), np.abs(rows), np.inf).max(axis=1, initial=0.0)
    else:
        scaled = np.ldexp(rows, -np.frexp(top[:int(outer)])[1][:, None])
        out[...] = np.sqrt(np.sum(np.square(scaled), axis=1))


_KERNELS = {"residues": _residues, "fold": _fold, "fold_finish": _fold_finish,
            "reduce_inner": _reduce, "reduce_outer": _reduce, "exponents": _exponents,
            "finish": _finish_apart, "combine": _combine_apart, "split": _split}


class _Function:
    """A kernel of a module, run in NumPy; counts its launches."""

    def __init__(self, source, name):
        assert f"void {name}(" in source  # the source holds the kernel it names
        self.fn, self.name, self.launches = _KERNELS[name], name, 0

    def compile(self):
        pass

    def __call__(self, grid, block, args):
        self.launches += 1
        self.fn(*args)


class _RawModule:
    """CuPy's RawModule of CUDA `code` (a shipped binary's `path` is never
    loaded here: the stand-in's driver is too old for it); `made` lists the
    modules made."""
    made: list = []

    def __init__(self, code=None, path=None, options=()):
        assert code is not None and path is None
        self.code, self.options = code, options
        _RawModule.made.append(self)

    def get_function(self, name):
        return _Function(self.code, name)


class _Device:
    """CuPy's device as a context: the device each thread entered, by thread;
    `count` visible (``cuda.runtime.getDeviceCount``)."""
    current: dict = {}
    count = 1
    compute_capability = "90"

    def __init__(self, id=None):
        import threading
        self.thread = threading.get_ident()
        self.id = _Device.current.get(self.thread, 0) if id is None else id

    def __enter__(self):
        self._saved = _Device.current.get(self.thread, 0)
        _Device.current[self.thread] = self.id
        return self

    def __exit__(self, *exc):
        _Device.current[self.thread] = self._saved


def module():
    """A stand-in for the ``cupy`` module."""
    cuda = types.SimpleNamespace(
        Event=lambda *a, **k: _Event(), Stream=_Stream,
        get_current_stream=lambda: _Stream.current or _Stream(), Device=_Device,
        runtime=types.SimpleNamespace(getDeviceCount=lambda: _Device.count,
                                      driverGetVersion=lambda: 0))
    fake = types.SimpleNamespace(
        cuda=cuda, RawModule=_RawModule,
        empty=np.empty, zeros=np.zeros, ones=np.ones,
        isinf=np.isinf, dtype=np.dtype,
        asarray=np.asarray,
        ascontiguousarray=np.ascontiguousarray, float64=np.float64, int8=np.int8,
        int32=np.int32, frexp=np.frexp, where=np.where, ndarray=np.ndarray, log2=np.log2,
        floor=np.floor, minimum=np.minimum, maximum=np.maximum, isfinite=np.isfinite,
        ldexp=np.ldexp, sqrt=np.sqrt, asnumpy=np.array)
    return fake


class Backend:
    """The two calls of CupyBackend that ozaki_gpu makes, in NumPy."""

    name = "cupy"
    is_gpu = True

    def __init__(self):
        self.gemms = 0

    def int8_gemm_tn(self, a8, bt8, out, accumulate=False):
        assert a8.shape[1] % 4 == 0 and out.shape[1] % 4 == 0 and out.flags.c_contiguous
        self.gemms += 1
        product = (a8.astype(np.int64) @ bt8.astype(np.int64).T).astype(np.int32)
        out[...] = out + product if accumulate else product

    def transpose(self, x, out):
        out[...] = x.T
