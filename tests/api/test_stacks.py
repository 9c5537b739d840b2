"""Stacks of matrices (:mod:`summa.api.stacks`): summa.matmul multiplies
operands of more than two dimensions as NumPy's matmul does, planned once
for every pair, on every rank count, in memory and out of core."""

import warnings

import numpy as np
import pytest

import summa
import summa.api.stateful as stateful
from helpers import gemm_scaled_error, op, random_array


def _stack_error(c, a, b, trans=("N", "N")) -> float:
    """The largest scaled error (the gauge, helpers.gemm_scaled_error) over
    the products of a stack, checked pair by pair against NumPy's broadcast."""
    a2, b2 = (x[..., None, :] if x.ndim == 1 and i == 0 else
              x[..., :, None] if x.ndim == 1 else x for i, x in enumerate((a, b)))
    ops = [t if x.ndim > 1 else "N" for t, x in zip(trans, (a, b))]
    batch = np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
    a2 = np.broadcast_to(a2, batch + a2.shape[-2:])
    b2 = np.broadcast_to(b2, batch + b2.shape[-2:])
    c2 = c.reshape(batch + (op(a2[(0,) * len(batch)], ops[0]).shape[0],
                            op(b2[(0,) * len(batch)], ops[1]).shape[1]))
    return max(gemm_scaled_error(c2[i], a2[i], b2[i], trans_a=ops[0], trans_b=ops[1])
               for i in np.ndindex(*batch))


def _cases(rng):
    """``(name, a, b, options, NumPy's product)`` of stacks of every kind."""
    x = random_array(rng, (3, 13, 11), "float64")
    y = random_array(rng, (3, 11, 9), "float64")
    z = random_array(rng, (2, 1, 13, 11), "complex128")
    w = random_array(rng, (4, 11, 9), "complex128")
    m, v = random_array(rng, (11, 9), "float64"), random_array(rng, (11,), "float64")
    f = np.asfortranarray(x)  # each matrix a strided view
    t = np.swapaxes(random_array(rng, (3, 11, 13), "float64"), 1, 2)  # each a .T view
    swap = lambda s: np.swapaxes(s, -1, -2)  # noqa: E731
    return [("stack @ stack", x, y, {}, x @ y),
            ("broadcast leading dimensions", z, w, {}, z @ w),
            ("stack @ matrix", x, m, {}, x @ m),
            ("matrix @ stack", m.T.copy(), y, {}, m.T @ y),
            ("stack @ vector", x, v, {}, x @ v),
            ("vector @ stack", v, y, {}, v @ y),
            ("Fortran-ordered stack", f, y, {}, f @ y),
            ("stack of .T views", t, y, {}, t @ y),
            ("reversed stack", x[::-1], y, {}, x[::-1] @ y),
            ("trans_a T", swap(x).copy(), y, {"trans_a": "T"}, x @ y),
            ("trans_b H", z, swap(w).conj().copy(), {"trans_b": "H"}, z @ w),
            ("two dtypes", x.astype(np.float32), y, {}, x.astype(np.float32) @ y),
            ("lists", x.tolist(), y, {}, x @ y)]


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("out_of_core", [False, True])
def test_stacks_multiply_as_numpy_does(comm, rng, out_of_core):
    """Every kind of stack gives NumPy's shape, dtype and products (each
    within the gauge), as a new array or into `out` of any layout; on
    every rank count, in memory and out of core."""
    mine = comm.rank == 0
    kwargs = dict(out_of_core=out_of_core, panel_width=4,
                  device_memory="4KiB" if out_of_core else None)
    for name, a, b, ops, want in _cases(rng):
        c = summa.matmul(a if mine else None, b if mine else None, **ops, **kwargs)
        if not mine:
            assert c is None
            continue
        assert type(c) is np.ndarray and c.shape == want.shape and c.dtype == want.dtype, name
        ta, tb = ops.get("trans_a", "N"), ops.get("trans_b", "N")
        assert _stack_error(c, np.asarray(a), np.asarray(b), (ta, tb)) <= 1, name
    x, y = random_array(rng, (3, 13, 11), "float64"), random_array(rng, (3, 11, 9), "float64")
    outs = {"C": np.empty((3, 13, 9)), "Fortran": np.empty((3, 13, 9), order="F"),
            "strided": np.empty((3, 26, 9))[:, ::2], "reversed": np.empty((3, 13, 9))[::-1]}
    for name, out in outs.items():
        c = summa.matmul(x if mine else None, y if mine else None, out=out if mine else None,
                         **kwargs)
        if mine:
            assert c is out and _stack_error(out, x, y) <= 1, name


