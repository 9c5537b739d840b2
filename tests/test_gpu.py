"""GPU-only checks (skipped without CuPy and a device). The rest of the suite
runs on the GPU too with SUMMA_TEST_BACKEND=cupy (see .ci/gpu-check)."""

import numpy as np
import pytest

from helpers import (expected_reductions, gemm_scaled_error, held_plan, random_array,
                     reduction_cases, within_two_ulps)
from summa.device.backend import cupy_available, get_backend
from summa.distribution.grid import ProcessGrid
from summa.distribution.matrix import DistMatrix
from summa.execution.algorithm import gemm
from summa.api.multiply import matmul
from summa.options import Options

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
@pytest.mark.parametrize("comm_kind", ["auto", "nccl", "mpi"])
def test_a_rank_runs_on_its_gpu_whatever_gpu_is_current(comm, rng, gpu, comm_kind):
    """A process may hold backends of several GPUs (each made current as it is
    made): in memory and out of core, the work of a rank's backend runs on
    that backend's GPU, and the caller's current GPU is left as it was. On two
    GPUs a backend made later for GPU 0 left rank 1's GEMMs queued there (its
    timing events unready at the end) and its NCCL communicator made on GPU 0
    (NCCL refused two ranks on one GPU)."""
    import cupy
    from summa.device.backend import NumpyBackend
    from summa.execution.outofcore import SweepOperands, summa_out_of_core
    grid, backend = gpu
    count = cupy.cuda.runtime.getDeviceCount()
    if count < 2:
        pytest.skip("needs two GPUs")
    if comm_kind == "nccl" and comm.size > count:
        pytest.skip("NCCL needs a GPU per rank")
    other = (backend.device + 1) % count
    a, b, c0 = (random_array(rng, shape, "float64") for shape in ((96, 70), (70, 50), (96, 50)))
    host = NumpyBackend()
    try:
        cupy.cuda.Device(other).use()
        A, B, C = (DistMatrix.from_global(x, grid, backend) for x in (a, b, c0))
        gemm(A, B, C, alpha=0.5, beta=2.0, panel_width=16, broadcaster=comm_kind)
        fresh = gemm(A, B, panel_width=16, broadcaster=comm_kind)  # its C made there
        assert C.local.device.id == fresh.local.device.id == backend.device
        Ah, Bh, Ch = (DistMatrix.from_global(x, grid, host) for x in (a, b, c0))
        plan = held_plan(Ah, Bh, Ch, backend, device_memory=64 << 10, panel_width=16,
                         broadcaster=comm_kind)
        summa_out_of_core(plan, SweepOperands(Ah, Bh, Ch), backend, alpha=0.5, beta=2.0)
        assert cupy.cuda.runtime.getDevice() == other
        in_memory, out_of_core, product = C.gather(), Ch.gather(), fresh.gather()
    finally:
        cupy.cuda.Device(backend.device).use()
    if comm.rank == 0:
        for c in (in_memory, out_of_core):
            assert gemm_scaled_error(c, a, b, c0, 0.5, 2.0) <= 1
        assert gemm_scaled_error(product, a, b) <= 1


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
    # what an allocation could still get: the device's free memory and the pool's freed
    # blocks (ranks sharing a GPU may allocate between the two readings: bounds only)
    total = backend.xp.cuda.runtime.memGetInfo()[1]
    assert pool.free_bytes() <= backend.memory_free() <= total + pool.free_bytes()


def _modes(backend):
    from test_comm import modes
    return modes(backend)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("mode", ["mpi", "nccl", "cuda-aware", "ipc"])
@pytest.mark.parametrize("shape", [(97, 61, 203), (5, 300, 7)])
@pytest.mark.parametrize("which", ["auto", "row", "col"])
def test_every_comm_mode_matches_reference(comm, rng, gpu, mode, shape, which):
    from summa.transports.comm import mpi_cuda_aware
    grid0, backend = gpu
    available = _modes(backend) + (["cuda-aware"] if mpi_cuda_aware()[0] else [])
    if mode not in available:
        pytest.skip(f"{mode} is not available here")
    m, n, k = shape
    p = comm.Get_size()
    with ProcessGrid(comm, {"auto": None, "row": (1, p), "col": (p, 1)}[which]) as grid:
        a, b = random_array(rng, (m, k), "float64"), random_array(rng, (k, n), "float64")
        A = DistMatrix.from_global(a, grid, backend)
        B = DistMatrix.from_global(b, grid, backend)
        for lookahead in (0, 2):
            c = matmul(A, B, panel_width=16, broadcaster=mode, lookahead=lookahead).gather()
            if comm.rank == 0:
                assert gemm_scaled_error(c, a, b) <= 1


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("mode", ["mpi", "nccl", "cuda-aware", "ipc"])
def test_own_panels_first_on_the_gpu(comm, rng, gpu, mode):
    """A grid column (P x 1) where each rank receives two panels at most: its own
    go first, its sends start without waiting for the GEMMs (NCCL, ipc, CUDA-aware
    and staged sends from the block itself). Right, and the same bits for every
    lookahead >= 1."""
    from summa.transports.comm import mpi_cuda_aware
    _, backend = gpu
    available = _modes(backend) + (["cuda-aware"] if mpi_cuda_aware()[0] else [])
    if mode not in available:
        pytest.skip(f"{mode} is not available here")
    p = comm.Get_size()
    m, n, k = 50, 70, 32 * p  # two 16-wide panels per rank; P = 2 receives two
    a, b = random_array(rng, (m, k), "float64"), random_array(rng, (k, n), "float64")
    with ProcessGrid(comm, (p, 1)) as grid:
        A = DistMatrix.from_global(a, grid, backend)
        B = DistMatrix.from_global(b, grid, backend)
        results = [matmul(A, B, panel_width=16, broadcaster=mode, lookahead=la).gather()
                   for la in (1, 3)]
    if comm.rank == 0:
        assert gemm_scaled_error(results[0], a, b) <= 1
        assert np.array_equal(results[0], results[1])


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("mode", ["auto", "mpi", "nccl", "cuda-aware", "ipc"])
@pytest.mark.parametrize("schedule", ["panels", "strips"])
@pytest.mark.parametrize("strips", [1, 2, 9])
def test_every_schedule_broadcaster_and_lookahead_on_the_gpu(comm, rng, gpu, mode, schedule,
                                                             strips):
    """Each schedule through each broadcaster at lookahead 0-3, with one, two
    and many strips (or panels) per rank: on one GPU the ranks share it (host-
    staged MPI, where strips once came out wrong), on several each has its own."""
    from summa.transports.comm import mpi_cuda_aware
    _, backend = gpu
    available = ["auto"] + _modes(backend) + (["cuda-aware"] if mpi_cuda_aware()[0] else [])
    if mode not in available:
        pytest.skip(f"{mode} is not available here")
    p, width = comm.Get_size(), 16
    m, n, k = 45, width * strips - 3, width * strips * p + 5
    with ProcessGrid(comm, (p, 1) if schedule == "strips" else None) as grid:
        for lookahead in range(4):
            a, b = random_array(rng, (m, k), "float64"), random_array(rng, (k, n), "float64")
            c0 = random_array(rng, (m, n), "float64")
            A, B, C = (DistMatrix.from_global(x, grid, backend) for x in (a, b, c0))
            gemm(A, B, C, alpha=0.5, beta=2.0, panel_width=width, broadcaster=mode,
                 lookahead=lookahead, schedule=schedule)
            c = C.gather()
            if comm.rank == 0:
                assert gemm_scaled_error(c, a, b, c0, 0.5, 2.0) <= 1, lookahead


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("mode", ["mpi", "nccl", "cuda-aware", "ipc"])
@pytest.mark.parametrize("dtype,precision", [("float32", None), ("float32", "tf32"),
                                             ("float64", None), ("complex128", None)])
def test_column_strips_on_the_gpu(comm, rng, gpu, mode, dtype, precision):
    """Column strips (P x 1, every GEMM over all of K): right with every
    broadcaster, including ipc's direct reads of strided strips, and the same
    bits for every lookahead."""
    from summa.transports.comm import mpi_cuda_aware
    _, backend = gpu
    available = _modes(backend) + (["cuda-aware"] if mpi_cuda_aware()[0] else [])
    if mode not in available:
        pytest.skip(f"{mode} is not available here")
    p = comm.Get_size()
    m, n, k = 70, 93, 41 * p + 3
    a, b = random_array(rng, (m, k), dtype), random_array(rng, (k, n), dtype)
    with ProcessGrid(comm, (p, 1)) as grid:
        A = DistMatrix.from_global(a, grid, backend)
        B = DistMatrix.from_global(b, grid, backend)
        results = [matmul(A, B, panel_width=16, broadcaster=mode, lookahead=la,
                          precision=precision, schedule="strips").gather()
                   for la in (0, 1, 3)]
    if comm.rank == 0:
        assert gemm_scaled_error(results[0], a, b, precision=precision) <= 1
        assert all(np.array_equal(r, results[0]) for r in results[1:])


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dtype", ["float32", "complex64"])
def test_tf32_is_within_its_gauge_and_really_tf32(comm, rng, gpu, dtype):
    grid, backend = gpu
    a, b = random_array(rng, (128, 512), dtype), random_array(rng, (512, 96), dtype)
    A = DistMatrix.from_global(a, grid, backend)
    B = DistMatrix.from_global(b, grid, backend)
    c = matmul(A, B, panel_width=64, precision="tf32").gather()
    plain = matmul(A, B, panel_width=64).gather()
    if comm.rank == 0:
        assert gemm_scaled_error(c, a, b, precision="tf32") <= 1
        # TF32 really ran: 10 mantissa bits instead of 23 make it far less exact
        assert gemm_scaled_error(c, a, b) > 20 * gemm_scaled_error(plain, a, b)


@pytest.mark.mpi(min_size=1)
def test_strided_panels_multiply_in_place(comm, rng, gpu):
    """GEMM on row-strided views (panels used where they lie) is exact."""
    _, backend = gpu
    xp = backend.xp
    big = xp.asarray(random_array(rng, (40, 64), "float64"))
    b = xp.asarray(random_array(rng, (16, 24), "float64"))
    c = xp.zeros((40, 24))
    backend.gemm(1.0, big[:, 8:24], b, c)
    np.testing.assert_allclose(backend.to_host(c), backend.to_host(big[:, 8:24] @ b),
                               rtol=1e-13, atol=1e-13)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "complex64", "complex128"])
def test_column_major_operands_and_transposes(comm, rng, gpu, dtype):
    """cuBLAS reads a column-major A or B as its transposed operand (no copy),
    and ``transpose`` (geam; float16 by CuPy) copies a row-strided panel exactly."""
    _, backend = gpu
    xp = backend.xp
    a = xp.asarray(random_array(rng, (37, 64), dtype))
    b = xp.asarray(random_array(rng, (24, 29), dtype))
    panel = a[:, 8:32]  # row-strided
    copy = xp.empty((24, 37), dtype=dtype)
    backend.transpose(panel, copy)
    assert bool((copy == panel.T).all())
    want = backend.to_host(panel).astype(np.complex128) @ backend.to_host(b)
    for x, y in ((copy.T, b), (panel, xp.asfortranarray(b)), (copy.T, xp.asfortranarray(b))):
        c = xp.zeros((37, 29), dtype=dtype)
        backend.gemm(1.0, x, y, c)
        got = backend.to_host(c).astype(np.complex128)
        tol = 24 * np.finfo(dtype).eps * 4
        assert np.abs(got - want).max() <= tol * np.abs(want).max() + tol, (x.flags, y.flags)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("mode", ["nccl", "ipc"])
