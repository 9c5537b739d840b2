"""GPU-only checks (skipped without CuPy and a device). The rest of the suite
runs on the GPU too with SUMMA_TEST_BACKEND=cupy (see .ci/gpu-check)."""

import numpy as np
import pytest

from helpers import gemm_scaled_error, random_array
from summa.backend import cupy_available, get_backend
from summa.grid import ProcessGrid
from summa.matrix import DistMatrix
from summa.algorithm import gemm, matmul

pytestmark = pytest.mark.skipif(not cupy_available(), reason="needs CuPy and a GPU")


@pytest.fixture(scope="module")
def gpu(comm):
    with ProcessGrid(comm) as grid:
        yield grid, get_backend("cupy", grid.local_rank)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("shape", [(64, 48, 80), (33, 65, 17), (3, 2, 1)])
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "complex64", "complex128"])
def test_cupy_matches_reference(comm, rng, gpu, shape, dtype):
    grid, backend = gpu
    m, n, k = shape
    a, b = random_array(rng, (m, k), dtype), random_array(rng, (k, n), dtype)
    c0 = random_array(rng, (m, n), dtype)
    A = DistMatrix.from_global(a, grid, backend)
    B = DistMatrix.from_global(b, grid, backend)
    C = DistMatrix.from_global(c0, grid, backend)
    assert type(C.local).__module__.startswith("cupy")
    gemm(A, B, C, alpha=0.5, beta=2.0, panel_width=16)
    c = C.gather()
    if comm.rank == 0:
        assert gemm_scaled_error(c, a, b, c0, 0.5, 2.0) <= 1


@pytest.mark.mpi(min_size=1)
def test_cupy_and_numpy_backends_agree(comm, gpu):
    grid, gpu_backend = gpu
    cpu_backend = get_backend("numpy")
    results = []
    for backend in (gpu_backend, cpu_backend):
        A = DistMatrix.random((70, 50), "float64", grid, backend, seed=11)
        B = DistMatrix.random((50, 90), "float64", grid, backend, seed=12)
        results.append(matmul(A, B, panel_width=8).gather())
    if comm.rank == 0:
        np.testing.assert_allclose(results[0], results[1], rtol=1e-12, atol=1e-12)


@pytest.mark.mpi(min_size=1)
def test_memory_pool_does_not_grow(comm, gpu):
    grid, backend = gpu
    A = DistMatrix.random((256, 256), "float32", grid, backend, seed=1)
    B = DistMatrix.random((256, 256), "float32", grid, backend, seed=2)
    C = DistMatrix.zeros((256, 256), "float32", grid, backend)
    gemm(A, B, C, panel_width=32)
    pool = backend.xp.get_default_memory_pool()
    before = pool.total_bytes()
    for _ in range(5):
        gemm(A, B, C, panel_width=32)
    assert pool.total_bytes() <= before
