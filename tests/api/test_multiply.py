"""Products of arrays and DistMatrix operands (:mod:`summa.api.multiply`):
the NumPy-array API under MPI, ``out=``, refusals on every rank, and
``summa.matmul``'s signature. The files workflow: test_files.py."""

import numpy as np
import pytest

import summa
import summa.transports.comm as comm_mod
from helpers import gemm_scaled_error, random_array, spy_out_of_core


def save(comm, folder, name, array, fortran=False):
    if comm.rank == 0:
        np.save(folder / name, np.asfortranarray(array) if fortran else array)
    comm.Barrier()
    return str(folder / name)


@pytest.mark.mpi(min_size=1)
def test_chunked_messages_path(comm, rng, folder, monkeypatch):
    """Lowering the message limit sends every block in many pieces: the path that
    arrays over 2**31 elements take."""
    monkeypatch.setattr(comm_mod, "CHUNK_BYTES", 1000)
    a, b = random_array(rng, (60, 33), "complex64"), random_array(rng, (33, 47), "complex64")
    c = summa.matmul(a if comm.rank == 0 else None, b if comm.rank == 0 else None,
                     panel_width=8)
    if comm.rank == 0:
        assert gemm_scaled_error(c, a, b) <= 1
    else:
        assert c is None


@pytest.mark.mpi(min_size=1)
def test_numpy_array_api(comm, rng):
    a, b = random_array(rng, (31, 12), "float32"), random_array(rng, (15, 12), "float32")
    root = comm.Get_size() - 1
    c = summa.matmul(a if comm.rank == root else None, b if comm.rank == root else None,
                     root=root, trans_b="T", alpha=3.0)
    if comm.rank == root:
        assert c.shape == (31, 15) and gemm_scaled_error(c, a, b, alpha=3.0, trans_b="T") <= 1


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("trans_a", ["N", "T"])
def test_numpy_array_api_grid_follows_the_product_shape(comm, rng, monkeypatch, trans_a):
    # op(A) @ B of 96 x 20 on 4 ranks: blocks as square as can be, 4x1 (not 2x2)
    from summa.api import multiply
    from summa.distribution.grid import grid_for
    shapes = []
    real = multiply.ProcessGrid
    monkeypatch.setattr(multiply, "ProcessGrid",
                        lambda comm_, dims=None, **kw: shapes.append(dims)
                        or real(comm_, dims, **kw))
    a = random_array(rng, (96, 24) if trans_a == "N" else (24, 96), "float64")
    b = random_array(rng, (24, 20), "float64")
    root = comm.Get_size() - 1
    c = summa.matmul(a if comm.rank == root else None, b if comm.rank == root else None,
                     root=root, trans_a=trans_a, backend="numpy")
    assert shapes == [grid_for(comm.Get_size(), 96, 20, "numpy", "float64")]
    assert comm.Get_size() != 4 or shapes == [(4, 1)]
    if comm.rank == root:
        assert gemm_scaled_error(c, a, b, trans_a=trans_a) <= 1
    # what the root holds is not an array: one error on every rank, no hang
    with pytest.raises(ValueError, match="array"):
        summa.matmul("not an array" if comm.rank == root else None, None, root=root,
                     backend="numpy")


@pytest.mark.mpi(min_size=1)
def test_from_npy_to_npy_round_trip(comm, rng, folder):
    a = random_array(rng, (19, 11), "complex64")
    pa = save(comm, folder, "A.npy", a, fortran=True)
    with summa.ProcessGrid(comm) as grid:
        A = summa.DistMatrix.from_npy(pa, grid, block=(2, 3))
        A.to_npy(str(folder / "copy.npy"))
        T = summa.DistMatrix.from_npy(pa, grid, trans="H")
        t = T.gather()
    if comm.rank == 0:
        assert np.array_equal(np.load(folder / "copy.npy"), a)
        assert np.array_equal(t, a.conj().T)