@pytest.mark.parametrize("dtype,precision", [("float64", None), ("float32", None),
                                             ("float32", "tf32"), ("float16", None)])
def test_transposed_panels_on_the_gpu(comm, rng, gpu, monkeypatch, mode, dtype, precision):
    """A's panels copied transposed (forced for every dtype): the reference's
    product with every broadcaster, on every grid shape."""
    _, backend = gpu
    if mode not in _modes(backend):
        pytest.skip(f"{mode} is not available here")
    monkeypatch.setenv("SUMMA_TRANSPOSE_A", "yes")
    p = comm.Get_size()
    m, n, k = 70, 93, 41 * p + 3
    a, b = random_array(rng, (m, k), dtype), random_array(rng, (k, n), dtype)
    for shape in {(p, 1), (1, p)}:
        with ProcessGrid(comm, shape) as grid:
            A = DistMatrix.from_global(a, grid, backend)
            B = DistMatrix.from_global(b, grid, backend)
            c = matmul(A, B, panel_width=16, broadcaster=mode, precision=precision).gather()
        if comm.rank == 0:
            assert gemm_scaled_error(c, a, b, precision=precision) <= 1, shape


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("layout", ["F", "op T", "op H", "op H of F", "strided op T"])
@pytest.mark.parametrize("how", ["in memory", "out of core"])
def test_complex128_b_by_columns_is_read_from_row_major_copies(comm, rng, layout, how):
    """complex128 B lying by columns (Fortran, op T, op H) goes through
    PanelsOfB on the GPU by default (SUMMA_TRANSPOSE_B=auto): row-major
    copies, op H conjugated there; the reference's product, on every grid."""
    from summa import SummaStats
    from test_layouts import operand
    p = comm.Get_size()
    m, n, k = 70, 93, 41 * p + 3
    a, ta, xa = operand(rng, (m, k), "complex128", "F")
    b, tb, xb = operand(rng, (k, n), "complex128", layout)
    stats = SummaStats()
    # (host arrays on GPUs stay in host memory unless asked: in memory asked for)
    kwargs = {"device_memory": "256KiB"} if how == "out of core" else {"out_of_core": False}
    c = matmul(a if comm.rank == 0 else None, b if comm.rank == 0 else None, comm=comm,
               trans_a=ta, trans_b=tb, panel_width=16, backend="cupy", stats=stats, **kwargs)
    if comm.rank == 0:
        assert gemm_scaled_error(c, xa, xb) <= 1
    # in memory a grid's blocks are made C-ordered on their devices: nothing to copy
    by_columns = stats.extra["plan"]["storage"][1].endswith("cols")
    assert by_columns == (layout != "op H of F")
    assert bool(stats.extra.get("out_of_core")) == (how == "out of core")
    assert stats.extra["transposed_b"] == (by_columns and (how == "out of core" or p == 1))


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("mode,size", [("auto", 300), ("ipc", 300), ("ipc", 2000)])
def test_out_of_core_on_the_gpu(comm, rng, gpu, dtype, mode, size):
    # ipc at 2000: 63 panels through 2 slots, where a root once refilled a slot
    # before its panel had been copied out (float64 results came out wrong).
    from summa.device.backend import NumpyBackend
    from summa.execution.outofcore import SweepOperands, summa_out_of_core
    grid, backend = gpu
    if mode not in _modes(backend):
        pytest.skip(f"{mode} is not available here")
    m, k, n = size, size * 2 // 3, size * 13 // 15
    a, b = random_array(rng, (m, k), dtype), random_array(rng, (k, n), dtype)
    c0 = random_array(rng, (m, n), dtype)
    host = NumpyBackend()
    A, B = DistMatrix.from_global(a, grid, host), DistMatrix.from_global(b, grid, host)
    # below one C block, whatever the grid (3 ranks' float32 blocks fit the first)
    local_c = np.dtype(dtype).itemsize * -(-m // grid.shape[0]) * -(-n // grid.shape[1])
    budget = min(200_000 * (size // 300) ** 2, local_c * 9 // 10)
    for beta in (0.0, -0.5):  # C starts from zero on the device, or is uploaded
        C = DistMatrix.from_global(c0, grid, host)
        plan = held_plan(A, B, C, backend, device_memory=budget, panel_width=32, broadcaster=mode)
        stats = summa_out_of_core(plan, SweepOperands(A, B, C), backend, alpha=1.5, beta=beta)
        assert stats.extra["tiles"][0] * stats.extra["tiles"][1] > 1  # really tiled
        head, tail = stats.extra["head_seconds"], stats.extra["tail_seconds"]
        # GPU event times against the host clock: 2 ms of slack between the two clocks
        assert 0 <= head < stats.seconds + 2e-3 and 0 <= tail < stats.seconds + 2e-3
        c = C.gather()
        if comm.rank == 0:
            assert gemm_scaled_error(c, a, b, c0, 1.5, beta) <= 1


@pytest.mark.mpi(min_size=1)
def test_check_of_host_held_matrices_on_the_gpu(comm, rng, gpu):
    # bench and multiply check out-of-core results through the GPU
    from summa.device.backend import NumpyBackend
    from summa.api.verify import freivalds
    grid, backend = gpu
    host = NumpyBackend()
    A = DistMatrix.random((70, 50), "float32", grid, host, seed=3, compute=backend)
    B = DistMatrix.random((50, 60), "float32", grid, host, seed=4, compute=backend)
    assert A.backend is host and isinstance(A.local, np.ndarray)
    C = matmul(A, B, panel_width=16)
    assert freivalds(A, B, C, compute=backend) <= 1
    assert freivalds(A, B, C, compute=backend) == pytest.approx(freivalds(A, B, C), rel=1e-6)
    if C.local.size:
        C.local[0, 0] += 1e-2 * 50
    assert freivalds(A, B, C, compute=backend) > 1


@pytest.mark.mpi(min_size=1)
def test_host_copies_work_on_partly_locked_memory(comm, gpu):
    # CUDA refuses a copy whose host range is partly page-locked; a small array
    # sharing a page with a locked one is such a range, so the mover and the
    # backend stage it.
    import cupy
    from summa.execution.movers import CudaMover
    _, backend = gpu
    page = 4096
    raw = np.zeros(6 * page, dtype=np.uint8)
    first = -raw.ctypes.data % page  # the first page boundary inside raw
    cupy.cuda.runtime.hostRegister(raw.ctypes.data + first, 2 * page, 0)
    try:
        host = raw[first + page: first + 4 * page].view(np.float64).reshape(-1, 64)
        host[...] = np.arange(host.size).reshape(host.shape)  # rows 0-7 locked, 8-23 not
        mover = CudaMover(backend, np.float64)
        dev = cupy.empty(host.shape)
        mover._h2d(dev, host, mover.up)
        mover.up.synchronize()
        assert np.array_equal(cupy.asnumpy(dev), host)
        dev += 1
        cupy.cuda.Device().synchronize()
        mover._d2h(host, dev, mover.down)
        assert np.array_equal(host, np.arange(host.size).reshape(host.shape) + 1)
        assert mover.staged == 2
        # the backend's own copies (the check's, the scatter's) likewise
        with pytest.raises(cupy.cuda.runtime.CUDARuntimeError):
            cupy.asarray(host)
        assert np.array_equal(cupy.asnumpy(backend.asarray(host)), host)
        backend.to_host(dev - 1, out=host)
        assert np.array_equal(host, np.arange(host.size).reshape(host.shape))
        assert np.array_equal(backend.to_host(dev), host + 1)
    finally:
        cupy.cuda.runtime.hostUnregister(raw.ctypes.data + first)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dtype,precision", [("float16", None), ("float32", None),
                                             ("float32", "tf32"), ("float64", None),
                                             ("complex64", None), ("complex128", None)])
def test_cublaslt_gemm_matches_reference_and_repeats_bit_for_bit(comm, rng, gpu, dtype,
                                                                 precision):
    from summa.device.backend import CupyBackend
    _, backend = gpu
    lt = CupyBackend(backend.device, Options(gemm="cublaslt"))
    xp = lt.xp
    wide = random_array(rng, (300, 240), dtype)
    a, b, c0 = wide[:, 20:220], random_array(rng, (200, 260), dtype), \
        random_array(rng, (300, 260), dtype)
    results = []
    for _ in range(2):
        c = xp.asarray(c0)
        # a row-strided panel, as SUMMA passes them
        lt.gemm(0.5, xp.asarray(wide)[:, 20:220], xp.asarray(b), c, beta=2.0,
                precision=precision)
        results.append(xp.asnumpy(c))
    assert gemm_scaled_error(results[0], a, b, c0, 0.5, 2.0, precision=precision) <= 1
    assert np.array_equal(results[0], results[1])  # one algorithm per shape, kept
    assert "cuBLASLt" in lt.describe()


@pytest.mark.mpi(min_size=1)
def test_calibrate_times_the_host_link_of_every_gpu_copying_at_once(comm, gpu):
    """`summa calibrate`'s host_link: staged and page-locked rates each way,
    every rank copying at once; a profile with them times the host link."""
    from summa.cli.calibrate import host_link_rates
    from summa.planning.profile import Profile
    _, backend = gpu
    link = host_link_rates(comm, backend, nbytes=64 << 20, repeat=2)
    rates = [link[k] for k in ("h2d_gbs", "d2h_gbs", "pinned_h2d_gbs", "pinned_d2h_gbs")]
    # beyond 1000 GB/s a copy was not waited for; below 0.1 it was not a link
    assert all(0.1 < gbs < 1000 for gbs in rates), link
    profile = Profile({"gemm": [{"m": 1, "n": 1, "k": 1, "dtype": "float64",
                                 "seconds": 1.0}], "host_link": link})
    assert profile.host_seconds(1e9, 0) == pytest.approx(1 / link["h2d_gbs"])
    # as many of the node's GPUs copying at once as it has ranks here (one node)
    assert profile.link_gpus() == comm.Get_size()


@pytest.mark.mpi(min_size=1)
def test_high_priority_compute_stream_gives_the_same_product(comm, rng, gpu):
    from summa.device.backend import CupyBackend
    grid, backend = gpu
    high = CupyBackend(backend.device, Options(compute_priority="high"))
    assert "high-priority" in high.describe()
    a, b = random_array(rng, (130, 70), "float64"), random_array(rng, (70, 90), "float64")
    results = []
    for be in (backend, high):
        A, B = DistMatrix.from_global(a, grid, be), DistMatrix.from_global(b, grid, be)
        results.append(matmul(A, B, panel_width=16).gather())
    if comm.rank == 0:
        assert gemm_scaled_error(results[1], a, b) <= 1
        assert np.array_equal(results[0], results[1])


@pytest.mark.mpi(min_size=2)
def test_a_staging_buffer_one_rank_cannot_get_fails_on_every_rank(comm, gpu, monkeypatch):
    """ipc's paired broadcasts allocate a staging buffer per slot: where one
    rank's GPU has no room for it, every rank raises (none waits for it)."""
    import cupy
    from summa.transports.ipc import IpcBroadcaster
    _, backend = gpu
    if "ipc" not in _modes(backend):
        pytest.skip("ipc is not available here")
    bc = IpcBroadcaster(comm, backend)
    real = cupy.cuda.Memory

    def memory(nbytes):
        if comm.rank == 1 and nbytes > 1 << 20:
            raise cupy.cuda.memory.OutOfMemoryError(nbytes, 0, 0)
        return real(nbytes)

    monkeypatch.setattr(cupy.cuda, "Memory", memory)
    small = cupy.ones(16, dtype=np.float64)
    bc.ibcast(small, 0, slot=0).wait()  # fits everywhere
    big = cupy.ones((2 << 20) // 8, dtype=np.float64)
    with pytest.raises(RuntimeError, match=r"rank 1 cannot allocate or export a \d+-byte"):
        bc.ibcast(big, 0, slot=1)
    bc.free()


def _ipc_pair(grid, backend):
    return grid.resources[("broadcasters", "ipc", backend.name, backend.device)]


@pytest.mark.mpi(min_size=2)
def test_auto_keeps_small_blocks_open_between_multiplies(comm, rng, gpu):
    """Small blocks open too slowly for their GEMMs to hide it, but stay open:
    ``auto`` copies directly, the first multiply opens the peers' blocks, the
    second opens nothing and reads the values written into them since; blocks
    in new allocations are opened in turn and the old ones let go; the bits
    repeat; ``prepare`` opens them ahead."""
    from summa.execution.algorithm import prepare, summa
    _, backend = gpu
    if "ipc" not in _modes(backend):
        pytest.skip("ipc is not available here")
    if len(set(comm.allgather(backend.device_id()))) < comm.Get_size():
        # (two ranks on one H200: auto measured host-staged mpi faster and took it)
        pytest.skip("ranks share a GPU: auto's choice there is a measurement, not ipc's")
    p = comm.Get_size()
    with ProcessGrid(comm, (p, 1)) as grid:  # B's blocks are read down the column
        a, b = random_array(rng, (512, 1024), "float32"), random_array(rng, (1024, 256), "float32")
        A = DistMatrix.from_global(a, grid, backend)
        B = DistMatrix.from_global(b, grid, backend)
        C = DistMatrix.zeros((512, 256), "float32", grid, backend)
        results, opened = [], []
        for step in range(3):
            if step == 2:  # new values, the same memory
                b = random_array(rng, b.shape, "float32")
                B.local[...] = DistMatrix.from_global(b, grid, backend).local
            stats = summa(1.0, A, B, 0.0, C)
            assert stats.comm == "ipc"
            opened.append(stats.extra["opened_blocks"])
            results.append(C.gather())
            if comm.rank == 0:
                assert gemm_scaled_error(results[-1], a, b) <= 1
        assert opened == [p - 1, 0, 0]
        if comm.rank == 0:
            assert not np.array_equal(results[1], results[2])  # B's new values were read
        column = _ipc_pair(grid, backend).col
        assert [v is B.local for v in column._held.values()] == [True]
        # B in a new allocation (the old one is held): opened, then kept; the old let go
        B2 = DistMatrix.from_global(b, grid, backend)
        prepare(A, B2, C)
        stats = summa(1.0, A, B2, 0.0, C)
        assert stats.comm == "ipc" and stats.extra["opened_blocks"] == 0
        assert [v is B2.local for v in column._held.values()] == [True]
        c = C.gather()
        if comm.rank == 0:
            assert np.array_equal(c, results[2])  # the same product, the same bits
    assert column._held == {}  # the grid freed: nothing held


@pytest.mark.mpi(min_size=2)
def test_blocks_too_large_to_keep_are_opened_every_time(comm, rng, gpu, monkeypatch):
    """Above the share of device memory kept open, ``ipc`` opens the peers'
    blocks at every multiply and holds none, and ``auto`` takes NCCL where the
    GEMMs would not hide the opening."""
    import summa.transports.ipc as ipc
    from summa.execution.algorithm import summa
    _, backend = gpu
    if "ipc" not in _modes(backend):
        pytest.skip("ipc is not available here")
    monkeypatch.setattr(ipc, "KEEP_OPEN_SHARE", 0)
    p = comm.Get_size()
    with ProcessGrid(comm, (p, 1)) as grid:
        a, b = random_array(rng, (256, 512), "float64"), random_array(rng, (512, 128), "float64")
        A = DistMatrix.from_global(a, grid, backend)
        B = DistMatrix.from_global(b, grid, backend)
        C = DistMatrix.zeros((256, 128), "float64", grid, backend)
        for mode in ("ipc", "ipc", "auto", "auto", "auto"):
            stats = summa(1.0, A, B, 0.0, C, broadcaster=mode)
            assert (stats.comm == "ipc") == (mode == "ipc")
            if mode == "ipc":
                assert stats.extra["opened_blocks"] == p - 1
                assert _ipc_pair(grid, backend).col._held == {}
        c = C.gather()
        if comm.rank == 0:
            assert gemm_scaled_error(c, a, b) <= 1


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dtype", ["float64", "complex64"])
def test_numpy_arrays_stream_through_the_gpu_into_out(comm, rng, dtype):
    """summa.matmul on pageable NumPy arrays: host-resident by itself, staged
    through page-locked chunks (several per panel part, rows with a pitch),
    the product written into `out`; right on every rank count."""
    from summa.device import staging
    import summa
    big = random_array(rng, (700, 300), dtype)
    a, b = big[:650, 10:290], random_array(rng, (280, 333), dtype)
    root = comm.Get_size() - 1
    out = np.full((650, 333), np.nan, dtype=dtype) if comm.rank == root else None
    saved = staging.CHUNK_BYTES
    staging.close_stagers()
    staging.CHUNK_BYTES = 4096  # a few rows a chunk: every path of the rings
    try:
        stats = summa.SummaStats()
        c = summa.matmul(a if comm.rank == root else None, b if comm.rank == root else None,
                         root=root, out=out, panel_width=64, stats=stats)
    finally:
        staging.close_stagers()
        staging.CHUNK_BYTES = saved
    assert stats.extra.get("out_of_core")
    if comm.rank == root:
        assert c is out and gemm_scaled_error(c, a, b) <= 1


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("shape", [(64, 48, 80), (33, 65, 17), (5, 3, 1), (300, 257, 1030)])
def test_int8_products_on_the_gpu_are_exact_and_ozaki_matches_the_cpu(comm, rng, gpu, shape):
    """cuBLAS's INT8 GEMM ("TN", K and N padded to 4) against NumPy's int64
    product; the fused kernels' residues against NumPy's, bit for bit; the
    whole product against the CPU's (the same float64 formulas: equal but
    for the low sums' rounding order), alpha and beta applied; Inf refused."""
    from summa.precision import kernels, ozaki, ozaki_gpu
    _, backend = gpu
    cp = backend.xp
    m, n, k = shape
    a8 = rng.integers(-128, 128, (m, k)).astype(np.int8)
    b8 = rng.integers(-128, 128, (k, n)).astype(np.int8)
    got = backend.int8_product(cp.asarray(a8), cp.asarray(b8))
    assert np.array_equal(cp.asnumpy(got), a8.astype(np.int64) @ b8.astype(np.int64))
    a, b = rng.uniform(-1, 1, (m, k)), rng.uniform(-1, 1, (k, n))
    a[0] *= 1e-300  # a row of tiny values keeps its bits
    da, db = cp.asarray(a), cp.asarray(b)
    count = ozaki.default_moduli(ozaki.BITS, k)
    cap = ozaki.budgets(count, k)[0]
    e = ozaki_gpu.scaling_exponents(da, 1, ozaki.BITS, cap)
    planes = kernels.residue_planes(da, e, count, m, -(-k // 4) * 4,
                                    kernels.moduli_constants(count))
    abar, e_cpu = ozaki.scale(a, 1, ozaki.BITS, np, cap)
    assert np.array_equal(cp.asnumpy(e), e_cpu.ravel())
    for l, mod in enumerate(ozaki.MODULI[:count]):
        assert np.array_equal(cp.asnumpy(planes[l, :, :k]), ozaki.residues(abar, mod))
    assert not cp.asnumpy(planes[:, :, k:]).any()
    want = ozaki.gemm_int8(a, b)
    c0 = rng.uniform(-1, 1, (m, n))
    dc = cp.asarray(c0)
    ozaki_gpu.gemm(2.0, da, db, dc, beta=-0.5, backend=backend)
    ulp = np.spacing(np.abs(2 * want - 0.5 * c0)) * 2
    assert np.all(np.abs(cp.asnumpy(dc) - (2 * want - 0.5 * c0)) <= ulp)
    dc = cp.empty((m, n))
    backend.gemm(1.0, da, db, dc, beta=0.0, precision="fp64-int8")
    assert gemm_scaled_error(cp.asnumpy(dc), a, b) <= 1
    da[m - 1, k - 1] = cp.inf
    with pytest.raises(ValueError, match="finite inputs"):
        ozaki_gpu.gemm(1.0, da, db, dc, backend=backend)


@pytest.mark.mpi(min_size=1)
def test_summa_with_fp64_on_int8_tensor_cores(comm, rng, gpu):
    """precision="fp64-int8" through SUMMA, in memory (device blocks) and out of
    core (NumPy arrays), within the float64 gauge."""
    grid, backend = gpu
    a, b = rng.uniform(-1, 1, (700, 530)), rng.standard_normal((530, 610))
    A = DistMatrix.from_global(a, grid, backend)
    B = DistMatrix.from_global(b, grid, backend)
    c = matmul(A, B, precision="fp64-int8", panel_width=128).gather()
    if comm.rank == 0:
        assert gemm_scaled_error(c, a, b) <= 1
    got = matmul(a if comm.rank == 0 else None, b if comm.rank == 0 else None,
                 comm=comm, precision="fp64-int8", panel_width=200)
    if comm.rank == 0:
        assert gemm_scaled_error(got, a, b) <= 1


@pytest.mark.mpi(min_size=2)
def test_summa_fp64_int8_on_a_grid_is_one_gpus_whole_product(comm, rng, gpu, monkeypatch):
    """fp64-int8 on several ranks (panel sums, the default): the exponents
    over all of K and the panels' INT8 products summed before one fold give
    one GPU's product of the whole (ozaki_gpu.gemm), whatever the grid and
    panels; with SUMMA_FP64_INT8_SUMS=0 (a fold a panel) within the gauge too."""
    from summa.precision import ozaki_gpu, panel_sums
    grid, backend = gpu
    cp = backend.xp
    finished = []
    real = panel_sums.PanelSums.finish
    monkeypatch.setattr(panel_sums.PanelSums, "finish",
                        lambda self, *a, **k: (finished.append(1), real(self, *a, **k)))
    a, b = rng.uniform(-1, 1, (300, 530)), rng.standard_normal((530, 210))
    A = DistMatrix.from_global(a, grid, backend)
    B = DistMatrix.from_global(b, grid, backend)
    c = matmul(A, B, precision="fp64-int8", panel_width=128).gather()
    assert finished == [1]
    finished.clear()
    if comm.rank == 0:
        whole = cp.empty((300, 210))
        ozaki_gpu.gemm(1.0, cp.asarray(a), cp.asarray(b), whole, backend=backend)
        whole = cp.asnumpy(whole)
        assert gemm_scaled_error(c, a, b) <= 1
        assert np.all(np.abs(c - whole) <= 2 * np.spacing(np.abs(whole)))
    from summa.execution.algorithm import summa
    C = DistMatrix.zeros((300, 210), "float64", grid, backend)
    assert summa(1.0, A, B, 0.0, C, panel_width=128, precision="fp64-int8").extra["panel_sums"]
    monkeypatch.setenv("SUMMA_FP64_INT8_SUMS", "0")
    finished.clear()
    c = matmul(A, B, precision="fp64-int8", panel_width=128).gather()
    assert finished == []
    if comm.rank == 0:
        assert gemm_scaled_error(c, a, b) <= 1
    assert not summa(1.0, A, B, 0.0, C, panel_width=128, precision="fp64-int8").extra["panel_sums"]


@pytest.mark.mpi(min_size=1)
def test_large_host_copies_go_through_the_stager(comm, rng, gpu, monkeypatch):
    """Large pageable arrays reach the GPU and come back through page-locked
    chunks (strided rows too), every byte, in the order of the stream."""
    from summa.device import staging
    _, backend = gpu
    cp = backend.xp
    used = []
    real = staging.stager_for
    monkeypatch.setattr(staging, "stager_for", lambda d: used.append(d) or real(d))
    x = rng.uniform(-1, 1, (4200, 2100))
    view = x[:, 7:2055]  # rows with a pitch, 69 MB
    for host in (x, view):
        dev = backend.asarray(host)
        dev *= 2  # on the current stream: after the upload
        assert np.array_equal(cp.asnumpy(dev), 2 * host)
        back = backend.to_host(dev)
        assert np.array_equal(back, 2 * host)
    assert len(used) == 4
    small = rng.uniform(-1, 1, (10, 10))
    assert np.array_equal(backend.to_host(backend.asarray(small)), small) and len(used) == 4


@pytest.mark.mpi(min_size=1)
def test_complex128_on_int8_tensor_cores(comm, rng, gpu):
    _, backend = gpu
    cp = backend.xp
    a = rng.uniform(-1, 1, (90, 70)) + 1j * rng.uniform(-1, 1, (90, 70))
    b = rng.standard_normal((70, 50)) + 1j * rng.standard_normal((70, 50))
    c0 = rng.uniform(-1, 1, (90, 50)) + 1j * rng.uniform(-1, 1, (90, 50))
    dc = cp.asarray(c0)
    backend.gemm(0.5 - 1j, cp.asarray(a), cp.asarray(b), dc, beta=2.0, precision="fp64-int8")
    assert gemm_scaled_error(cp.asnumpy(dc), a, b, c0, 0.5 - 1j, 2.0) <= 1


@pytest.mark.mpi(min_size=1)
def test_a_complex_fp64_int8_product_holds_what_the_plans_count(comm, rng, gpu):
    """A complex128 product on INT8 tensor cores, rows in chunks, holds at
    its peak no more than the plans count beside its operands (the parts,
    two real results and one real product's scratch): its four real
    products join C in place, no C-size temporaries; a C of NaN with beta
    0 is overwritten."""
    from summa.planning.tiling import ozaki_scratch
    from summa.precision import ozaki_gpu
    _, backend = gpu
    cp = backend.xp
    m, k, n, rows = 2048, 256, 1024, 64
    a = cp.asarray(rng.uniform(-1, 1, (m, k)) + 1j * rng.uniform(-1, 1, (m, k)))
    b = cp.asarray(rng.uniform(-1, 1, (k, n)) + 1j * rng.uniform(-1, 1, (k, n)))
    c = cp.full((m, n), np.nan, dtype=cp.complex128)
    pool = cp.get_default_memory_pool()
    cp.cuda.Device().synchronize()
    base, peak = pool.used_bytes(), [0]

    def malloc(size):
        memory = pool.malloc(size)
        peak[0] = max(peak[0], pool.used_bytes() - base)
        return memory
    cp.cuda.set_allocator(malloc)
    try:
        ozaki_gpu.gemm(0.5 - 1j, a, b, c, beta=0.0, backend=backend,
                       scheme=ozaki_gpu.Scheme(rows=rows))
    finally:
        cp.cuda.set_allocator(pool.malloc)
    counted = ozaki_scratch(m, n, k, True, rows)
    assert 0 < peak[0] <= counted + (1 << 20)  # vectors of exponents and norms besides
    assert gemm_scaled_error(cp.asnumpy(c), cp.asnumpy(a), cp.asnumpy(b), alpha=0.5 - 1j) <= 1


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("k", [1, 13, 31, 32])
def test_fp64_int8_short_sums_run_native_within_the_gauge_and_refuse_inf(comm, rng, gpu, k):
    """Below K_NATIVE terms the backend's fp64-int8 product is native
    float64's (within the gauge, where the scaling's rounding is not); from
    it on the INT8 one; Inf refused either way."""
    from summa.precision import ozaki, ozaki_gpu
    _, backend = gpu
    cp = backend.xp
    a, b = rng.uniform(-1, 1, (70, k)), rng.uniform(-1, 1, (k, 45))
    c0 = rng.uniform(-1, 1, (70, 45))
    dc = cp.asarray(c0)
    backend.gemm(1.5, cp.asarray(a), cp.asarray(b), dc, beta=0.5, precision="fp64-int8")
    assert gemm_scaled_error(cp.asnumpy(dc), a, b, c0, 1.5, 0.5) <= 1
    native = cp.asarray(c0)
    backend.gemm(1.5, cp.asarray(a), cp.asarray(b), native, beta=0.5)
    assert bool((dc == native).all()) == (k < ozaki.K_NATIVE)
    b[0, 3] = np.inf
    with pytest.raises(ValueError, match="finite inputs"):
        backend.gemm(1.0, cp.asarray(a), cp.asarray(b), dc, beta=0.0, precision="fp64-int8")
    with ozaki_gpu.checked_later() as checks:
        backend.gemm(1.0, cp.asarray(a), cp.asarray(b), dc, beta=0.0, precision="fp64-int8")
    assert not checks.finite()


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("planes", ["1", "2", "3"])
def test_fp64_int8_folds_in_groups_of_any_size_give_the_same_product(comm, rng, gpu, planes):
    """Folds of the integer products in groups of any size: the same product
    as the CPU's."""
    from summa.precision import ozaki, ozaki_gpu
    _, backend = gpu
    cp = backend.xp
    a, b = rng.uniform(-1, 1, (257, 300)), rng.standard_normal((300, 130))
    dc = cp.empty((257, 130))
    ozaki_gpu.gemm(1.0, cp.asarray(a), cp.asarray(b), dc, backend=backend,
                   scheme=ozaki_gpu.Scheme(planes=int(planes)))
    want = ozaki.gemm_int8(a, b)
    assert np.all(np.abs(cp.asnumpy(dc) - want) <= 2 * np.spacing(np.abs(want)))


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("rows", ["64", "100", "257", "1000"])
def test_fp64_int8_rows_in_chunks_are_the_whole_product_on_the_gpu(comm, rng, gpu, monkeypatch,
                                                                   rows):
    """Scheme(rows=r): A's and C's rows r at a time (a ragged last chunk, one
    chunk, r past m) give the whole product's bits, into a C with a pitch
    and into one whose rows are not contiguous (the finish pass); the
    backend's fp64-int8 GEMM hands its scheme on."""
    from summa.precision import ozaki_gpu
    _, backend = gpu
    cp = backend.xp
    scheme = ozaki_gpu.Scheme(rows=int(rows))
    a, b = rng.uniform(-1, 1, (257, 300)), rng.standard_normal((300, 130))
    c0 = rng.uniform(-1, 1, (257, 130))
    da, db = cp.asarray(a), cp.asarray(b)
    whole = cp.asarray(c0)
    ozaki_gpu.gemm(1.5, da, db, whole, beta=-0.5, backend=backend)
    pitched = cp.zeros((257, 136))[:, :130]
    pitched[...] = cp.asarray(c0)
    ozaki_gpu.gemm(1.5, da, db, pitched, beta=-0.5, backend=backend, scheme=scheme)
    # (rows not contiguous: the finish pass, whose rounding is its own, so
    # compared with the same pass over the whole)
    columns, whole_columns = (cp.asfortranarray(cp.asarray(c0)) for _ in range(2))
    ozaki_gpu.gemm(1.5, da, db, columns, beta=-0.5, backend=backend, scheme=scheme)
    ozaki_gpu.gemm(1.5, da, db, whole_columns, beta=-0.5, backend=backend)
    assert cp.array_equal(pitched, whole) and cp.array_equal(columns, whole_columns)
    for c in (whole, whole_columns):
        assert gemm_scaled_error(cp.asnumpy(c), a, b, c0, 1.5, -0.5) <= 1
    seen, real = [], ozaki_gpu.gemm
    monkeypatch.setattr(ozaki_gpu, "gemm", lambda *args, **kwargs: (
        seen.append(kwargs["scheme"]), real(*args, **kwargs)))
    dc = cp.empty((257, 130))
    backend.gemm(1.0, da, db, dc, beta=0.0, precision="fp64-int8", scheme=scheme)
    assert seen == [scheme] and gemm_scaled_error(cp.asnumpy(dc), a, b) <= 1


@pytest.mark.mpi(min_size=1)
def test_fp64_int8_out_of_core_in_chunks_of_rows(comm, rng, gpu, monkeypatch):
    """An out-of-core fp64-int8 sweep whose tiles' products fit only in
    chunks of rows (FP64_INT8_ROWS made small): the plan's rows, the
    product within the gauge."""
    from summa.device.backend import NumpyBackend
    from summa.execution.outofcore import SweepOperands, summa_out_of_core
    from summa.planning import tiling
    grid, backend = gpu
    monkeypatch.setattr(tiling, "FP64_INT8_ROWS", 64)
    m, k, n = 900, 512, 400
    a, b = rng.uniform(-1, 1, (m, k)), rng.standard_normal((k, n))
    host = NumpyBackend()
    A, B = DistMatrix.from_global(a, grid, host), DistMatrix.from_global(b, grid, host)
    C = DistMatrix.zeros((m, n), "float64", grid, host)
    plan = held_plan(A, B, C, backend, device_memory=1_400_000, panel_width=128,
                     precision="fp64-int8")
    stats = summa_out_of_core(plan, SweepOperands(A, B, C), backend)
    # (on 1 to 4 ranks; 6 ranks' staged slots, ipc, leave room for no tile's rows)
    assert stats.extra["plan"]["memory"]["int8_rows"] or grid.size > 4
    c = C.gather()
    if comm.rank == 0:
        assert gemm_scaled_error(c, a, b) <= 1


@pytest.mark.mpi(min_size=1)
def test_large_npy_blocks_go_straight_between_the_file_and_the_gpu(comm, rng, gpu, tmp_path_factory,
                                                                   monkeypatch):
    """A GPU's block of a large .npy file is read by the copy threads from the
    file's map into page-locked chunks, and written back the same way: the
    values arrive and the file is what NumPy saves."""
    from summa.host import filemaps
    grid, backend = gpu
    folder = comm.bcast(str(tmp_path_factory.mktemp("npy")) if comm.rank == 0 else None)
    # each rank's block 72 MB, past the staged copies' least (cupy_backend.STAGED_MIN)
    x = rng.uniform(-1, 1, (3000 * grid.size, 3000))
    x = comm.bcast(x)
    if comm.rank == 0:
        np.save(f"{folder}/X.npy", x)
    comm.Barrier()
    # The copy threads find the file behind the block (they read its rows, or,
    # where the rows lie apart and all in the page cache, copy through the map:
    # a grid of several columns, the file just written)
    found = []
    real = filemaps.find

    def find(view, writable=False):
        rows = real(view, writable)
        found.append(rows is not None and not writable)
        return rows
    monkeypatch.setattr(filemaps, "find", find)
    M = DistMatrix.from_npy(f"{folder}/X.npy", grid, backend)
    assert any(found)  # from the file itself
    got = M.gather()
    if comm.rank == 0:
        assert np.array_equal(got, x)
    M.local *= 2
    M.to_npy(f"{folder}/Y.npy")
    if comm.rank == 0:
        assert np.array_equal(np.load(f"{folder}/Y.npy"), 2 * x)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dtype", ["float64", "complex128"])
@pytest.mark.parametrize("order", ["C", "F"])
def test_npy_blocks_lying_by_columns_go_up_as_file_rows(comm, rng, gpu, tmp_path_factory,
                                                       monkeypatch, dtype, order):
    """A GPU's block that lies by columns in its file (a Fortran-ordered file
    read as it is, a C-ordered one transposed) goes up as the file's rows
    and is transposed on the device, a strip at a time (no transposing
    gather on the host: the copy threads read rows of the file); every op,
    values as NumPy reads them."""
    from summa.device import cupy_backend
    from summa.host import filemaps, matrixfiles
    grid, backend = gpu
    monkeypatch.setattr(cupy_backend, "STAGED_MIN", 1 << 12)  # small blocks staged too
    monkeypatch.setattr(matrixfiles, "TRANSPOSE_STRIP", 96)  # several strips and a remainder
    folder = comm.bcast(str(tmp_path_factory.mktemp("npyf")) if comm.rank == 0 else None)
    x = comm.bcast(random_array(rng, (430, 370), dtype))
    if comm.rank == 0:
        np.save(f"{folder}/X.npy", np.asfortranarray(x) if order == "F" else x)
    comm.Barrier()
    rows_read = []
    real = filemaps.find

    def find(view, writable=False):
        rows_read.append(view.strides[1] == view.itemsize)
        return real(view, writable)
    monkeypatch.setattr(filemaps, "find", find)
    for trans, want in (("N", x), ("T", x.T), ("H", x.conj().T)):
        rows_read.clear()
        M = DistMatrix.from_npy(f"{folder}/X.npy", grid, backend, trans=trans)
        assert M.local.flags.c_contiguous
        assert rows_read and all(rows_read), trans  # only rows of the file went up
        got = M.gather()
        if comm.rank == 0:
            assert np.array_equal(got, want), trans


@pytest.mark.parametrize("dtype", ["float64", "complex64", "float16"])
def test_a_device_transpose_writes_a_strip_of_columns(rng, dtype):
    """The device transpose into columns of a wider array (its rows apart)
    leaves the other columns as they were."""
    gpu_backend = get_backend("cupy")
    cp = gpu_backend.xp
    x = cp.asarray(random_array(rng, (5, 7), dtype))
    wide = cp.full((7, 12), 3, dtype=dtype)
    for conj in (False, True):
        gpu_backend.transpose(x, wide[:, 4:9], conj)
        want = x.T.conj() if conj else x.T
        assert bool((wide[:, 4:9] == want).all()) and bool((wide[:, :4] == 3).all())
        assert bool((wide[:, 9:] == 3).all())


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "complex64", "complex128"])
def test_finite_probe_finds_every_nan_and_inf_and_only_them(comm, gpu, dtype):
    _, backend = gpu
    cp = backend.xp
    rng = np.random.default_rng(comm.rank)
    x = cp.asarray(random_array(rng, (300, 200), dtype))
    assert backend.all_finite(x) and backend.probed_finite(backend.finite_probe(x))
    for bad in (np.nan, np.inf, -np.inf):
        y = x.copy()
        y[int(rng.integers(300)), int(rng.integers(200))] = bad
        assert not backend.probed_finite(backend.finite_probe(y))
        assert not backend.all_finite(y) and not backend.all_finite(y[:, 3:])  # a view too
    if dtype == "float64":  # finite, but |x| sums past the range: all_finite asks again
        huge = cp.full((4, 4), 1e308)
        assert not backend.probed_finite(backend.finite_probe(huge))
        assert backend.all_finite(huge)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("out_of_core", [False, True])
def test_summa_on_int8_refuses_inf_on_every_rank_at_the_end(comm, rng, gpu, out_of_core):
    """fp64-int8 through SUMMA checks its inputs as the products go and
    refuses Inf/NaN once, on every rank (no host synchronisation per panel)."""
    grid, backend = gpu
    a, b = rng.uniform(-1, 1, (300, 260)), rng.uniform(-1, 1, (260, 200))
    a[299, 259] = np.inf  # in the last panel of the last rank's rows
    with pytest.raises(ValueError, match="finite inputs"):
        if out_of_core:
            matmul(a if comm.rank == 0 else None, b if comm.rank == 0 else None, comm=comm,
                   precision="fp64-int8", panel_width=64)
        else:
            A = DistMatrix.from_global(a, grid, backend)
            B = DistMatrix.from_global(b, grid, backend)
            matmul(A, B, precision="fp64-int8", panel_width=64)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("missing", ["algorithm", "library"])
def test_int8_products_fall_back_to_gemmex_where_cublaslt_cannot(comm, gpu, monkeypatch, missing):
    """By default a product cuBLASLt cannot make (no algorithm for the shape,
    as on older GPUs, or no library) goes through gemmEx, the same bits;
    asked by name (SUMMA_INT8_GEMM=cublaslt) it is one clear error."""
    from summa.device import base, lt
    _, backend = gpu
    cp = backend.xp
    a8 = cp.random.randint(-128, 128, (1024, 1024), dtype=cp.int8)
    bt8 = cp.random.randint(-128, 128, (1024, 1024), dtype=cp.int8)
    want, got = (cp.empty((1024, 1024), dtype=cp.int32) for _ in range(2))
    monkeypatch.setattr(backend, "options", backend.options.replace(int8_gemm="gemmex"))
    backend.int8_gemm_tn(a8, bt8, want)
    monkeypatch.setattr(base, "INT8_LT_MACS", 1 << 30)  # this product is cuBLASLt's
    if missing == "algorithm":
        monkeypatch.setattr(lt.LtGemm, "_candidates", lambda *args: [])
    else:
        def nothing(*args):
            raise lt.Unavailable("cuBLASLt (libcublasLt.so) was not found")
        monkeypatch.setattr(lt, "_library", nothing)
    monkeypatch.setattr(backend, "_int8_lt", None)
    monkeypatch.setattr(backend, "options", backend.options.replace(int8_gemm="auto"))
    for _ in range(2):
        got.fill(0)
        backend.int8_gemm_tn(a8, bt8, got)
        assert bool((got == want).all())
    monkeypatch.setattr(backend, "_int8_lt", None)
    monkeypatch.setattr(backend, "options", backend.options.replace(int8_gemm="cublaslt"))
    with pytest.raises(lt.Unavailable, match="cuBLASLt"):
        backend.int8_gemm_tn(a8, bt8, got)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("index", [None, 1])
def test_cublaslt_int8_products_are_gemmex_bits_on_large_shapes(comm, gpu, monkeypatch,
                                                               tmp_path, index):
    """SUMMA_INT8_GEMM=cublaslt (its timed choice, or the heuristic's index-th):
    on a product as large as those it is for (32768 x 32768 output) the same
    int32 bits as gemmEx, remembered choice included."""
    _, backend = gpu
    cp = backend.xp
    m = n = 32768
    k = 256
    a8 = cp.random.randint(-128, 128, (m, k), dtype=cp.int8)
    bt8 = cp.random.randint(-128, 128, (n, k), dtype=cp.int8)
    want = cp.empty((m, n), dtype=cp.int32)
    monkeypatch.setattr(backend, "options", backend.options.replace(int8_gemm="gemmex"))
    backend.int8_gemm_tn(a8, bt8, want)
    monkeypatch.setenv("SUMMA_CACHE_DIR", str(tmp_path))
    asked = "cublaslt" + ("" if index is None else f":{index}")
    monkeypatch.setattr(backend, "options", backend.options.replace(int8_gemm=asked))
    for _ in range(2):  # timed (or taken) once, then the plan's
        got = cp.zeros((m, n), dtype=cp.int32)
        backend.int8_gemm_tn(a8, bt8, got)
        assert bool((got == want).all())
    del got, want


# -- arrays on a GPU given to summa.matmul (summa/api/arrayview.py, operands.py) -----------

def _no_host_path(monkeypatch):
    """Fail the call where it goes through the host plan (run_arrays)."""
    from summa.execution import arrays as planned

    def refuse(*args, **kwargs):
        raise AssertionError("GPU operands went through host memory")
    monkeypatch.setattr(planned, "run_arrays", refuse)


def _op_shape(shape, trans):
    return shape if trans == "N" else shape[::-1]


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "complex64", "complex128"])
@pytest.mark.parametrize("trans", [("N", "N"), ("T", "N"), ("N", "H"), ("H", "T")])
def test_cupy_operands_are_one_gemm_on_their_gpu_and_come_back_as_cupy(rng, monkeypatch, dtype,
                                                                       trans):
    import cupy
    import summa
    from summa.execution.algorithm import SummaStats
    _no_host_path(monkeypatch)
    m, n, k = 67, 45, 130
    a = random_array(rng, _op_shape((m, k), trans[0]), dtype)
    b = random_array(rng, _op_shape((k, n), trans[1]), dtype)
    stats = SummaStats()
    c = summa.matmul(cupy.asarray(a), cupy.asarray(b), trans_a=trans[0], trans_b=trans[1],
                     alpha=0.5, stats=stats)
    assert isinstance(c, cupy.ndarray) and c.device.id == cupy.cuda.Device().id
    assert stats.extra["plan"]["placement"] == {"where": "device", "device": c.device.id,
                                                "held": a.nbytes + b.nbytes, "copies": 0,
                                                "into_out": False, "fetched": False}
    assert gemm_scaled_error(cupy.asnumpy(c), a, b, alpha=0.5, trans_a=trans[0],
                             trans_b=trans[1]) <= 1


