"""DistMatrix: scatter/gather round trips, grid-independent random, transpose."""

import numpy as np
import pytest
from mpi4py import MPI

from helpers import random_array
from summa.distribution.grid import ProcessGrid
from summa.device.backend import NumpyBackend
from summa.distribution.matrix import DistMatrix

#: Each test's subject is the process grid's shape: ./run test runs them on every
#: rank count (the others on a few: pyproject.toml's markers).
pytestmark = pytest.mark.grid

SHAPES = [(1, 1), (2, 3), (7, 5), (31, 17), (64, 64)]
LAYOUTS = [None, (2, 3), (1, 1)]
GRIDS = ["auto", "row", "col"]


def make_grid(comm, which):
    p = comm.Get_size()
    return ProcessGrid(comm, {"auto": None, "row": (1, p), "col": (p, 1)}[which])


def dtypes(backend):
    return [d.name for d in backend.dtypes]


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("block", LAYOUTS)
@pytest.mark.parametrize("which", GRIDS)
def test_scatter_gather_round_trip(comm, backend, rng, shape, block, which):
    with make_grid(comm, which) as grid:
        for dtype in dtypes(backend):
            a = random_array(rng, shape, dtype) if comm.rank == 0 else None
            A = DistMatrix.from_global(a, grid, backend, block=block)
            assert A.shape == shape and A.dtype == np.dtype(dtype)
            back = A.gather(root=0)
            if comm.rank == 0:
                assert np.array_equal(back, a)
            else:
                assert back is None
            # each rank holds exactly its own block
            full = comm.bcast(a, root=0)
            local = backend.to_host(A.local)
            assert np.array_equal(local, full[np.ix_(A.row_indices(), A.col_indices())])


@pytest.mark.mpi(min_size=2)
def test_gather_to_another_root(comm, backend, rng):
    with make_grid(comm, "auto") as grid:
        root = comm.Get_size() - 1
        a = random_array(rng, (9, 4), "float64") if comm.rank == root else None
        A = DistMatrix.from_global(a, grid, backend, root=root)
        back = A.gather(root=root)
        if comm.rank == root:
            assert np.array_equal(back, a)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("block", [None, (3, 2)])
def test_random_does_not_depend_on_grid(comm, backend, rng, block):
    seed = int(rng.integers(0, 2**62))
    for dtype in dtypes(backend):
        with make_grid(comm, "auto") as grid:
            here = DistMatrix.random((23, 19), dtype, grid, backend, seed=seed, block=block).gather()
        with make_grid(comm, "row") as grid:
            row = DistMatrix.random((23, 19), dtype, grid, backend, seed=seed).gather()
        if comm.rank == 0:
            with ProcessGrid(MPI.COMM_SELF) as single:
                alone = DistMatrix.random((23, 19), dtype, single, backend, seed=seed).gather()
                other = DistMatrix.random((23, 19), dtype, single, backend,
                                          seed=seed + 1).gather()
                # host-held blocks computed by the test backend (the GPU, there)
                hosted = DistMatrix.random((23, 19), dtype, single, NumpyBackend(), seed=seed,
                                           compute=backend).gather()
            assert np.array_equal(here, alone) and np.array_equal(row, alone)
            assert np.array_equal(hosted, alone)
            assert np.all(alone != 0) and np.all(np.abs(alone) <= 1.5)
            assert not np.array_equal(other, alone)
            if np.dtype(dtype).kind == "c":
                assert np.all(alone.imag != alone.real)


@pytest.mark.mpi(min_size=1)
def test_random_values_look_uniform(comm, backend):
    with ProcessGrid(MPI.COMM_SELF) as single:
        x = DistMatrix.random((300, 300), "float64", single, backend, seed=5).gather()
    assert abs(x.mean()) < 0.02 and abs(x.var() - 1 / 3) < 0.02
    assert x.min() >= -1 and x.max() < 1


@pytest.mark.mpi(min_size=1)
def test_zeros(comm, backend):
    with make_grid(comm, "auto") as grid:
        Z = DistMatrix.zeros((5, 8), "float32", grid, backend)
        z = Z.gather()
        if comm.rank == 0:
            assert z.shape == (5, 8) and z.dtype == np.float32 and not z.any()


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("shape", [(1, 1), (3, 8), (13, 6), (40, 33)])
@pytest.mark.parametrize("block", [None, (2, 5)])
@pytest.mark.parametrize("which", GRIDS)
def test_transpose(comm, backend, rng, shape, block, which):
    with make_grid(comm, which) as grid:
        a = random_array(rng, shape, "complex128")
        A = DistMatrix.from_global(a, grid, backend, block=block)
        for conj in (False, True):
            T = A.transpose(conj=conj)
            assert T.shape == shape[::-1]
            t = T.gather()
            if comm.rank == 0:
                assert np.array_equal(t, a.conj().T if conj else a.T)


@pytest.mark.mpi(min_size=1)
def test_from_global_errors_on_every_rank(comm, backend):
    with make_grid(comm, "auto") as grid:
        with pytest.raises(ValueError, match="2-D"):
            DistMatrix.from_global(np.zeros((2, 2, 2)) if comm.rank == 0 else None, grid, backend)
        with pytest.raises(ValueError, match="must pass an array"):
            DistMatrix.from_global(None, grid, backend)
        with pytest.raises(ValueError, match="dtype"):
            DistMatrix.from_global(np.zeros((2, 2), dtype=bool) if comm.rank == 0 else None,
                                   grid, backend)


@pytest.mark.mpi(min_size=1)
def test_constructor_errors(comm, backend):
    with make_grid(comm, "auto") as grid:
        with pytest.raises(ValueError, match="unsupported dtype"):
            DistMatrix.zeros((3, 3), "int32", grid, backend)
        with pytest.raises(ValueError, match="unsupported dtype"):
            DistMatrix.random((3, 3), "no-such-type", grid, backend)
        A = DistMatrix.zeros((3, 3), "float64", grid, backend)
        with pytest.raises(ValueError, match="local block has shape"):
            DistMatrix(grid, A.layout, backend.xp.zeros((4, 4)), backend)
        with pytest.raises(ValueError, match="layout"):
            A.transpose(layout=A.layout.__class__((4, 3), grid.shape))


@pytest.mark.mpi(min_size=1)
def test_random_in_small_chunks_gives_the_same_values(comm, backend, monkeypatch):
    import summa.distribution.matrix as matrix_mod
    with make_grid(comm, "auto") as grid:
        for dtype in ("float64", "complex64"):
            whole = DistMatrix.random((37, 29), dtype, grid, backend, seed=9).gather()
            monkeypatch.setattr(matrix_mod, "RANDOM_CHUNK_ELEMENTS", 7)
            chunked = DistMatrix.random((37, 29), dtype, grid, backend, seed=9).gather()
            monkeypatch.undo()
            if comm.rank == 0:
                assert np.array_equal(whole, chunked)