def test_single_process_api_without_mpiexec():
    rng = np.random.default_rng()
    a, b = random_array(rng, (9, 4), "float64"), random_array(rng, (4, 6), "float64")
    assert gemm_scaled_error(summa.matmul(a, b), a, b) <= 1


# -- NumPy arrays in host memory: read where they lie, the product written in place ----

def test_one_rank_multiplies_the_callers_arrays_as_views_into_out(rng, monkeypatch):
    from mpi4py import MPI
    seen = spy_out_of_core(monkeypatch)
    big = random_array(rng, (70, 50), "float64")
    a = big[5:45, 3:40]          # rows with a pitch: a view, no copy
    b = random_array(rng, (37, 29), "float64")
    b.setflags(write=False)      # read-only is fine: it is only read
    a_before, b_before = a.copy(), b.copy()
    out = np.full((40, 29), np.nan)
    c = summa.matmul(a, b, comm=MPI.COMM_SELF, out=out, out_of_core=True, panel_width=8,
                     alpha=-1.5)
    assert c is out
    (A, B, C), = seen
    assert np.shares_memory(A, a) and np.shares_memory(B, b) and C is out
    assert np.array_equal(a, a_before) and np.array_equal(b, b_before)
    assert gemm_scaled_error(c, a, b, alpha=-1.5) <= 1


@pytest.mark.parametrize("trans", ["T", "H"])
def test_one_rank_copies_no_operand_whatever_its_order(rng, monkeypatch, trans):
    from mpi4py import MPI
    seen = spy_out_of_core(monkeypatch)
    a = np.asfortranarray(random_array(rng, (23, 17), "complex64"))  # columns contiguous
    b = random_array(rng, (19, 17), "complex64")
    c = summa.matmul(a, b, comm=MPI.COMM_SELF, trans_b=trans, out_of_core=True, panel_width=4)
    (A, B, C), = seen
    assert np.shares_memory(A, a) and np.shares_memory(B, b)  # read as they lie
    assert np.shares_memory(C, c)
    assert gemm_scaled_error(c, a, b, trans_b=trans) <= 1


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("out_of_core", [None, True])
def test_numpy_arrays_into_out_on_every_rank_count(comm, rng, out_of_core):
    a, b = random_array(rng, (41, 26), "float64"), random_array(rng, (26, 33), "float64")
    root = comm.Get_size() - 1
    out = np.empty((41, 33)) if comm.rank == root else None
    c = summa.matmul(a if comm.rank == root else None, b if comm.rank == root else None,
                     root=root, out=out, out_of_core=out_of_core, panel_width=8,
                     device_memory="24KiB" if out_of_core else None)
    if comm.rank == root:
        assert c is out and gemm_scaled_error(c, a, b) <= 1
    else:
        assert c is None


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("bad,match", [
    (lambda: np.empty((5, 5)), "out is"),
    (lambda: np.empty((12, 7), dtype=np.float32), "out is"),
    (lambda: _read_only(np.empty((12, 7))), "read-only"),
    (lambda: [[0.0] * 7] * 12, "NumPy array"),
])
def test_an_unusable_out_is_refused_on_every_rank(comm, rng, bad, match):
    a, b = random_array(rng, (12, 9), "float64"), random_array(rng, (9, 7), "float64")
    with pytest.raises(ValueError, match=match):
        summa.matmul(a if comm.rank == 0 else None, b if comm.rank == 0 else None,
                     out=bad() if comm.rank == 0 else None, out_of_core=True)