def test_cupy_operands_on_another_gpu_are_multiplied_there_and_the_current_gpu_stays(
        rng, monkeypatch):
    import cupy
    import summa
    if cupy.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs two GPUs")
    _no_host_path(monkeypatch)
    a, b = random_array(rng, (50, 40), "float64"), random_array(rng, (40, 30), "float64")
    with cupy.cuda.Device(1):
        da, db = cupy.asarray(a), cupy.asarray(b)
    with cupy.cuda.Device(0):
        c = summa.matmul(da, db)
        assert cupy.cuda.runtime.getDevice() == 0
    assert c.device.id == 1 and gemm_scaled_error(cupy.asnumpy(c), a, b) <= 1
    with pytest.raises(ValueError, match="a is on GPU 1 and b on GPU 0"):
        summa.matmul(da, cupy.asarray(b))


def test_cupy_operands_go_into_a_cupy_out_as_it_lies(rng, monkeypatch):
    import cupy
    import summa
    _no_host_path(monkeypatch)
    a, b = random_array(rng, (30, 20), "float32"), random_array(rng, (20, 10), "float32")
    out = cupy.empty((30, 10), dtype=cupy.float32)
    assert summa.matmul(cupy.asarray(a), cupy.asarray(b), out=out) is out
    assert gemm_scaled_error(cupy.asnumpy(out), a, b) <= 1
    wide = cupy.full((30, 14), 7.0, dtype=cupy.float32)  # a strip of columns: rows strided
    assert summa.matmul(cupy.asarray(a), cupy.asarray(b), out=wide[:, 2:12]) is not None
    assert gemm_scaled_error(cupy.asnumpy(wide[:, 2:12]), a, b) <= 1
    assert bool((wide[:, :2] == 7).all()) and bool((wide[:, 12:] == 7).all())


