"""Casts between integer host rows and the float64 a GPU multiplies them in,
made inside a copy the rows take anyway (the host-GPU copies' fill and
drain of their page-locked chunks, :mod:`summa.device.staging`), so that no
whole float64 copy of an operand or of the product is made in host memory.
The host threads convert, not the GPU: int32 rows converted on the GPU
through a scratch on the copy stream moved half the bytes, but each
conversion kernel waited behind the GEMMs for SMs and held up the copies
queued after it (int32 16384³ from host, 0.395 against 0.332 s:
docs/benchmarks.md, "Measurements behind the defaults").

Integer (and boolean) operands multiply exactly in float64 while every sum
stays below 2**53 (:func:`summa.api.promotion.exact_integers` checks it); the
float64 product is given back as NumPy's integer matmul gives it: through
int64, a narrower type keeping the low bits (it wraps), bool: nonzero.
"""

from __future__ import annotations

import threading

import numpy as np

__all__ = ["cast_rows", "exact_into", "converts", "EXACT_SLAB"]

#: Elements of float64 :func:`exact_into` converts through int64 at a time:
#: its scratch (128 KiB a thread) stays in the caches between the two casts,
#: and no chunk-sized int64 array is allocated (and faulted in) per chunk.
EXACT_SLAB = 1 << 14

_scratch = threading.local()


def converts(host: np.dtype, dev: np.dtype) -> bool:
    """Is a copy between host rows of `host` and device rows of `dev` one
    that converts (integers or bools on the host, float64 on the device)?"""
    return np.dtype(host) != np.dtype(dev) and np.dtype(dev) == np.float64 and \
        np.dtype(host).kind in "biu"


def cast_rows(dst: np.ndarray, src: np.ndarray) -> None:
    """``dst[...] = src`` in one pass, the two of the same shape and perhaps
    of two types: integers or bools into float64 as NumPy casts them (exact:
    every value below 2**53 in magnitude is), float64 holding exact integers
    back into an integer or boolean type as :func:`exact_into` does, equal
    types copied as they are."""
    if dst.dtype == src.dtype or dst.dtype.kind not in "biu":
        np.copyto(dst, src, casting="unsafe")
    else:
        exact_into(dst, src)


def exact_into(dst: np.ndarray, src: np.ndarray) -> None:
    """The float64 `src`, exact integers, into the integer or boolean `dst`
    (same shape) as NumPy's integer matmul gives its product: through int64,
    so that a narrower type keeps the low bits (float64 cast straight into
    int32 gives INT_MIN beyond its range, not the wrapped value); bool:
    nonzero. A slab of :data:`EXACT_SLAB` elements at a time."""
    if dst.dtype.kind == "b":
        np.not_equal(src, 0, out=dst)
        return
    if dst.dtype.itemsize == 8:  # int64, uint64: exact in one cast
        np.copyto(dst, src, casting="unsafe")
        return
    if dst.dtype == np.int32 and _straight_into_int32(dst, src):
        return
    if dst.ndim != 2 or not dst.shape[0] or dst.shape[1] > EXACT_SLAB:
        np.copyto(dst, src.astype(np.int64), casting="unsafe")  # (small or odd: at once)
        return
    buf = getattr(_scratch, "buf", None)
    if buf is None:
        buf = _scratch.buf = np.empty(EXACT_SLAB, np.int64)
    rows = max(1, EXACT_SLAB // max(1, dst.shape[1]))
    for r in range(0, dst.shape[0], rows):
        part = src[r:r + rows]
        whole = buf[:part.size].reshape(part.shape)
        np.copyto(whole, part, casting="unsafe")
        np.copyto(dst[r:r + rows], whole, casting="unsafe")


def _straight_into_int32(dst: np.ndarray, src: np.ndarray) -> bool:
    """Cast the float64 `src` straight into the int32 `dst` and say whether
    that was exact (True), one pass where :func:`exact_into`'s slabs take
    two: exact for every value within int32's range, and a value beyond it
    comes out as int32's least or greatest (x86's "integer indefinite";
    other processors saturate), so where neither appears in `dst` none was
    beyond it. Where one does (False) the caller converts through int64
    again, a value that truly is int32's least or greatest among them. On a
    2-core box, 4096 x 16384 float64: 4.1 GB/s with the check against 1.9
    through int64 slabs (a product's drain into int32, the common case)."""
    if not dst.size:
        return True
    with np.errstate(invalid="ignore"):  # (out of range: caught below)
        np.copyto(dst, src, casting="unsafe")
    info = np.iinfo(np.int32)
    return bool(dst.min() > info.min and dst.max() < info.max)
