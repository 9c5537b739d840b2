"""Copies on host threads (summa.host.copies): every pair of layouts, in
tiles where one lies by rows and the other by columns, on several threads."""

import numpy as np
import pytest

from summa.host import copies


def _layouts(rng, shape, dtype):
    """The same values lying every way a caller's array may: C, Fortran, a
    .T view, strided and reversed views."""
    x = rng.uniform(-1, 1, shape).astype(dtype)
    wide = np.zeros((shape[0], 2 * shape[1]), dtype)
    wide[:, ::2] = x
    return {"C": x.copy(), "F": np.asfortranarray(x), ".T": np.ascontiguousarray(x.T).T,
            "strided": wide[:, ::2], "reversed": x[::-1, ::-1].copy()[::-1, ::-1]}


@pytest.mark.parametrize("threads", [1, 3])
def test_a_copy_between_any_two_layouts_is_exact(monkeypatch, threads):
    monkeypatch.setattr(copies, "THREADED_MIN", 0)  # small arrays on threads too
    monkeypatch.setattr(copies, "TRANSPOSE_TILE", 7)  # tiles and remainders
    rng = np.random.default_rng(5)
    shape = (61, 45)
    sources = _layouts(rng, shape, np.float64)
    want = sources["C"]
    for s_name, src in sources.items():
        for d_name in sources:
            dst = {"C": np.empty(shape), "F": np.empty(shape, order="F"),
                   ".T": np.empty(shape[::-1]).T, "strided": np.empty((61, 90))[:, ::2],
                   "reversed": np.empty(shape)[::-1, ::-1]}[d_name]
            copies.parallel_copy(dst, src, threads)
            assert np.array_equal(dst, want), (s_name, d_name)


def test_a_transposing_copy_goes_in_tiles(monkeypatch):
    """From a Fortran-ordered array into a C-ordered one, every NumPy copy
    is of one tile (not of whole rows, each read a column apart)."""
    monkeypatch.setattr(copies, "TRANSPOSE_TILE", 16)
    seen = []
    real = np.copyto
    monkeypatch.setattr(copies.np, "copyto",
                        lambda d, s, **kw: (seen.append(d.shape), real(d, s, **kw)))
    x = np.asfortranarray(np.arange(40 * 50, dtype=np.float64).reshape(40, 50))
    out = np.empty((40, 50))
    copies.parallel_copy(out, x, 1)
    assert np.array_equal(out, x) and max(max(s) for s in seen) <= 16
    seen.clear()
    copies.parallel_copy(out, np.ascontiguousarray(x), 1)  # rows to rows: one copy
    assert seen == [(40, 50)]


def test_a_converted_copy_keeps_the_values_and_the_order():
    x = np.asfortranarray(np.arange(20.0).reshape(4, 5)).astype(">f8")  # big-endian, Fortran
    for dtype in (np.dtype("=f8"), np.dtype(np.complex128)):
        y = copies.converted(x, dtype)
        assert y.dtype == dtype and y.flags.f_contiguous and type(y) is np.ndarray
        assert np.array_equal(y, x)


def test_a_converted_copy_casts_as_assignment_does():
    """Floats into integers truncate, integers into a narrower type keep the
    low bits, floats into bool are nonzero: as ``dst[...] = src`` casts."""
    x = np.array([[2.0**40 + 3, -7.9], [0.0, 0.5]])
    assert np.array_equal(copies.converted(x, np.int64), x.astype(np.int64))
    wide = np.array([[2**40 + 3, -7], [300, -129]], np.int64)
    assert np.array_equal(copies.converted(wide, np.int8), wide.astype(np.int8))
    assert np.array_equal(copies.converted(x, bool), x != 0)


@pytest.mark.parametrize("threads", [1, 3])
def test_extremes_are_numpys_on_any_layout(monkeypatch, threads):
    monkeypatch.setattr(copies, "THREADED_MIN", 0)
    rng = np.random.default_rng(2)
    for name, x in _layouts(rng, (61, 45), np.float64).items():
        x = (x * 2**40).astype(np.int64)
        assert copies.extremes(x, threads) == (int(x.min()), int(x.max())), name