@pytest.mark.parametrize("dtype,precision", [("float64", "fp64-int8"),
                                             ("complex128", "fp64-int8"), ("float32", "tf32")])
def test_cupy_operands_take_the_precision_asked_for(rng, monkeypatch, dtype, precision):
    import cupy
    import summa
    _no_host_path(monkeypatch)
    a, b = random_array(rng, (300, 257), dtype), random_array(rng, (257, 130), dtype)
    c = summa.matmul(cupy.asarray(a), cupy.asarray(b), precision=precision)
    assert gemm_scaled_error(cupy.asnumpy(c), a, b, precision=precision) <= 1


def test_one_operand_on_the_gpu_uploads_the_other_and_the_product_stays_there(rng,
                                                                              monkeypatch):
    import cupy
    import summa
    from summa.execution.algorithm import SummaStats
    _no_host_path(monkeypatch)
    a, b = random_array(rng, (40, 33), "float64"), random_array(rng, (33, 21), "float64")
    stats = SummaStats()
    c = summa.matmul(a, cupy.asarray(b), stats=stats)
    assert isinstance(c, cupy.ndarray)
    assert stats.extra["plan"]["placement"]["where"] == "mixed"
    assert gemm_scaled_error(cupy.asnumpy(c), a, b) <= 1


@pytest.mark.parametrize("into_out", [False, True])
def test_cupy_operands_beyond_the_device_budget_go_through_host_memory(rng, into_out):
    import cupy
    import summa
    from summa.execution.algorithm import SummaStats
    a, b = random_array(rng, (1024, 1024), "float64"), random_array(rng, (1024, 512), "float64")
    out = cupy.empty((1024, 512)) if into_out else None
    stats = SummaStats()
    # the operands alone (12 MiB) are beyond 10 MiB: out of core, through host memory
    c = summa.matmul(cupy.asarray(a), cupy.asarray(b), device_memory="10MiB", out=out,
                     stats=stats)
    plan = stats.extra["plan"]
    assert plan["placement"]["fetched"] and "copied to host memory" in plan["note"]
    assert plan["out_of_core"]
    assert isinstance(c, cupy.ndarray) and (c is out if into_out else True)
    assert gemm_scaled_error(cupy.asnumpy(c), a, b) <= 1