@pytest.mark.mpi(min_size=1)
def test_a_budget_that_cuts_c_too_finely_is_refused_on_every_rank(comm, rng):
    """1200 x 1200 x 300 under 20 KiB would be ~10**5 or more one-element tiles on
    any grid of up to 6 ranks: refused at once on every rank with the budget
    that would do, nothing written to `out`; that budget multiplies (one
    rank)."""
    a = random_array(rng, (1200, 300), "float64")
    out = np.full((1200, 1200), np.nan) if comm.rank == 0 else None
    args = (a if comm.rank == 0 else None, a.T if comm.rank == 0 else None)
    with pytest.raises(ValueError, match="too small to finish; give each rank at least") as no:
        summa.matmul(*args, out=out, device_memory="20KiB")
    if comm.rank == 0:
        assert np.isnan(out).all()
    if comm.Get_size() > 1:  # (its ~10**4 steps take broadcasts each: 15-30 s on a grid)
        return
    enough = str(no.value).split("at least ")[1].split(" (")[0].replace(" ", "")
    c = summa.matmul(*args, out=out, device_memory=enough)
    assert gemm_scaled_error(c, a, a.T) <= 1


def _read_only(x):
    x.setflags(write=False)
    return x


@pytest.mark.mpi(min_size=1)
def test_arrays_that_cannot_be_multiplied_are_refused_on_every_rank(comm, rng):
    a = random_array(rng, (12, 9), "float64")
    mine = comm.rank == 0
    long = a.astype(np.longdouble), a.T.copy()  # (no common type summa multiplies)
    for args, match in (((a, a), "inner dimensions"), (long, "convert them"),
                        ((a, None), "must pass"), ((a[None], a), "matrices have 9 columns"),
                        ((a[0], a), "inner dimensions")):
        with pytest.raises(ValueError, match=match):
            summa.matmul(args[0] if mine else None, args[1] if mine else None, out_of_core=True)
    with pytest.raises(TypeError, match="beta"):
        summa.matmul(a if mine else None, a.T if mine else None, beta=2.0)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("out_of_core", [False, True])
def test_an_out_that_overlaps_an_operand_or_lies_otherwise_is_filled(comm, rng, out_of_core):
    """An `out` the product cannot be written into where it lies (it is an
    operand, shares memory with one, or its rows are not contiguous:
    Fortran order, a .T or strided view) gets the product all the same,
    filled from one of its own at the end, as NumPy's matmul fills it; on
    every rank count, in memory and out of core."""
    mine = comm.rank == 0
    kwargs = dict(out_of_core=out_of_core, panel_width=4,
                  device_memory="4KiB" if out_of_core else None)
    x, y = random_array(rng, (12, 12), "float64"), random_array(rng, (12, 12), "float64")
    wide = random_array(rng, (12, 25), "float64")
    cases = {"out is a": lambda a, b: a, "out is b": lambda a, b: b,
             "out is a.T": lambda a, b: a.T, "Fortran": lambda a, b: np.zeros((12, 12), order="F"),
             "strided": lambda a, b: np.zeros((12, 24))[:, ::2],
             "reversed": lambda a, b: np.zeros((12, 12))[::-1, ::-1],
             "rows reversed": lambda a, b: np.zeros((12, 12))[::-1]}
    for name, make in cases.items():
        a, b = x.copy(), y.copy()
        out = make(a, b) if mine else None
        c = summa.matmul(a if mine else None, b if mine else None, out=out, **kwargs)
        if mine:
            assert c is out, name
            assert gemm_scaled_error(c, x, y) <= 1, name
    # a view sharing a's memory: a's values read before any of out is written
    a = np.concatenate([x, wide[:, :12]], axis=1)
    out = a[:, 12:] if mine else None
    c = summa.matmul(a[:, :12] if mine else None, y if mine else None, out=out, **kwargs)
    if mine:
        assert c is out and gemm_scaled_error(c, x, y) <= 1
    with summa.Matmul(x if mine else None, y if mine else None, **kwargs) as m:
        out = np.zeros((12, 12), order="F") if mine else None
        c = m.execute(x if mine else None, y if mine else None, out=out)
        if mine:
            assert c is out and gemm_scaled_error(c, x, y) <= 1


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dtype", ["float64", "complex64"])
@pytest.mark.parametrize("out_of_core", [False, True])
def test_a_fortran_ordered_out_takes_the_transposed_product_in_place(comm, rng, dtype,
                                                                    out_of_core):
    """A Fortran-ordered `out` gets op(b)^T op(a)^T in its transpose (the
    plan is of the n x m product: no product of its own, no copy), for
    every op pair but op H of complex operands (filled from a product of
    its own), on every rank count; the values are op(a) op(b)."""
    from test_layouts import operand
    mine, (m, n, k) = comm.rank == 0, (13, 9, 11)
    kwargs = dict(out_of_core=out_of_core, panel_width=4,
                  device_memory="4KiB" if out_of_core else None)
    for ta, tb in [(x, y) for x in ("N", "T", "H") for y in ("N", "T", "H")]:
        a, _, xa = operand(rng, (m, k), dtype, {"N": "C", "T": "op T", "H": "op H"}[ta])
        b, _, xb = operand(rng, (k, n), dtype, {"N": "C", "T": "op T", "H": "op H"}[tb])
        out = np.full((m, n), np.nan, dtype=dtype, order="F") if mine else None
        stats = summa.SummaStats()
        c = summa.matmul(a if mine else None, b if mine else None, out=out, trans_a=ta,
                         trans_b=tb, stats=stats, **kwargs)
        if not mine:
            continue
        assert c is out and gemm_scaled_error(c, xa, xb) <= 1, (ta, tb)
        transposed = "H" not in (ta, tb) or dtype == "float64"
        assert stats.extra["plan"]["shape"] == ([n, m, k] if transposed else [m, n, k]), (ta, tb)


