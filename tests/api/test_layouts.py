"""Every way an operand may lie (summa/host/storage.py): the plan records it and
every path multiplies it where it lies, each checked against a float64
reference with the gauge on fresh random data (one rank here, 1-6 ranks
under mpiexec): C and Fortran order, ``.T`` views, op T and H, strided and
reversed views, read-only arrays, ``out=``; in memory and out of core
(tiny device budgets on the NumPy backend), read in place, node-shared or
scattered."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import summa
from helpers import gemm_scaled_error, random_array, spy_out_of_core, use_fake_cupy
from summa.host.storage import as_rows, copyable_rows, storage_of

#: Each test's subject is the process grid's shape: ./run test runs them on every
#: rank count (the others on a few: pyproject.toml's markers).
pytestmark = pytest.mark.grid

#: How an operand may be handed over (see :func:`operand`).
LAYOUTS = ["C", "F", "T view", "op T", "op H", "op H of F", "strided", "reversed",
           "strided op T", "read-only F", "column of one"]


def operand(rng, shape, dtype, layout):
    """``(array, trans, x)``: `array` as `layout` hands it over, ``op(array)``
    equal to the fresh random matrix `x` of `shape`."""
    x = random_array(rng, shape, dtype)
    r, c = shape
    if layout == "C":
        return x, "N", x
    if layout == "column of one":  # its stride along the axis of one is a whole row's
        x = random_array(rng, (c, r), dtype).T
        x.setflags(write=False)
        return x, "N", x
    if layout in ("F", "read-only F"):
        f = np.asfortranarray(x)
        f.setflags(write=layout == "F")
        return f, "N", x
    if layout == "T view":
        return x.T.copy().T, "N", x
    if layout == "op T":
        return x.T.copy(), "T", x
    if layout == "op H":
        return x.conj().T.copy(), "H", x
    if layout == "op H of F":
        return np.asfortranarray(x.conj().T), "H", x
    if layout == "strided":
        big = random_array(rng, (2 * r + 1, 3 * c + 2), dtype)
        big[1::2, 2::3] = x
        return big[1::2, 2::3], "N", x
    if layout == "reversed":
        big = random_array(rng, (r, 2 * c), dtype)
        big[::-1, ::-2] = x
        return big[::-1, ::-2], "N", x
    if layout == "strided op T":
        big = random_array(rng, (3 * c, 2 * r), dtype)
        big[::3, ::2] = x.T
        view = big[::3, ::2]
        view.setflags(write=False)
        return view, "T", x
    raise ValueError(layout)


def _dtype(rng, layout):
    if "H" in layout:  # conjugation is the point
        return rng.choice(["complex64", "complex128"])
    return rng.choice(["float32", "float64", "complex64", "complex128"])


def _product(rng, la, lb, shape=(37, 23, 29), dtype=None):
    """Operands of layouts `la` and `lb` of one dtype (default: drawn):
    ``(a, ta, xa, b, tb, xb)``."""
    m, n, k = {"column of one": (85, 7, 1)}.get(la) or \
        {"column of one": (7, 1, 85)}.get(lb) or shape
    dtype = dtype or _dtype(rng, la + lb)
    a, ta, xa = operand(rng, (m, k), dtype, la)
    b, tb, xb = operand(rng, (k, n), dtype, lb)
    return a, ta, xa, b, tb, xb


def _pairs():
    """Each layout for A, with the next one for B (every layout is B once)."""
    return [(la, LAYOUTS[(i + 1) % len(LAYOUTS)]) for i, la in enumerate(LAYOUTS)]


# -- the storage the plan records -------------------------------------------------------

def test_storage_of_every_layout():
    x = np.zeros((6, 4))
    assert storage_of(x) == "rows" and storage_of(x, "T") == "cols"
    assert storage_of(np.asfortranarray(x)) == "cols" and storage_of(x.T) == "cols"
    assert storage_of(x[1:5, 1:3]) == "rows"              # a slice: rows with a pitch
    assert storage_of(x[::2, ::2]) == "strided rows"      # columns the shorter step
    assert storage_of(np.zeros((40, 6))[::2, ::2].T) == "strided cols"
    assert storage_of(x[::-1]) == "strided rows"          # a negative pitch is gathered
    assert storage_of(np.broadcast_to(np.zeros(4), (6, 4))) == "strided rows"  # pitch 0
    # axes of one count as contiguous whatever their stride (a row's .T: (item, width))
    col = np.zeros((1, 85), np.float32).T
    assert storage_of(col) == "rows" and storage_of(col, "T") == "rows"
    assert storage_of(np.zeros((0, 3))) == "rows"
    for s in ("rows", "cols", "strided rows", "strided cols"):
        y = np.zeros((3, 5))
        assert as_rows(as_rows(y, s), s) is not None and as_rows(y, s).shape == \
            ((5, 3) if s.endswith("cols") else (3, 5))
    assert copyable_rows(col) and not copyable_rows(x[::-1])


def test_the_plan_records_and_prints_how_each_operand_lies(rng):
    from mpi4py import MPI
    a, ta, _ = operand(rng, (30, 20), "complex64", "op H")
    b, tb, _ = operand(rng, (20, 10), "complex64", "strided")
    m = summa.Matmul(a, b, comm=MPI.COMM_SELF, trans_a=ta, trans_b=tb, backend="numpy")
    assert m.plan.storage == ("cols", "strided rows") and m.plan.conj == (True, False)
    text = str(m.plan)
    assert "op(A) by columns" in text and ", conjugated by the GEMM" in text
    assert "op(B) strided: gathered by rows" in text
    # executed on arrays that lie otherwise: run as they lie (no refusal, no copy)
    a2, _, xa = operand(rng, (30, 20), "complex64", "op H of F")
    b2, _, xb = operand(rng, (20, 10), "complex64", "C")
    c = m.execute(a2, b2)
    assert gemm_scaled_error(c, xa, xb) <= 1


def test_out_of_core_cuts_follow_the_operands_and_the_bytes_they_move(rng):
    """Out of core C is cut in whole rows or whole columns, the way its
    operands lie (Fortran: columns, each read in blocks as C order's are by
    rows; the cut the C-ordered transposed product takes, transposed),
    unless the other way uploads less: a C taller than wide keeps rows, a C
    wider than tall takes columns, whatever the order. Products right."""
    from mpi4py import MPI

    def planned(x, y):
        return summa.Matmul(x, y, comm=MPI.COMM_SELF, backend="numpy", device_memory="40KiB",
                            panel_width=8)
    a, _, xa = operand(rng, (100, 100), "float64", "F")
    b, _, xb = operand(rng, (100, 100), "float64", "F")
    m = planned(a, b)
    transposed = planned(np.ascontiguousarray(b.T), np.ascontiguousarray(a.T))
    assert m.plan.storage == ("cols", "cols")
    assert m.plan.memory.tiles == transposed.plan.memory.tiles[::-1]
    assert m.plan.memory.tiles[0] == 1 < m.plan.memory.tiles[1]
    assert planned(xa, xb).plan.memory.tiles[1] == 1 < planned(xa, xb).plan.memory.tiles[0]
    assert gemm_scaled_error(m.execute(a, b), xa, xb) <= 1
    wide = random_array(rng, (100, 240), "float64")
    for order in ("C", "F"):
        x = np.asarray(xa, order=order)
        tall, flat = planned(np.asarray(wide.T, order=order), x), planned(x, wide)
        assert tall.plan.memory.tiles[1] == 1 < tall.plan.memory.tiles[0]
        assert flat.plan.memory.tiles[0] == 1 < flat.plan.memory.tiles[1]
        assert gemm_scaled_error(tall.execute(np.asarray(wide.T, order=order), x),
                                 wide.T, xa) <= 1
        assert gemm_scaled_error(flat.execute(x, wide), xa, wide) <= 1


# -- one rank ---------------------------------------------------------------------------

@pytest.mark.parametrize("la,lb", _pairs())
@pytest.mark.parametrize("how", ["in memory", "out of core", "into out"])
def test_one_rank_multiplies_every_layout_where_it_lies(rng, monkeypatch, la, lb, how):
    from mpi4py import MPI

    from summa.execution import arrays as planned
    seen = spy_out_of_core(monkeypatch)
    ran = []
    real = planned.run_in_memory
    monkeypatch.setattr(planned, "run_in_memory", lambda plan, A, B, *r, **k: (
        ran.append((A.local, B.local)), real(plan, A, B, *r, **k))[1])
    a, ta, xa, b, tb, xb = _product(rng, la, lb)
    before = (a.copy(), b.copy())
    out = np.full((xa.shape[0], xb.shape[1]), np.nan, a.dtype) if how == "into out" else None
    kwargs = {"out_of_core": True, "device_memory": "6KiB"} if how != "in memory" else {}
    c = summa.matmul(a, b, comm=MPI.COMM_SELF, trans_a=ta, trans_b=tb, alpha=-0.5, out=out,
                     panel_width=5, backend="numpy", **kwargs)
    assert gemm_scaled_error(c, xa, xb, alpha=-0.5) <= 1
    assert out is None or c is out
    A, B = (seen[0][:2] if seen else ran[0])
    assert np.shares_memory(A, a) and np.shares_memory(B, b)  # where they lie: no copy
    assert np.array_equal(a, before[0]) and np.array_equal(b, before[1])


def test_the_reported_refusal_is_multiplied(rng):
    """A read-only C-ordered float32 column (85 x 1) with op T under 8 MiB
    was refused ("must be row-major"); so was complex64 with op H on both."""
    from mpi4py import MPI
    a = random_array(rng, (1, 85), "float32").T  # (85, 1), strides (4, 340)
    a.setflags(write=False)
    b = random_array(rng, (85, 7), "float32")
    c = summa.matmul(a, b, comm=MPI.COMM_SELF, trans_a="T", device_memory="8MiB",
                     backend="numpy")
    assert gemm_scaled_error(c, a, b, trans_a="T") <= 1
    a = random_array(rng, (30, 20), "complex64")
    b = random_array(rng, (40, 30), "complex64")
    c = summa.matmul(a, b, comm=MPI.COMM_SELF, trans_a="H", trans_b="H",
                     device_memory="8MiB", backend="numpy")
    assert gemm_scaled_error(c, a, b, trans_a="H", trans_b="H") <= 1


def test_no_operand_is_copied_whole_on_one_rank(rng, monkeypatch):
    """Out of core on one rank with a tiny budget: what the call allocates
    (NumPy's allocations, as tracemalloc sees them) is the product and the
    device slots, never a copy of A or B, whatever their layout."""
    import tracemalloc
    from mpi4py import MPI
    for la, lb in (("F", "op T"), ("op H", "op H of F"), ("strided", "reversed")):
        a, ta, xa, b, tb, xb = _product(rng, la, lb, shape=(300, 300, 400))
        c = np.empty((300, 300), a.dtype)
        summa.matmul(a, b, comm=MPI.COMM_SELF, trans_a=ta, trans_b=tb, out=c,
                     out_of_core=True, device_memory="64KiB", panel_width=16,
                     backend="numpy")  # (imports and caches first)
        tracemalloc.start()
        try:
            summa.matmul(a, b, comm=MPI.COMM_SELF, trans_a=ta, trans_b=tb, out=c,
                         out_of_core=True, device_memory="64KiB", panel_width=16,
                         backend="numpy")
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert gemm_scaled_error(c, xa, xb) <= 1
        assert peak < min(xa.nbytes, xb.nbytes) / 2, (la, lb, peak)


_MEMORY_SCRIPT = """
import sys, tracemalloc
import numpy as np
import summa
from mpi4py import MPI
n, layout = int(sys.argv[1]), sys.argv[2]
rng = np.random.default_rng()
a, b = rng.uniform(-1, 1, (n, n)), rng.uniform(-1, 1, (n, n))
trans = "N"
if layout == "F":
    a = np.asfortranarray(a)
elif layout == "op T":
    a, trans = a.T.copy(), "T"
elif layout == "strided":
    a = np.repeat(a, 2, axis=1)[:, ::2]
summa.matmul(a[:64, :64], b[:64, :64], comm=MPI.COMM_SELF, trans_a=trans,
             backend="numpy")  # imports, caches
tracemalloc.start()
c = summa.matmul(a, b, comm=MPI.COMM_SELF, trans_a=trans, backend="numpy")
peak = tracemalloc.get_traced_memory()[1]
tracemalloc.reset_peak()
before = tracemalloc.get_traced_memory()[0]
ref = (a.T if trans == "T" else a) @ b
numpy_peak = tracemalloc.get_traced_memory()[1] - before - ref.nbytes
tracemalloc.stop()
assert np.abs(c - ref).max() <= 1e-10 * n, "wrong product"
print(peak / c.nbytes, numpy_peak / c.nbytes)
"""


@pytest.mark.parametrize("layout", ["C", "F", "op T", "strided"])
def test_one_cpu_rank_takes_no_more_memory_than_the_result(tmp_path, layout):
    """summa.matmul(a, b) on one CPU rank: the extra peak host memory (NumPy's
    allocations during the call, tracemalloc) is at most 1.1 x the result:
    no copy of A or B, no product-sized temporary (it was 4 x: copies of A
    and B, a product to add into C, a gathered C)."""
    script = tmp_path / "memory.py"
    script.write_text(textwrap.dedent(_MEMORY_SCRIPT))
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]),
               SUMMA_WORKERS="1")
    done = subprocess.run([sys.executable, str(script), "1200", layout], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    ratio, numpy_own = map(float, done.stdout.split()[-2:])
    # Beyond the result, what NumPy's own `op(a) @ b` takes in the same process:
    # NumPy 2.5 copies an operand BLAS cannot read as it lies (the strided one).
    assert ratio <= 1.1 + numpy_own, (ratio, numpy_own)


# -- every rank count, every way the blocks may lie --------------------------------------

_WAYS = {
    "in memory": ({"out_of_core": False}, {}),
    "in place": ({"out_of_core": True, "device_memory": "24KiB"}, {}),
    "node-shared": ({"out_of_core": True, "device_memory": "24KiB"}, {"SUMMA_IN_PLACE": "0"}),
    "scattered": ({"out_of_core": True, "device_memory": "24KiB"}, {"SUMMA_IN_PLACE": "0",
                                                                    "SUMMA_SHM_DIR": None}),
    "own uploads": ({"out_of_core": True, "broadcaster": "host"}, {"SUMMA_IN_PLACE": "0"}),
}


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("way", list(_WAYS))
@pytest.mark.parametrize("la,lb", _pairs())
def test_every_layout_on_every_path_of_every_rank_count(comm, rng, monkeypatch, folder, way,
                                                        la, lb):
    from test_shared import _ranks_read_each_other
    kwargs, env = _WAYS[way]
    for name, value in env.items():
        monkeypatch.setenv(name, value if value is not None else str(folder / "no such folder"))
    seen = spy_out_of_core(monkeypatch)
    a, ta, xa, b, tb, xb = _product(rng, la, lb)
    root = comm.Get_size() - 1
    mine = comm.rank == root
    out = np.full((xa.shape[0], xb.shape[1]), np.nan, a.dtype) if rng.integers(2) else None
    before = (a.copy(), b.copy())
    c = summa.matmul(a if mine else None, b if mine else None, root=root, trans_a=ta,
                     trans_b=tb, out=out if mine else None, alpha=1.5, panel_width=5,
                     backend="numpy", **kwargs)
    if mine:
        assert gemm_scaled_error(c, xa, xb, alpha=1.5) <= 1
        assert out is None or c is out
        assert np.array_equal(a, before[0]) and np.array_equal(b, before[1])
    else:
        assert c is None
    # an operand whose rows (of its transpose, by columns) are one C-ordered
    # array is read where the root holds it, on the root itself and the others
    if way == "in place" and comm.Get_size() > 1 and _ranks_read_each_other(comm) and \
            la in ("C", "F", "T view", "op T", "op H", "op H of F", "read-only F"):
        from summa.host import remote
        A = seen[0][0]
        assert np.shares_memory(A, a) if mine else \
            remote.find(as_rows(A, storage_of(a, ta))) is not None


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("trans", ["N", "T", "H"])
def test_node_shared_operands_are_read_where_they_lie_whatever_the_op(comm, rng, monkeypatch,
                                                                      trans):
    from summa.host import shared as host
    seen = spy_out_of_core(monkeypatch)
    a = host.empty((23, 31), "complex128", comm)
    b = host.empty((23, 17) if trans == "N" else (17, 23), "complex128", comm)
    if comm.rank == 0:
        a[...] = random_array(rng, a.shape, "complex128")
        b[...] = random_array(rng, b.shape, "complex128")
    comm.Barrier()
    c = summa.matmul(a, b, trans_a="T", trans_b=trans, out_of_core=True, panel_width=4,
                     device_memory="16KiB", backend="numpy")
    (A, B, _), = seen
    assert np.shares_memory(A, a) and np.shares_memory(B, b)  # views, however op'd
    if comm.rank == 0:
        assert gemm_scaled_error(c, np.asarray(a), np.asarray(b), trans_a="T",
                                 trans_b=trans) <= 1


@pytest.mark.mpi(min_size=1)
def test_node_shared_copies_copy_rows_never_transposing(comm, rng, monkeypatch):
    """Where the root's operand is copied into node-shared memory, its rows in
    its storage are copied as rows (a Fortran-ordered or op-T operand: the
    rows of its transpose), never through a transposing copy."""
    from summa.host import shared as host, blocks as hostblocks
    monkeypatch.setenv("SUMMA_IN_PLACE", "0")
    copies = []
    real = host.parallel_copy
    monkeypatch.setattr(hostblocks.host_arrays, "parallel_copy",
                        lambda dst, src, *r: (copies.append(src), real(dst, src, *r))[1])
    a, ta, xa = operand(rng, (40, 30), "complex64", "op H")
    b, tb, xb = operand(rng, (30, 20), "complex64", "F")
    root = comm.Get_size() - 1
    mine = comm.rank == root
    c = summa.matmul(a if mine else None, b if mine else None, root=root, trans_a=ta,
                     trans_b=tb, out_of_core=True, panel_width=5, backend="numpy")
    if mine:
        assert gemm_scaled_error(c, xa, xb) <= 1
        if comm.Get_size() > 1 and copies:
            assert all(src.flags.c_contiguous for src in copies[:2])  # rows to rows


def test_fp64_int8_reads_operands_stored_by_columns_as_they_lie(rng, monkeypatch):
    """float64 on INT8 (summa.precision.ozaki_gpu on the NumPy stand-in for CuPy): a
    column-major A and B (the device parts of operands stored by columns)
    give the same product, bit for bit, as row-major ones, and B's
    transpose is read where it lies, not transposed again."""
    fake_cupy_kernels = use_fake_cupy(monkeypatch)
    from summa.precision import ozaki_gpu
    backend = fake_cupy_kernels.Backend()
    a, b = rng.uniform(-1, 1, (37, 61)), rng.standard_normal((61, 23))
    want = np.empty((37, 23))
    ozaki_gpu.gemm(1.0, a, b, want, backend=backend)
    transposes = []
    monkeypatch.setattr(backend, "transpose", lambda x, out, *r: (transposes.append(x.shape),
                                                                 np.copyto(out, x.T)))
    got = np.empty((37, 23))
    ozaki_gpu.gemm(1.0, a.T.copy().T, b.T.copy().T, got, backend=backend)
    assert np.array_equal(got, want) and transposes == []


def test_cublas_takes_op_h_of_a_column_major_operand_as_op_c(rng):
    """What cuBLAS is handed (summa.device.cupy_backend, here with NumPy for CuPy): a
    column-major operand as its transposed one, conjugated by op C, no copy;
    cuBLAS has no conjugate without transpose, so a row-major one conjugated
    is a copy (on the device); cuBLASLt's plans take row-major ones only."""
    from summa.device.cupy_backend import _cublas_operand
    x = random_array(rng, (6, 4), "complex128")
    for view, conj, transposable, want_op, copied in (
            (x, False, True, 0, False), (x.T.copy().T, False, True, 1, False),
            (x.T.copy().T, True, True, 2, False), (x, True, True, 0, True),
            (x.T.copy().T, True, False, 0, True), (x[:, 1:3], False, True, 0, False)):
        got, ld, op = _cublas_operand(np, view, conj, transposable)
        assert op == want_op and np.shares_memory(got, view) != copied
        # as cuBLAS reads it: column-major of leading dimension ld, op applied
        rows, cols = view.shape
        extent = (rows - 1) * ld + cols if op == 0 else (cols - 1) * ld + rows
        flat = np.lib.stride_tricks.as_strided(got, (extent,), (got.itemsize,))
        as_read = np.array([[flat[(i * ld + j) if op == 0 else (j * ld + i)]
                             for j in range(cols)] for i in range(rows)])
        assert np.array_equal(np.conj(as_read) if op == 2 else as_read,
                              np.conj(view) if conj else view)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("fortran", [False, True])
def test_files_with_op_h_are_conjugated_once_out_of_core(comm, rng, folder, fortran):
    """A file read with op H comes conjugated (its reader's work): the plan
    leaves the GEMMs' conjugation off, in memory and out of core."""
    from summa.api.files import multiply_files
    a = random_array(rng, (29, 37), "complex128")
    b = random_array(rng, (23, 29), "complex128")
    if comm.rank == 0:
        np.save(folder / "A.npy", np.asfortranarray(a) if fortran else a)
        np.save(folder / "B.npy", b)
    comm.Barrier()
    for kwargs in ({"out_of_core": True, "device_memory": "24KiB"}, {"out_of_core": False}):
        record = multiply_files(str(folder / "A.npy"), str(folder / "B.npy"),
                                str(folder / "C.npy"), comm, trans_a="H", trans_b="H",
                                panel_width=5, backend="numpy", quiet=True, **kwargs)
        assert record["plan"]["conj"] == [False, False]
        if comm.rank == 0:
            c = np.load(folder / "C.npy")
            assert gemm_scaled_error(c, a, b, trans_a="H", trans_b="H") <= 1
        comm.Barrier()


def test_one_device_conjugates_its_own_upload_of_an_operand_by_rows(rng):
    """In memory on one GPU, op H of an operand that lies by rows (a
    Fortran-ordered array's H) is conjugated in place in its upload (cuBLAS
    has no conjugate without transpose); one by columns is left to the GEMM
    (op C); the caller's array is never touched."""
    from mpi4py import MPI

    from summa.device.backend import NumpyBackend
    from summa.distribution.grid import ProcessGrid
    from summa.host.blocks import stored_operand

    class Device(NumpyBackend):  # arrays of its own, as a GPU's are
        is_gpu = True

        def asarray(self, host):
            return np.array(host)

    x = random_array(rng, (7, 5), "complex128")
    by_rows, by_cols = np.asfortranarray(x.conj().T), x.conj().T.copy()
    before = by_rows.copy()
    with ProcessGrid(MPI.COMM_SELF) as grid:
        for arg, storage, left in ((by_rows, "rows", False), (by_cols, "cols", True)):
            assert storage_of(arg, "H") == storage
            X, conj = stored_operand(arg, "H", storage, grid, Device(), 0)
            assert conj == left
            assert np.array_equal(np.conj(X.local) if conj else X.local, x)
    assert np.array_equal(by_rows, before)


def test_a_matmul_run_on_arrays_of_another_layout_cuts_c_as_planned_for_them(rng):
    """Out of core, a Matmul planned for C-ordered operands and run on
    Fortran-ordered ones cuts C as a Matmul planned for those does (their
    memory planned again: planning.planner.restore), and the reverse; its
    own plan kept; products right."""
    from mpi4py import MPI

    import summa
    shape, kwargs = (600, 600, 300), dict(comm=MPI.COMM_SELF, backend="numpy",
                                           device_memory="1MiB", panel_width=64)
    (m, n, k), tiles, runs = shape, {}, {}
    for layout in ("C", "F"):
        a, _, xa = operand(rng, (m, k), "float64", layout)
        b, _, xb = operand(rng, (k, n), "float64", layout)
        runs[layout] = (a, b, xa, xb)
        tiles[layout] = summa.Matmul(a, b, **kwargs).plan.memory.tiles
    assert tiles["C"] != tiles["F"]  # (else this shows nothing)
    for planned, run in (("C", "F"), ("F", "C")):
        mm = summa.Matmul(*runs[planned][:2], **kwargs)
        a, b, xa, xb = runs[run]
        c = mm.execute(a, b)
        assert gemm_scaled_error(c, xa, xb) <= 1
        assert tuple(mm.stats.extra["tiles"]) == tuple(tiles[run])
        assert tuple(mm.plan.memory.tiles) == tuple(tiles[planned])