@pytest.mark.parametrize("dtype", ["float64", "complex128"])
def test_one_c_tile_at_a_time_waits_for_each_write_back(rng, monkeypatch, dtype):
    """A cut asked for that fits one C tile on the device at a time: each
    tile's first GEMM waits for the last tile's write-back out of the same
    buffer (zeroing it early would send zeros or a mix home)."""
    import summa
    from summa.execution.algorithm import SummaStats
    monkeypatch.setenv("SUMMA_OOC_TILES", "3x1")
    a, b = random_array(rng, (1536, 256), dtype), random_array(rng, (256, 1200), dtype)
    item = np.dtype(dtype).itemsize
    tile = 512 * 1200 * item  # two of them do not fit the budget, one does
    stats = SummaStats()
    c = summa.matmul(a, b, device_memory=tile + (tile * 3) // 4, panel_width=32,
                     backend="cupy", stats=stats)
    memory = stats.extra["plan"]["memory"]
    assert memory["tiles"] == [3, 1] and memory["c_buffers"] == 1, memory
    assert gemm_scaled_error(c, a, b) <= 1


def test_a_product_made_in_host_memory_that_cannot_go_back_stays_there(rng, monkeypatch):
    import cupy
    import summa
    from summa.api import operands
    monkeypatch.setattr(operands, "_to_device", lambda *args: None)  # as if the GPU were full
    a = random_array(rng, (512, 512), "float64")
    with pytest.warns(RuntimeWarning, match="returned in host memory"):
        c = summa.matmul(cupy.asarray(a), cupy.asarray(a), out_of_core=True)
    assert type(c) is np.ndarray and gemm_scaled_error(c, a, a) <= 1