@pytest.mark.parametrize("dtype", ["float64", "complex128"])
def test_a_host_block_reads_the_callers_array_where_it_lies(dtype):
    """One rank's host block of op(x) is a view of the caller's array for
    every op, complex too (op H is conjugated by the GEMMs): nothing the
    size of `x` is allocated."""
    import tracemalloc

    from mpi4py import MPI

    from summa.host.blocks import host_block
    x = random_array(np.random.default_rng(), (300, 200), dtype)
    with summa.ProcessGrid(MPI.COMM_SELF) as grid:
        for trans, want in (("N", x), ("T", x.T), ("H", x.T)):
            tracemalloc.start()  # NumPy reports its allocations to it
            try:
                block = host_block(x, trans, grid).local
                made = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
            assert np.shares_memory(block, x) and made < x.nbytes // 4, (trans, made)
            np.testing.assert_array_equal(block, want)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("trans", ["N", "T"])
def test_host_blocks_scattered_for_a_gpu_hold_float16(comm, rng, trans):
    """Where a node cannot share the operand, MPI scatters the host blocks of
    a GPU's out-of-core multiply: NumPy only holds them, so float16 (which
    the GPU multiplies and NumPy's backend does not) is taken as it is."""
    from summa.device.backend import NumpyBackend
    from summa.distribution.layout import Layout
    from summa.host.blocks import block_of, scattered
    from summa.host.storage import op_view, storage_of
    x = comm.bcast(random_array(rng, (70, 50), "float16"))
    with summa.ProcessGrid(comm) as grid:
        X = scattered(x if comm.rank == 0 else None, trans, storage_of(x, trans), grid,
                      NumpyBackend(), root=0)
        layout = Layout(op_view(x, trans).shape, grid.shape)
        assert X.local.dtype == np.float16
        np.testing.assert_array_equal(X.local, block_of(op_view(x, trans), layout, grid))