@pytest.mark.mpi(min_size=1)
def test_a_stack_is_planned_once_and_leaves_its_operands_alone(comm, rng, monkeypatch):
    """A stack of 6 products plans one Matmul (the planner asked once), and
    neither operand changes."""
    plans = []
    planned = stateful.plan_arrays
    monkeypatch.setattr(stateful, "plan_arrays",
                        lambda *args, **kw: plans.append(1) or planned(*args, **kw))
    mine = comm.rank == 0
    a, b = random_array(rng, (2, 3, 9, 7), "float32"), random_array(rng, (7, 5), "float32")
    kept = a.copy(), b.copy()
    c = summa.matmul(a if mine else None, b if mine else None, panel_width=2)
    assert len(plans) == 1
    if mine:
        assert c.shape == (2, 3, 9, 5) and _stack_error(c, a, b) <= 1
        assert np.array_equal(a, kept[0]) and np.array_equal(b, kept[1])


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("out_of_core", [False, True])
def test_stacks_of_integers_or_two_dtypes_are_converted_once(comm, rng, monkeypatch,
                                                              out_of_core):
    """A stack of integers (or of two dtypes) is converted into the type its
    products are computed in once, not again for each pair (each operand one
    copy), and gives NumPy's product: integers bit for bit, in NumPy's type
    (a narrower one wrapping), into an `out` of theirs too."""
    import summa.api.promotion as promotion
    copies = []
    real = promotion._converted
    monkeypatch.setattr(promotion, "_converted",
                        lambda x, *args: copies.append(x) or real(x, *args))
    mine = comm.rank == 0
    kwargs = dict(out_of_core=out_of_core, panel_width=3,
                  device_memory="2KiB" if out_of_core else None)
    a = rng.integers(-300, 300, (3, 2, 9, 7)).astype(np.int16)
    b = rng.integers(0, 256, (7, 5)).astype(np.uint8)
    for out in (None, np.empty((3, 2, 9, 5), np.int16)):
        copies.clear()
        c = summa.matmul(a if mine else None, b if mine else None,
                         out=out if mine else None, **kwargs)
        if mine:
            assert len(copies) == 2 and (out is None or c is out)
            assert c.dtype == np.int16 and np.array_equal(c, a @ b)
    x, y = random_array(rng, (4, 6, 5), "float32"), random_array(rng, (5, 3), "float64")
    copies.clear()
    c = summa.matmul(x if mine else None, y if mine else None, **kwargs)
    if mine:
        assert len(copies) == 2 and c.dtype == np.float64
        assert _stack_error(c, x.astype(np.float64), y) <= 1


@pytest.mark.mpi(min_size=1)
def test_an_empty_stack_gives_numpys_empty_product(comm):
    mine = comm.rank == 0
    a, b = np.empty((0, 4, 5), np.float32), np.empty((3, 1, 5, 6))
    c = summa.matmul(a if mine else None, b if mine else None)
    if mine:
        want = a @ b
        assert c.shape == want.shape == (3, 0, 4, 6) and c.dtype == want.dtype


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("a_shape, b_shape, out_shape, match", [
    ((2, 3, 4), (3, 4, 5), None, r"a stacks matrices \(2,\) and b \(3,\): the leading "
                                 "dimensions do not broadcast"),
    ((2, 3, 4), (2, 5, 5), None, "inner dimensions differ: op.a.'s matrices have 4 columns, "
                                 "op.b.'s 5 rows"),
    ((2, 3, 4), (4, 5), (2, 3, 6), r"out must be of the stack's product's shape \(2, 3, 5\), "
                                   r"got \(2, 3, 6\)"),
    ((2, 3, 4), ("x",), None, "b is not an array"),
])
def test_stacks_that_cannot_multiply_are_refused_on_every_rank(comm, a_shape, b_shape, out_shape,
                                                               match):
    mine = comm.rank == 0
    a = np.ones(a_shape)
    b = np.ones(b_shape) if b_shape != ("x",) else "x"
    out = np.empty(out_shape) if out_shape else None
    with pytest.raises(ValueError, match=match):
        summa.matmul(a if mine else None, b if mine else None, out=out if mine else None)


@pytest.mark.mpi(min_size=1)
def test_a_stack_with_nan_warns_which_operand_holds_it(comm, rng):
    mine = comm.rank == 0
    a, b = random_array(rng, (3, 6, 5), "float64"), random_array(rng, (5, 4), "float64")
    a[2, 1, 3] = np.nan
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        c = summa.matmul(a if mine else None, b if mine else None)
    if mine:
        assert np.isnan(c[2, 1]).all() and np.isfinite(c[:2]).all()
        assert any("a contains 1 NaN/Inf" in str(w.message) for w in caught)


def test_a_matmul_is_planned_for_one_pair_of_matrices():
    with pytest.raises(ValueError, match="got 3-D: summa.matmul multiplies stacks"):
        summa.Matmul(np.ones((2, 3, 4)), np.ones((4, 5)))