@pytest.mark.parametrize("make,match", [
    (lambda cp: (cp.full((4, 4), 2**30, dtype=cp.int64),) * 2, "may reach 2\\*\\*62.0"),
    (lambda cp: (cp.ones((4, 5)), cp.ones((4, 5))), "inner dimensions"),
    (lambda cp: (cp.ones((4, 4)), cp.ones((4, 4)), np.empty((4, 4))), "out is in host memory"),
    (lambda cp: (cp.ones((4, 4)), cp.ones((4, 4)), cp.empty((4, 5))), "out is"),
    (lambda cp: (cp.ones((4, 4)), cp.ones((4, 4)), cp.ones((4, 4), dtype=cp.float32)),
     "out is"),
])
def test_unusable_gpu_operands_are_refused_with_one_clear_error(make, match):
    import cupy
    import summa
    a, b, *out = make(cupy)
    with pytest.raises(ValueError, match=match):
        summa.matmul(a, b, out=out[0] if out else None)


def test_gpu_integers_multiply_exactly_there_as_numpy_does(rng, monkeypatch):
    """CuPy integer and boolean operands: NumPy's product exactly, in NumPy's
    type, a CuPy array on their GPU (never through host memory); a tf32
    precision is refused for them."""
    import cupy
    import summa
    _no_host_path(monkeypatch)
    cases = [(rng.integers(-2**20, 2**20, (40, 33)), rng.integers(-99, 99, (33, 21)), "int32"),
             (rng.integers(0, 256, (40, 33)), rng.integers(0, 256, (33, 21)), "uint8"),
             (rng.uniform(size=(40, 33)) < 0.2, rng.uniform(size=(33, 21)) < 0.2, "bool")]
    for x, y, db in cases:
        x, y = x.astype(np.int64) if x.dtype != bool else x, y.astype(db)
        c = summa.matmul(cupy.asarray(x), cupy.asarray(y))
        assert isinstance(c, cupy.ndarray) and c.dtype == (x @ y).dtype, db
        assert np.array_equal(cupy.asnumpy(c), x @ y), db
    with pytest.raises(ValueError, match="precision='tf32' does not apply"):
        summa.matmul(cupy.asarray(x), cupy.asarray(y), precision="tf32")
    s, t = rng.integers(-99, 99, (3, 40, 33)), rng.integers(-99, 99, (33, 21)).astype(np.int16)
    c = summa.matmul(cupy.asarray(s), cupy.asarray(t))  # a stack, converted once on the GPU
    assert isinstance(c, cupy.ndarray) and c.dtype == np.int64
    assert np.array_equal(cupy.asnumpy(c), s @ t)
    floats = [cupy.asarray(v.astype(np.float64)) for v in (x, y)]
    with summa.Matmul(*floats, precision="fp64-int8") as m:
        with pytest.raises(ValueError, match="does not apply to integer operands.*this Matmul was planned"):
            m.execute(cupy.asarray(x), cupy.asarray(y))


@pytest.mark.parametrize("da,db", [("int32", "int32"), ("int16", "int16"), ("uint8", "int64"),
                                   ("bool", "bool")])
def test_host_integers_stream_through_the_gpu_as_numpy_multiplies_them(rng, da, db):
    """NumPy integer operands out of core on the GPU, in tiles, converted as
    the copy threads stage them (the plan's ``host_integers``): NumPy's
    product exactly, in NumPy's type (int16's wraps), from a strided view
    into a strided ``out``."""
    import summa

    def drawn(dtype, shape):
        if dtype == "bool":
            return rng.uniform(size=shape) < 0.3
        high = 30000 if dtype == "int16" else min(np.iinfo(dtype).max, 2**15)
        return rng.integers(0 if dtype[0] == "u" else -high, high, shape).astype(dtype)
    a, b = drawn(da, (1500, 2100))[:, ::2], drawn(db, (1050, 1400))
    want = a @ b
    if da == "int16":
        assert (np.abs(a.astype(np.float64) @ b.astype(np.float64)) > 2**15).any()  # wraps
    out = np.zeros((1500, 2800), want.dtype)[:, ::2]
    stats = summa.SummaStats()
    c = summa.matmul(a, b, out=out, device_memory="20MiB", panel_width=256, stats=stats)
    assert c is out and np.array_equal(c, want)
    plan = stats.extra["plan"]
    assert plan["host_integers"] and np.prod(plan["memory"]["tiles"]) > 1, plan["memory"]


@pytest.mark.parametrize("where", ["device", "mixed", "through host memory"])
def test_a_gpu_out_of_any_layout_gets_the_product(rng, monkeypatch, where):
    """A CuPy `out` the product cannot be written into where it lies (it is
    an operand, shares memory with one, its rows are not contiguous) is
    filled from a product of its own; a Fortran-ordered one takes the
    transposed product in place (the plan is n x m). On one GEMM where the
    operands lie (both there, or one uploaded) and through host memory."""
    import cupy
    import summa
    if where != "through host memory":
        _no_host_path(monkeypatch)
    # (2 KiB: less than the operands, so they go through host memory, out of core)
    kwargs = dict(device_memory="2KiB", panel_width=4) if where == "through host memory" \
        else {}
    x, y = random_array(rng, (12, 12), "float64"), random_array(rng, (12, 12), "float64")
    cases = {"out is a": lambda a, b: a, "out is b": lambda a, b: b,
             "out is a.T": lambda a, b: a.T,
             "Fortran": lambda a, b: cupy.zeros((12, 12), order="F"),
             "strided": lambda a, b: cupy.zeros((12, 24))[:, ::2],
             "reversed": lambda a, b: cupy.zeros((12, 12))[::-1, ::-1],
             "a view sharing a's memory": lambda a, b: cupy.zeros_like(a)[:, :]}
    for name, make in cases.items():
        a, b = cupy.asarray(x), cupy.asarray(y)
        if name == "a view sharing a's memory":  # a is the left half of a wider array
            wide = cupy.concatenate([a, cupy.zeros_like(a)], axis=1)
            a, out = wide[:, :12], wide[:, 12:]
        else:
            out = make(a, b)
        if where == "mixed" and name not in ("out is a", "out is a.T"):
            a = x.copy()
        stats = summa.SummaStats()
        c = summa.matmul(a, b, out=out, stats=stats, **kwargs)
        assert c is out, name
        assert gemm_scaled_error(cupy.asnumpy(c), x, y) <= 1, name
        fetched = stats.extra["plan"]["placement"]["fetched"]
        assert fetched == (where == "through host memory"), name
    m, n, k = 10, 7, 5
    a, b = random_array(rng, (m, k), "float64"), random_array(rng, (k, n), "float64")
    out = cupy.zeros((m, n), order="F")
    stats = summa.SummaStats()
    assert summa.matmul(cupy.asarray(a), cupy.asarray(b), out=out, stats=stats, **kwargs) is out
    assert gemm_scaled_error(cupy.asnumpy(out), a, b) <= 1
    assert stats.extra["plan"]["shape"] == [n, m, k]  # the transposed product, in place
    with summa.Matmul(cupy.asarray(a), cupy.asarray(b), **kwargs) as mm:
        out = cupy.zeros((m, n), order="F")  # a Matmul's execute fills it
        assert mm.execute(out=out) is out and gemm_scaled_error(cupy.asnumpy(out), a, b) <= 1


def test_gpu_operands_of_two_dtypes_multiply_there_in_their_common_type(rng, monkeypatch):
    """CuPy operands of two dtypes: the narrower one converted on its GPU,
    one GEMM there, the product of NumPy's common type; a host operand of
    the narrower type beside a GPU one is converted before it goes up."""
    import cupy
    import summa
    _no_host_path(monkeypatch)
    a, b = random_array(rng, (40, 30), "float32"), random_array(rng, (30, 20), "complex128")
    c = summa.matmul(cupy.asarray(a), cupy.asarray(b))
    assert isinstance(c, cupy.ndarray) and c.dtype == np.complex128
    assert gemm_scaled_error(cupy.asnumpy(c), a.astype(np.complex128), b) <= 1
    c = summa.matmul(a, cupy.asarray(b))  # mixed: a converted in host memory, then uploaded
    assert isinstance(c, cupy.ndarray) and c.dtype == np.complex128
    assert gemm_scaled_error(cupy.asnumpy(c), a.astype(np.complex128), b) <= 1


