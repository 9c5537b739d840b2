"""The gauge and Freivalds' test: pass on right answers, fail on wrong ones."""

import numpy as np
import pytest
from mpi4py import MPI

from helpers import gemm_scaled_error, random_array
from summa.distribution.grid import ProcessGrid
from summa.distribution.matrix import DistMatrix
from summa.execution.algorithm import gemm
from summa.api.multiply import matmul
from summa.api.verify import freivalds, scaled_error, unit_roundoff


def test_scaled_error_flags_nan_and_zero_gauge():
    ref = np.ones(3)
    assert scaled_error(ref, ref, np.ones(3)) == 0
    assert scaled_error(np.array([1, np.nan, 1]), ref, np.ones(3)) == np.inf
    assert scaled_error(np.array([1, 2, 1.0]), ref, np.array([1, 0, 1.0])) == np.inf
    assert scaled_error(np.array([1, 1.5, 1.0]), ref, np.ones(3)) == 0.5


def test_unit_roundoff():
    assert unit_roundoff("float32") == np.finfo(np.float32).eps
    assert unit_roundoff("float32", "tf32") == 2.0 ** -10


def test_reference_check_catches_one_wrong_element(rng=np.random.default_rng()):
    a, b = random_array(rng, (20, 30), "float32"), random_array(rng, (30, 10), "float32")
    c = (a.astype(np.float64) @ b).astype(np.float32)
    assert gemm_scaled_error(c, a, b) <= 1
    c[3, 4] += 1e-3
    assert gemm_scaled_error(c, a, b) > 1


def test_both_checks_take_correctly_rounded_subnormal_products_and_flag_wrong_ones():
    """float16 products of values near 1e-4 over one term fall in the
    subnormal range (below 6.1e-5), where a correctly rounded result is off
    by more than eps times itself: both gauges take it (their underflow
    term), and both still flag a product of normal size that is wrong."""
    rng = np.random.default_rng()
    a = (rng.uniform(-1, 1, (60, 1)) * 1e-4).astype(np.float16)
    b = (rng.uniform(-1, 1, (1, 70)) * 1e-4).astype(np.float16)
    c = (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float16)
    assert np.abs(c).max() < np.finfo(np.float16).smallest_normal
    assert freivalds(a, b, c) <= 1 and gemm_scaled_error(c, a, b) <= 1
    big_a, big_b = a * np.float16(1e3), b * np.float16(1e3)
    wrong = (big_a.astype(np.float64) @ big_b.astype(np.float64)).astype(np.float16)
    wrong[5, 7] += np.float16(1)  # far off: every |c| <= 0.01
    assert freivalds(big_a, big_b, wrong) > 1 and gemm_scaled_error(wrong, big_a, big_b) > 1


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dtype", ["float64", "float32", "complex64", "complex128"])
def test_freivalds_passes_right_and_fails_wrong(comm, backend, rng, dtype):
    with ProcessGrid(comm) as grid:
        A = DistMatrix.random((40, 25), dtype, grid, backend, seed=int(rng.integers(1 << 30)))
        B = DistMatrix.random((25, 31), dtype, grid, backend, seed=int(rng.integers(1 << 30)))
        C = matmul(A, B, panel_width=6)
        assert freivalds(A, B, C) <= 1
        # one element wrong by a relative 1e-3 of its scale: must fail everywhere
        i, j = 17, 30
        if (A.layout.rows.owner(i), B.layout.cols.owner(j)) == (grid.row, grid.col):
            _, li = C.layout.rows.to_local(i)
            _, lj = C.layout.cols.to_local(j)
            C.local[int(li), int(lj)] += 1e-3 * 25
        assert freivalds(A, B, C) > 1


@pytest.mark.mpi(min_size=1)
def test_freivalds_with_alpha_beta(comm, backend, rng):
    with ProcessGrid(comm) as grid:
        A = DistMatrix.random((12, 9), "float64", grid, backend, seed=1)
        B = DistMatrix.random((9, 14), "float64", grid, backend, seed=2)
        C0 = DistMatrix.random((12, 14), "float64", grid, backend, seed=3)
        C = gemm(A, B, C0.copy(), alpha=2.0, beta=-3.0)
        assert freivalds(A, B, C, alpha=2.0, beta=-3.0, C0=C0) <= 1
        assert freivalds(A, B, C, alpha=2.0, beta=3.0, C0=C0) > 1
        with pytest.raises(ValueError, match="C0"):
            freivalds(A, B, C, beta=1.0)


@pytest.mark.parametrize("dtype", ["float64", "complex64"])
def test_freivalds_on_numpy_arrays_as_summa_matmul_returns_them(rng, dtype):
    """The user's own arrays (summa.matmul's result): checked where called,
    right passes, one element off fails, bad operands get one clear error."""
    a, b = random_array(rng, (70, 45), dtype), random_array(rng, (45, 33), dtype)
    c = summa_matmul_local(a, b)
    assert freivalds(a, b, c) <= 1
    c0 = random_array(rng, (70, 33), dtype)
    assert freivalds(a, b, 2.0 * c - c0, alpha=2.0, beta=-1.0, C0=c0) <= 1
    c[50, 7] += 1e-3 * 45
    assert freivalds(a, b, c) > 1
    with pytest.raises(ValueError, match=r"shapes A \(70, 45\), B \(45, 33\), C \(33, 70\)"):
        freivalds(a, b, c.T)
    with ProcessGrid(MPI.COMM_SELF) as grid:
        from summa.device.backend import get_backend
        A = DistMatrix.from_global(a, grid, get_backend("numpy"))
        with pytest.raises(TypeError, match="not a mix"):
            freivalds(A, b, c)


def summa_matmul_local(a, b):
    from summa.api.multiply import matmul_arrays
    return matmul_arrays(a, b, comm=MPI.COMM_SELF, backend="numpy")