def test_help_of_summa_matmul_shows_every_keyword_its_paths_take():
    """``help(summa.matmul)`` shows real parameters (not ``**kwargs``): each
    one documented and taken by the path it applies to, and every keyword
    those paths take shown, with the defaults they use."""
    import inspect
    import summa
    from summa.api import multiply
    from summa.execution.algorithm import gemm
    shown = inspect.signature(summa.matmul).parameters
    taken = {}
    for target in (multiply.matmul_arrays, gemm, multiply.host_matmul):
        for name, p in inspect.signature(target).parameters.items():
            if p.kind is not p.VAR_KEYWORD and name not in ("a", "b", "A", "B", "device"):
                taken.setdefault(name, p.default)
    taken.update({name: shown[name].default for name in multiply._MATMUL_OPTIONS
                  if name not in taken}, options=None)
    assert set(shown) - {"A", "B", "device"} == set(taken)
    for name, default in taken.items():
        if default is not inspect.Parameter.empty and name != "stats":
            assert shown[name].default == default, name
        assert f"\n    {name}" in summa.matmul.__doc__ or f", {name}" in summa.matmul.__doc__, name


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("out_of_core", [False, True])
def test_vectors_multiply_as_numpy_does(comm, rng, out_of_core):
    """A 1-D operand is taken as NumPy's matmul takes it (a row on the left,
    a column on the right, under every op) and the product drops its
    dimension: the same shape and kind as NumPy's, into a 1-D or 0-d `out`
    of any stride, through summa.matmul and a Matmul; on every rank count."""
    mine = comm.rank == 0
    kwargs = dict(out_of_core=out_of_core, panel_width=3,
                  device_memory="2KiB" if out_of_core else None)
    x = random_array(rng, (7, 9), "complex128")
    v, w = random_array(rng, (9,), "complex128"), random_array(rng, (7,), "complex128")
    cases = [((x, v), {}, x @ v), ((w, x), {}, w @ x), ((v, v), {}, v @ v),
             ((x, w), {"trans_a": "T"}, x.T @ w), ((v, x), {"trans_b": "H"}, v @ x.conj().T),
             ((w, x), {"trans_a": "H"}, w.conj() @ x)]
    for (a, b), ops, want in cases:
        c = summa.matmul(a if mine else None, b if mine else None, **ops, **kwargs)
        if mine:
            assert type(c) is type(want) and np.shape(c) == np.shape(want), ops
            assert np.allclose(c, want, rtol=1e-12, atol=1e-12), ops
    outs = {"contiguous": np.empty(7, complex), "strided": np.empty(14, complex)[::-2]}
    for name, out in outs.items():
        c = summa.matmul(x if mine else None, v if mine else None,
                         out=out if mine else None, **kwargs)
        if mine:
            assert c is out and np.allclose(out, x @ v, rtol=1e-12, atol=1e-12), name
    one = np.empty((), complex)
    c = summa.matmul(v if mine else None, v if mine else None, out=one if mine else None)
    if mine:
        assert c is one and np.isclose(one, v @ v, rtol=1e-12, atol=1e-12)
    with summa.Matmul(x if mine else None, v if mine else None, **kwargs) as m:
        v2 = random_array(rng, (9,), "complex128")
        for c, want in ((m.execute(), x @ v), (m.execute(x if mine else None,
                                                         v2 if mine else None), x @ v2)):
            if mine:
                assert c.shape == (7,) and np.allclose(c, want, rtol=1e-12, atol=1e-12)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("out_of_core", [False, True])