def test_a_stateful_matmul_of_cupy_operands_is_one_gemm_each_time(rng, monkeypatch):
    import cupy
    import summa
    _no_host_path(monkeypatch)
    a, b = random_array(rng, (60, 50), "float64"), random_array(rng, (50, 40), "float64")
    with summa.Matmul(cupy.asarray(a), cupy.asarray(b), alpha=2.0) as m:
        assert m.plan.placement.resident and m.plan.memory.mode == "on-device"
        assert gemm_scaled_error(cupy.asnumpy(m.execute()), a, b, alpha=2.0) <= 1
        a2 = random_array(rng, (60, 50), "float64")
        c = m.execute(cupy.asarray(a2), cupy.asarray(b))
        assert gemm_scaled_error(cupy.asnumpy(c), a2, b, alpha=2.0) <= 1
        with pytest.raises(ValueError, match="planned one GEMM on GPU"):
            m.execute(a2, b)
        if cupy.cuda.runtime.getDeviceCount() > 1:  # a GPU this Matmul does not use
            other = (m.plan.placement.device + 1) % cupy.cuda.runtime.getDeviceCount()
            with cupy.cuda.Device(other):
                elsewhere = cupy.asarray(a2), cupy.asarray(b)
            with pytest.raises(ValueError, match=f"these lie on GPU {other}"):
                m.execute(*elsewhere)


@pytest.mark.mpi(min_size=1)
def test_cupy_operands_on_the_root_of_a_grid(comm, rng, gpu):
    """On one rank one GEMM where they lie; on several the root's GPU
    operands go through host memory, and the product comes back to its GPU."""
    import cupy
    from summa.execution.algorithm import SummaStats
    root = comm.Get_size() - 1
    a, b = random_array(rng, (70, 45), "float64"), random_array(rng, (45, 52), "float64")
    mine = comm.rank == root
    stats = SummaStats()
    c = matmul(cupy.asarray(a) if mine else None, cupy.asarray(b) if mine else None,
               comm=comm, root=root, stats=stats)
    if mine:
        assert isinstance(c, cupy.ndarray) and c.device.id == cupy.cuda.Device().id
        assert gemm_scaled_error(cupy.asnumpy(c), a, b) <= 1
        assert stats.extra["plan"]["placement"]["fetched"] == (comm.Get_size() > 1)
    else:
        assert c is None


def _torch_on_gpu():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no GPU")
    return torch


@pytest.mark.parametrize("trans", ["N", "T"])
def test_torch_cuda_tensors_in_are_torch_cuda_tensors_out(rng, monkeypatch, trans):
    import summa
    torch = _torch_on_gpu()
    _no_host_path(monkeypatch)
    a, b = random_array(rng, (64, 48), "float32"), random_array(rng, (48, 64), "float32")
    ta, tb = torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda()
    c = summa.matmul(ta, tb, trans_a=trans, trans_b=trans)
    assert isinstance(c, torch.Tensor) and c.device == ta.device
    assert gemm_scaled_error(c.cpu().numpy(), a, b, trans_a=trans, trans_b=trans) <= 1
    with pytest.raises(ValueError, match="a .*torch"):
        summa.matmul(ta.clone().requires_grad_(), tb)


def test_gpu_stacks_are_one_gemm_a_pair_and_come_back_as_the_callers_kind(rng, monkeypatch):
    """Stacks of CuPy arrays multiply on their GPU (never through host
    memory), the result a CuPy array there; a host stack beside a GPU matrix
    comes back on the GPU; torch CUDA stacks come back as a torch tensor
    (where torch sees the GPU)."""
    import cupy
    import summa
    _no_host_path(monkeypatch)
    a, b = random_array(rng, (3, 40, 24), "float64"), random_array(rng, (24, 16), "float64")
    c = summa.matmul(cupy.asarray(a), cupy.asarray(b))
    assert isinstance(c, cupy.ndarray) and c.shape == (3, 40, 16)
    assert max(gemm_scaled_error(cupy.asnumpy(c[i]), a[i], b) for i in range(3)) <= 1
    out = cupy.empty((3, 16, 40), order="C").transpose(0, 2, 1)  # each matrix Fortran-ordered
    assert summa.matmul(cupy.asarray(a), cupy.asarray(b), out=out) is out
    assert max(gemm_scaled_error(cupy.asnumpy(out[i]), a[i], b) for i in range(3)) <= 1
    c = summa.matmul(a, cupy.asarray(b))  # mixed: the product on b's GPU
    assert isinstance(c, cupy.ndarray)
    assert max(gemm_scaled_error(cupy.asnumpy(c[i]), a[i], b) for i in range(3)) <= 1
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        c = summa.matmul(torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda())
        assert isinstance(c, torch.Tensor) and c.is_cuda and tuple(c.shape) == (3, 40, 16)
        assert max(gemm_scaled_error(c[i].cpu().numpy(), a[i], b) for i in range(3)) <= 1


class _LazyCudaTensor:
    """A torch CUDA tensor as summa meets it, without torch: DLPack on the
    GPU, and the conjugate bit (``t.conj()``), under which DLPack refuses."""

    __module__ = "torch_stand_in"
    ndim = 2

    def __init__(self, data, conjugated=False):
        self.data, self.conjugated = data, conjugated

    def __dlpack__(self, **kwargs):
        if self.conjugated:
            raise BufferError("Can't export tensors with the conjugate bit set")
        return self.data.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.data.__dlpack_device__()

    def is_conj(self) -> bool:
        return self.conjugated

    def conj(self):
        return _LazyCudaTensor(self.data, not self.conjugated)

    @property
    def mT(self):
        return _LazyCudaTensor(self.data.T, self.conjugated)


@pytest.mark.parametrize("trans", ["N", "T", "H"])
def test_a_lazy_conjugate_on_the_gpu_is_multiplied_where_it_lies(rng, monkeypatch, trans):
    """torch's ``t.conj()`` / ``t.mH`` on a GPU: its conjugation is the
    GEMM's op, its data read in place (no trip through host memory)."""
    import cupy
    import summa
    _no_host_path(monkeypatch)
    a, b = random_array(rng, (40, 40), "complex64"), random_array(rng, (40, 24), "complex64")
    c = summa.matmul(_LazyCudaTensor(cupy.asarray(a), True), cupy.asarray(b), trans_a=trans)
    assert isinstance(c, cupy.ndarray)
    assert gemm_scaled_error(cupy.asnumpy(c), np.conj(a), b, trans_a=trans) <= 1


def test_torch_lazy_conjugates_on_each_device_multiply_as_torch_does(rng):
    """``t.mH @ t`` and ``t.conj() @ t.mT`` with torch itself, where it is
    installed: on the CPU, and on the GPU where torch sees it (the product
    a tensor on the operands' device)."""
    import summa
    torch = pytest.importorskip("torch")
    x = random_array(rng, (30, 20), "complex128")
    for device in ["cpu"] + (["cuda"] if torch.cuda.is_available() else []):
        t = torch.from_numpy(x).to(device)
        for got, (a, ta, tb) in ((summa.matmul(t.mH, t), (x, "H", "N")),
                                 (summa.matmul(t.conj(), t.mT), (np.conj(x), "N", "T"))):
            assert isinstance(got, torch.Tensor) and got.device.type == device
            assert gemm_scaled_error(got.cpu().numpy(), a, x, trans_a=ta, trans_b=tb) <= 1


def test_torch_cpu_tensors_in_are_torch_cpu_tensors_out(rng):
    import summa
    torch = pytest.importorskip("torch")
    a, b = random_array(rng, (30, 20), "float64"), random_array(rng, (20, 10), "float64")
    c = summa.matmul(torch.from_numpy(a), torch.from_numpy(b))
    assert isinstance(c, torch.Tensor) and c.device.type == "cpu"
    assert gemm_scaled_error(c.numpy(), a, b) <= 1
    out = torch.empty((30, 10), dtype=torch.float64)
    assert summa.matmul(torch.from_numpy(a), torch.from_numpy(b), out=out) is out
    assert gemm_scaled_error(out.numpy(), a, b) <= 1


def test_jax_gpu_arrays_in_are_jax_arrays_out(rng):
    import summa
    jax = pytest.importorskip("jax")
    try:
        device = jax.devices("gpu")[0]
    except RuntimeError:
        pytest.skip("JAX sees no GPU")
    a, b = random_array(rng, (32, 24), "float32"), random_array(rng, (24, 16), "float32")
    c = summa.matmul(jax.device_put(a, device), jax.device_put(b, device))
    assert isinstance(c, jax.Array)
    assert gemm_scaled_error(np.asarray(c), a, b) <= 1


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("la,lb", [("F", "op T"), ("T view", "op H"), ("op H", "op H of F"),
                                   ("strided", "reversed"), ("strided op T", "read-only F")])
@pytest.mark.parametrize("how", ["staged tiles", "lock", "in memory"])
def test_every_layout_goes_through_the_gpu_as_it_lies(comm, rng, monkeypatch, la, lb, how):
    """Fortran order, .T views, op T and H (complex: cuBLAS's op C, or a
    conjugate on the device), strided and reversed views: uploaded as they
    lie (columns as their transposes' rows, strided ones gathered by the
    copy threads into the page-locked chunks), out of core in several tiles
    (staged, or page-locked whole where they can be: SUMMA_HOST_COPIES=lock)
    and in memory, on every rank count."""
    import summa
    from summa.device import staging
    from test_layouts import _product
    # C's rows grow with the ranks: each rank's block is 300 x 500 on every grid,
    # so that 512 KiB never holds it whole (3 ranks held a 100 x 500 block at once)
    a, ta, xa, b, tb, xb = _product(rng, la, lb, shape=(300 * comm.size, 200, 500))
    kwargs = {"out_of_core": False} if how == "in memory" else {"device_memory": "512KiB"}
    if how == "lock":
        monkeypatch.setenv("SUMMA_HOST_COPIES", "lock")
    root = comm.Get_size() - 1
    mine = comm.rank == root
    saved = staging.CHUNK_BYTES
    staging.close_stagers()
    staging.CHUNK_BYTES = 16384  # several chunks a panel part
    try:
        stats = summa.SummaStats()
        c = summa.matmul(a if mine else None, b if mine else None, root=root, trans_a=ta,
                         trans_b=tb, alpha=0.5, panel_width=96, backend="cupy", stats=stats,
                         **kwargs)
    finally:
        staging.close_stagers()
        staging.CHUNK_BYTES = saved
    if how != "in memory":
        assert stats.extra["out_of_core"] and np.prod(stats.extra["tiles"]) > 1
    if mine:
        assert gemm_scaled_error(c, xa, xb, alpha=0.5) <= 1


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dtype,ta", [("float64", "T"), ("complex128", "H")])
def test_page_locked_fortran_operands_go_up_directly_by_columns(comm, rng, monkeypatch, dtype,
                                                                ta):
    """A page-locked Fortran-ordered operand (op T/H of it: by rows) and a
    page-locked one read by columns are copied directly (no staging chunk),
    as the rows of their transposes; op H by cuBLAS's op C."""
    import cupyx
    import summa
    from summa.device import staging
    x = random_array(rng, (400, 300), dtype)
    y = random_array(rng, (300, 200), dtype)
    a = cupyx.empty_pinned((300, 400), dtype=dtype, order="F")
    a[...] = x.conj().T if ta == "H" else x.T
    b = cupyx.empty_pinned((300, 200), dtype=dtype, order="F")
    b[...] = y
    out = cupyx.empty_pinned((400, 200), dtype=dtype)
    staged = []
    real = staging.Stager.upload
    monkeypatch.setattr(staging.Stager, "upload",
                        lambda self, *args: (staged.append(1), real(self, *args))[1])
    root = comm.Get_size() - 1
    mine = comm.rank == root
    c = summa.matmul(a if mine else None, b if mine else None, root=root, trans_a=ta,
                     out=out if mine else None, device_memory="2MiB", panel_width=64,
                     backend="cupy")
    if comm.Get_size() == 1:
        assert staged == []  # every copy direct, from the arrays as they lie
    if mine:
        assert c is out and gemm_scaled_error(c, x, y) <= 1


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("la,lb", [("F", "op T"), ("op H", "op H of F"), ("strided", "C")])
def test_fp64_int8_takes_every_layout(comm, rng, la, lb):
    """float64 on INT8 tensor cores from operands lying any way (column-major
    device parts, conjugated ones made C-ordered on the device first)."""
    import summa
    from test_layouts import _product
    a, ta, xa, b, tb, xb = _product(rng, la, lb, shape=(300, 200, 500),
                                    dtype="complex128" if "H" in la + lb else "float64")
    if not comm.bcast(_int8_capable(), root=0):
        pytest.skip("no INT8 tensor cores")
    root = comm.Get_size() - 1
    mine = comm.rank == root
    c = summa.matmul(a if mine else None, b if mine else None, root=root, trans_a=ta,
                     trans_b=tb, device_memory="16MiB", panel_width=128, backend="cupy",
                     precision="fp64-int8")
    if mine:
        assert gemm_scaled_error(c, xa, xb) <= 1


