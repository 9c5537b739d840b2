"""Casts between integer host rows and float64 (summa.device.casts): the
float64 product given back as NumPy's integer matmul gives it."""

import numpy as np
import pytest

from summa.device.casts import EXACT_SLAB, cast_rows, exact_into

TYPES = ["int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "bool"]


def _products(rng, shape) -> np.ndarray:
    """float64 holding exact integers as a product's sums do: most small,
    some beyond the narrow types' ranges (they wrap), int32's bounds and
    values just past them among them."""
    x = rng.integers(-300, 300, shape).astype(np.float64)
    flat = x.reshape(-1)
    picks = rng.choice(flat.size, size=min(flat.size, 64), replace=False)
    edges = np.array([2**31 - 1, -2**31, 2**31, -2**31 - 1, 2**40 + 3, -2**45 - 9, 2**52,
                      65535, 65536, -32769, 255, 256])
    flat[picks] = rng.choice(edges, size=picks.size)
    return x


@pytest.mark.parametrize("dtype", TYPES)
@pytest.mark.parametrize("width", [7, EXACT_SLAB + 5, 4096])
def test_a_products_float64_drains_into_any_integer_type_as_numpy_wraps(rng, dtype, width):
    src = _products(rng, (11, width))
    want = src != 0 if dtype == "bool" else src.astype(np.int64).astype(dtype)
    dst = np.empty(src.shape, dtype)
    exact_into(dst, src)
    assert np.array_equal(dst, want)
    # and in rows of a wider array (a chunk drained into its place)
    into = np.zeros((11, width + 3), dtype)
    cast_rows(into[:, 1:width + 1], src)
    assert np.array_equal(into[:, 1:width + 1], want) and not into[:, 0].any()


def test_int32_products_within_range_take_one_pass_and_the_rest_stay_exact(rng, monkeypatch):
    """Within int32's range the straight cast is the answer; a value at or
    past its bounds sends the rows through int64 again, exact either way."""
    from summa.device import casts
    slabs = []
    real = np.copyto
    monkeypatch.setattr(casts.np, "copyto", lambda dst, src, **k: (
        slabs.append(dst.dtype.name), real(dst, src, **k))[1])
    inside = rng.integers(-2**31 + 1, 2**31 - 1, (9, 2048)).astype(np.float64)
    dst = np.empty(inside.shape, np.int32)
    exact_into(dst, inside)
    assert np.array_equal(dst, inside.astype(np.int32)) and slabs == ["int32"]
    slabs.clear()
    past = inside.copy()
    past[4, 7], past[8, 0] = 2.0**33 + 5, -2.0**31  # wraps; exactly int32's least
    exact_into(dst, past)
    assert np.array_equal(dst, past.astype(np.int64).astype(np.int32))
    assert "int64" in slabs  # (converted through int64 again)