def test_two_dtypes_multiply_in_their_common_type_as_numpy_does(comm, rng, out_of_core):
    """Operands of two dtypes multiply in NumPy's common type of the two (the
    other operand copied once, the caller's arrays untouched), the product of
    that type, into an `out` of it (one of the narrower type is refused);
    every layout, summa.matmul and a Matmul, on every rank count."""
    from test_layouts import operand
    mine = comm.rank == 0
    kwargs = dict(out_of_core=out_of_core, panel_width=4,
                  device_memory="4KiB" if out_of_core else None)
    pairs = [("float32", "float64", "C", "F"), ("float64", "complex64", "op T", "C"),
             ("int32", "float64", "C", "strided"), ("bool", "complex128", "C", "op H")]
    for da, db, la, lb in pairs:
        a, ta, xa = operand(rng, (13, 11), "float64", la)
        b, tb, xb = operand(rng, (11, 9), db, lb)
        a, xa = ((a > 0), (xa > 0)) if da == "bool" else (a.astype(da), xa.astype(da))
        kept = a.copy(), b.copy()
        want = np.result_type(a.dtype, b.dtype)
        c = summa.matmul(a if mine else None, b if mine else None, trans_a=ta, trans_b=tb,
                         **kwargs)
        if mine:
            assert c.dtype == want, (da, db)
            assert gemm_scaled_error(c, xa.astype(want), xb) <= 1, (da, db)
            assert np.array_equal(a, kept[0]) and np.array_equal(b, kept[1])
    a, b = random_array(rng, (13, 11), "float32"), random_array(rng, (11, 9), "float64")
    out = np.empty((13, 9)) if mine else None
    c = summa.matmul(a if mine else None, b if mine else None, out=out, **kwargs)
    if mine:
        assert c is out and gemm_scaled_error(out, a.astype(np.float64), b) <= 1
    with pytest.raises(ValueError, match="out is .* float32, but the product is .* float64"):
        summa.matmul(a if mine else None, b if mine else None,
                     out=np.empty((13, 9), np.float32) if mine else None, **kwargs)
    with summa.Matmul(a if mine else None, b if mine else None, **kwargs) as m:
        c = m.execute()
        if mine:
            assert c.dtype == np.float64 and gemm_scaled_error(c, a.astype(np.float64), b) <= 1


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("where", ["describing", "a stack", "a stack's result", "a Matmul"])
def test_a_failure_on_the_root_alone_is_raised_on_every_rank(comm, rng, monkeypatch, where):
    """An error other than bad input in a step the root takes alone (its
    operands described, a stack checked, a stack's result made, a Matmul's
    operands checked) is raised on every rank as RankFailure naming the
    root, not left to the root while the others wait in a collective."""
    import summa.api.planned as planned
    import summa.api.stacks as stacks
    from summa.runtime.agree import RankFailure

    def fail(*args, **kwargs):
        raise MemoryError("injected")
    mine = comm.rank == 0
    a = random_array(rng, (6, 5), "float64")
    x = a[None] if where.startswith("a stack") else a
    patched = {"describing": (planned, "promoted"), "a stack": (stacks, "stack_of"),
               "a stack's result": (stacks, "_new")}
    with summa.Matmul(a if mine else None, a.T if mine else None) as m:
        if where in patched:
            monkeypatch.setattr(*patched[where], fail)
        else:
            monkeypatch.setattr(planned, "promoted", fail)
        with pytest.raises(RankFailure, match="rank 0: MemoryError: injected"):
            if where == "a Matmul":
                m.execute(a if mine else None, a.T.copy() if mine else None)
            else:
                summa.matmul(x if mine else None, a.T if mine else None)


def _integers(rng, shape, dtype, top: int) -> np.ndarray:
    """Random values of the integer or boolean `dtype`, magnitudes below `top`."""
    if np.dtype(dtype).kind == "b":
        return rng.uniform(size=shape) < 0.3
    low = 0 if np.dtype(dtype).kind == "u" else -top + 1
    return rng.integers(low, top, shape).astype(dtype)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("out_of_core", [False, True])