def _int8_capable() -> bool:
    return get_backend("cupy").has_int8_tensor_cores()


def _with_empty_kernel_cache(kernels, script: str, *args, **env) -> str:
    """The stdout of `script` run with `args` in a fresh process whose CuPy
    kernel cache is the empty folder `kernels` (`env`: more variables)."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    env = dict(os.environ, CUPY_CACHE_DIR=str(kernels),
               PYTHONPATH=str(Path(__file__).resolve().parent.parent), **env)
    done = subprocess.run([sys.executable, "-c", script, *args], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


_FIRST_CALLS = """
import sys, numpy as np, summa
from summa.execution.algorithm import SummaStats
rng = np.random.default_rng()
a, b = rng.uniform(-1, 1, (300, 200)), rng.uniform(-1, 1, (200, 100))
seconds = []
for call in range(2):
    stats = SummaStats()
    c = summa.matmul(a, b, precision="fp64-int8", backend="cupy", stats=stats)
    assert np.abs(c - a @ b).max() <= 1e-12 * 200, "wrong product"
    seconds.append(stats.extra["compile_seconds"])
print(*seconds)
"""


def test_the_scaling_reductions_match_numpy_on_every_layout(rng):
    """The CUDA reductions of fp64-int8's scaling (summa/precision/kernels.py,
    reduce_inner and reduce_outer) on the layouts the products meet: the
    largest magnitudes bit for bit (Inf for Inf/NaN), the scaled norms within
    rounding of NumPy's (another order of the sums); and on a large panel, both
    ways of storing it."""
    import cupy
    from summa.precision import kernels
    big = rng.standard_normal((3000, 2100))
    cases = reduction_cases(rng) + [("large", big, 1), ("large", big, 0),
                                    ("large F", np.asfortranarray(big), 0)]
    for label, x, axis in cases:
        largest, norm = expected_reductions(x, axis)
        dx = cupy.asarray(x) if label not in ("strided", "imag", "1-D strided") else \
            _device_view(cupy, x)
        got = kernels.kernel("amax")(dx, axis=axis)
        assert np.array_equal(cupy.asnumpy(got), largest), label
        if axis is not None:
            scaled = cupy.asnumpy(kernels.kernel("norm")(dx, got, axis=axis))
            finite = np.isfinite(largest)
            assert np.allclose(scaled[finite], norm[finite], rtol=1e-13, atol=0), label


def _device_view(cupy, view):
    """`view` of a host array as the same view of that array on the device
    (its strides kept: a strided view, a complex array's part)."""
    base = view
    while base.base is not None:
        base = base.base
    offset = view.__array_interface__["data"][0] - base.__array_interface__["data"][0]
    whole = cupy.asarray(base)
    flat = whole.view(cupy.uint8).reshape(-1)
    return cupy.ndarray(view.shape, view.dtype, flat.data + offset, view.strides)


def test_fp64_int8_first_call_reports_its_kernels_made_apart_and_compiles_nothing(tmp_path):
    """A fresh process with an empty CuPy kernel cache makes fp64-int8's
    kernels before its first call's product and says how long it took
    (stats' ``compile_seconds``); its second call makes nothing. Where the
    shipped binary fits this GPU and driver, nothing is compiled at all:
    CuPy's cache stays empty."""
    from summa.precision import binaries
    if not _int8_capable():
        pytest.skip("no INT8 tensor cores")
    out = _with_empty_kernel_cache(tmp_path / "kernels", _FIRST_CALLS, SUMMA_WORKERS="1")
    first, second = map(float, out.split()[-2:])
    assert first > 0 and second == 0, (first, second)
    compiled = list((tmp_path / "kernels").iterdir())
    import cupy
    assert bool(compiled) == (binaries.load(cupy) is None), compiled


_FIRST_PRODUCTS = """
import os, re, sys, numpy as np, cupy
import summa
rng = np.random.default_rng()
for dtype in ("float64", "complex128"):
    a = rng.uniform(-1, 1, (300, 200)).astype(dtype)
    b = rng.uniform(-1, 1, (200, 100)).astype(dtype)
    if dtype == "complex128":
        a += 1j * rng.uniform(-1, 1, a.shape)
    c = summa.matmul(a, b, precision="fp64-int8", backend="cupy")
    f = summa.matmul(np.asfortranarray(a), b[:, ::2], precision="fp64-int8", backend="cupy")
    assert np.abs(c - a @ b).max() <= 1e-12 * 200 and np.abs(f - a @ b[:, ::2]).max() <= 1e-12 * 200
cache = os.environ["CUPY_CACHE_DIR"]
print([re.findall(r"void (\\w+)\\(", open(os.path.join(cache, f)).read())[:1]
       for f in sorted(os.listdir(cache)) if f.endswith(".cu")])
"""


@pytest.mark.parametrize("source", ["shipped", "compiled here"])
def test_fp64_int8_first_products_from_the_host_compile_nothing_but_its_own_source(tmp_path,
                                                                                source):
    """A fresh process's fp64-int8 products from NumPy arrays (float64 and
    complex128, C-ordered and Fortran-ordered, a strided B) compile no CuPy
    kernel: with the shipped binary nothing at all, and without it (as on a
    driver older than the CUDA that built it) the kernels' own source once."""
    if not _int8_capable():
        pytest.skip("no INT8 tensor cores")
    from summa.precision import binaries
    import cupy
    if source == "shipped" and binaries.load(cupy) is None:
        pytest.skip("the shipped binary does not fit this GPU or driver")
    script = _FIRST_PRODUCTS if source == "shipped" else (
        "from summa.precision import binaries\nbinaries.load = lambda cupy: None\n"
        + _FIRST_PRODUCTS)
    out = _with_empty_kernel_cache(tmp_path / "kernels", script, SUMMA_WORKERS="1",
                                   CUPY_CACHE_SAVE_CUDA_SOURCE="1")
    compiled = out.strip().splitlines()[-1]
    assert compiled == ("[]" if source == "shipped" else "[['summa_end']]"), compiled


def test_the_shipped_kernels_and_the_source_compiled_here_agree(rng):
    """The fat binary built by nvcc and the source compiled by NVRTC (another
    CUDA's, it may be) give the same products, within two units in the last
    place (float64 and complex128, C apart), both within the gauge."""
    import cupy
    from summa.device.backend import get_backend
    from summa.precision import binaries, kernels, ozaki_gpu
    if not _int8_capable():
        pytest.skip("no INT8 tensor cores")
    if binaries.load(cupy) is None:
        pytest.skip("the shipped binary does not fit this GPU or driver")
    backend = get_backend("cupy")
    a = rng.uniform(-1, 1, (130, 300)) + 1j * rng.uniform(-1, 1, (130, 300))
    b = rng.uniform(-1, 1, (300, 70)) - 1j * rng.uniform(-1, 1, (300, 70))
    products = []
    for made in (kernels.module, lambda: cupy.RawModule(code=kernels.SOURCE)):
        saved = dict(kernels.cache)
        kernels.cache.clear()
        kernels.cache[("module", cupy.cuda.Device().compute_capability)] = made()
        try:
            got = []
            for x, y in ((a.real, b.real), (a, b)):
                c = cupy.zeros((y.shape[1], x.shape[0]), dtype=x.dtype).T
                ozaki_gpu.gemm(1.5, cupy.asarray(x), cupy.asarray(y), c, 0.0, backend=backend)
                got.append(cupy.asnumpy(c))
            products.append(got)
        finally:
            kernels.cache.clear()
            kernels.cache.update(saved)
    for shipped, here in zip(*products):
        assert within_two_ulps(shipped, here)
    for got in products:
        assert gemm_scaled_error(got[1], a, b, alpha=1.5) <= 1


_IPC_JOB = """
import os, sys
from mpi4py import MPI
from summa.device.backend import get_backend
from summa.distribution.grid import ProcessGrid
from summa.distribution.matrix import DistMatrix
from summa.execution.algorithm import gemm
comm = MPI.COMM_WORLD
grid = ProcessGrid(comm, (1, comm.Get_size()))
backend = get_backend("cupy", grid.local_rank)
A = DistMatrix.random((64, 48), "float64", grid, backend, seed=1)
B = DistMatrix.random((48, 80), "float64", grid, backend, seed=2)
C = DistMatrix.zeros((64, 80), "float64", grid, backend)
gemm(A, B, C, panel_width=16, broadcaster="ipc")
backend.synchronize()
if sys.argv[1] == "freed":
    del A, B, C
    grid.free()
open(os.path.join(sys.argv[2], f"pid.{os.getpid()}"), "w").close()
"""


@pytest.mark.parametrize("grid_at_exit", ["freed", "kept"])
def test_ipc_broadcasts_leave_nothing_in_dev_shm(tmp_path, grid_at_exit):
    """A job whose ranks broadcast through CUDA IPC (buffers and
    interprocess events) leaves none of CUDA's files in /dev/shm, its grid
    freed before the ranks exit or kept to the end (a four-rank test run
    left a ``cuda.shm.*`` file per rank)."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    from test_cli import mpiexec
    script = tmp_path / "job.py"
    script.write_text(_IPC_JOB)
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    done = subprocess.run(mpiexec() + ["-n", "2", sys.executable, str(script), grid_at_exit,
                                       str(tmp_path)],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    pids = [int(p.suffix[1:]) for p in tmp_path.glob("pid.*")]
    assert len(pids) == 2, pids
    marks = [f".{pid:x}." for pid in pids]
    left = [n for n in os.listdir("/dev/shm")
            if n.startswith("cuda.shm.") and any(m in n for m in marks)]
    assert left == [], left