def test_integer_and_boolean_operands_multiply_exactly_as_numpy_does(comm, rng, out_of_core):
    """Integers and booleans of any two types give NumPy's product exactly,
    in NumPy's type (a narrower one wrapping as NumPy's matmul wraps, bool
    any term true): every layout and op, into an `out` of any layout, a
    Matmul, vectors; 1-3 ranks, in memory and out of core."""
    from test_layouts import operand
    mine = comm.rank == 0
    kwargs = dict(out_of_core=out_of_core, panel_width=4,
                  device_memory="4KiB" if out_of_core else None)
    pairs = [("int64", "int64", 2**20, "C", "F"), ("int32", "int16", 300, "op T", "strided"),
             ("uint8", "uint8", 256, "reversed", "C"), ("int8", "uint16", 100, "F", "op T"),
             ("bool", "bool", 2, "T view", "C"), ("bool", "int32", 1000, "C", "op H")]
    for da, db, top, la, lb in pairs:
        x, y = _integers(rng, (13, 11), da, top), _integers(rng, (11, 9), db, top)
        a, ta, _ = operand(rng, (13, 11), "float64", la)
        b, tb, _ = operand(rng, (11, 9), "float64", lb)
        a, b = a.astype(da), b.astype(db)  # (the layouts' shapes, then the values)
        a[...], b[...] = (x if ta == "N" else x.T), (y if tb == "N" else y.T)
        want = x @ y
        c = summa.matmul(a if mine else None, b if mine else None, trans_a=ta, trans_b=tb,
                         **kwargs)
        if mine:
            assert c.dtype == want.dtype and np.array_equal(c, want), (da, db, la, lb)
        out = np.empty((9, 13), want.dtype).T if mine else None  # Fortran-ordered
        assert summa.matmul(a if mine else None, b if mine else None, trans_a=ta, trans_b=tb,
                            out=out, **kwargs) is out
        if mine:
            assert np.array_equal(out, want), (da, db, "out")
    x, y = _integers(rng, (13, 11), "int64", 50), _integers(rng, (11,), "int32", 50)
    with summa.Matmul(x if mine else None, y if mine else None, **kwargs) as m:
        for c, want in ((m.execute(), x @ y), (m.execute(x[::-1] if mine else None,
                                                         y if mine else None), x[::-1] @ y)):
            if mine:
                assert c.dtype == np.int64 and np.array_equal(c, want)


@pytest.mark.parametrize("da, db, top", [("int32", "int32", 2**20), ("int8", "int8", 128),
                                       ("int16", "uint8", 256), ("bool", "bool", 2),
                                       ("int64", "int64", 2**22)])
def test_integers_staged_by_the_plan_make_no_whole_float64_copy(rng, monkeypatch, da, db, top):
    """Where the plan stages host operands through page-locked chunks (out
    of core on one GPU rank: here the NumPy backend taken for one, its
    copies the same casts), integers are kept as they lie and converted
    inside the copies, the product drained into its own type, wrapping as
    NumPy's integer matmul (int8 overflowing): no whole float64 copy of A,
    B or C, and the plan says so (values near the exact bound for int64:
    2**22 * 2**22 * K under 2**53)."""
    from summa.api import arrayview, operands, promotion
    from summa.planning import arrays
    monkeypatch.setattr(arrays, "traits", lambda name: type("T", (), {"gpu": True}))
    whole = []
    for module, name in ((promotion, "as_float64"), (operands, "converted"),
                         (arrayview, "converted")):
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, _real=real, _n=name: (
            whole.append(_n), _real(*a))[1])
    # the "device" multiplies float64 rows, as a GPU's GEMM takes no integers
    from summa.device.numpy_backend import NumpyBackend
    gemm, kinds = NumpyBackend.gemm, set()
    monkeypatch.setattr(NumpyBackend, "gemm", lambda self, alpha, a, b, c, *r, **k: (
        kinds.add((a.dtype.name, b.dtype.name, c.dtype.name)), gemm(self, alpha, a, b, c, *r, **k))[1])
    a, b = _integers(rng, (61, 47), da, top), _integers(rng, (47, 33), db, top)
    b = b[::-1]  # (a strided view: gathered by the copies as it lies)
    want = a @ b
    stats = summa.SummaStats()
    c = summa.matmul(a, b, backend="numpy", out_of_core=True, device_memory="8KiB",
                     panel_width=8, stats=stats)
    assert c.dtype == want.dtype and np.array_equal(c, want)
    assert not whole, whole
    assert kinds == {("float64",) * 3}, kinds
    plan = stats.extra["plan"]
    assert plan["host_integers"] == [da, db, want.dtype.name] and plan["dtype"] == "float64"
    if da == "int8":
        assert (np.abs(a.astype(np.int64) @ b.astype(np.int64)) > 127).any()  # it wraps
    out = np.zeros((33, 61), want.dtype).T  # an out of its own layout: filled after
    assert summa.matmul(a, b, backend="numpy", out_of_core=True, device_memory="8KiB",
                        out=out) is out and np.array_equal(out, want)
    # a Matmul's executions, of its own operands and of others given, the same way
    with summa.Matmul(a, b, backend="numpy", out_of_core=True, device_memory="8KiB",
                      panel_width=8) as m:
        assert np.array_equal(m.execute(), want) and np.array_equal(m.execute(a, b), want)
    assert not whole, whole


def test_integers_the_plan_does_not_stage_are_converted_whole_first(rng, monkeypatch):
    """On CPUs (no staging) integer operands are converted into float64
    whole, as before, and the plan records nothing of them."""
    a, b = _integers(rng, (20, 30), "int16", 300), _integers(rng, (30, 10), "int16", 300)
    stats = summa.SummaStats()
    c = summa.matmul(a, b, backend="numpy", out_of_core=True, device_memory="8KiB",
                     stats=stats)
    assert c.dtype == np.int16 and np.array_equal(c, a @ b)
    assert stats.extra["plan"]["host_integers"] is None


def test_the_plans_text_says_integers_are_converted_as_they_are_staged():
    from summa.planning.arrays import with_integers
    from summa.planning.plan import Machine, Placement
    from summa.planning.planner import make_plan
    machine = Machine(backend="cupy", ranks=1, free_device=2**30)
    plan = make_plan((4096, 4096, 4096), "float64", machine, host_held=True)
    staged = with_integers(plan, ("int32", "int8", "int32"))
    assert plan.out_of_core and staged.host_integers == ("int32", "int8", "int32")
    assert "integers converted as they are staged: A (int32) and B (int8)" in str(staged)
    assert "integers converted" not in str(plan)
    for other in (make_plan((4096, 4096, 4096), "float64", Machine(backend="numpy", ranks=1),
                            host_held=True),
                  replace_plan(plan, placement=Placement("device", 0))):
        assert with_integers(other, ("int32", "int8", "int32")).host_integers is None


def replace_plan(plan, **changes):
    from dataclasses import replace
    return replace(plan, **changes)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("case, match", [
    ("beyond 2**53", r"may reach 2\*\*62.0 .*convert them to float64 yourself"),
    ("precision", "precision='tf32' does not apply to integer operands"),
    ("float out", "out is .* float64, but the product is .* int64"),
])
def test_integer_products_float64_cannot_hold_exactly_are_refused(comm, case, match):
    mine = comm.rank == 0
    a = np.full((4, 4), 2**30, np.int64)
    kwargs = {"precision": dict(precision="tf32"),
              "float out": dict(out=np.empty((4, 4)) if mine else None)}.get(case, {})
    a = a if case == "beyond 2**53" else a // 2**20
    with pytest.raises(ValueError, match=match):
        summa.matmul(a if mine else None, a if mine else None, **kwargs)


def test_a_promoted_copy_beyond_the_hosts_memory_is_refused(rng, monkeypatch):
    from summa.api import promotion
    monkeypatch.setattr(promotion, "available_memory", lambda: 1000)
    a, b = random_array(rng, (20, 20), "float32"), random_array(rng, (20, 20), "float64")
    with pytest.raises(ValueError, match="a is float32 and the product float64: its copy in "
                                         "float64 takes .* GiB of host memory"):
        summa.matmul(a, b, backend="numpy")
