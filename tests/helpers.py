"""Reference computations shared by the tests."""

from __future__ import annotations

import sys

import numpy as np

from summa.api.verify import reference_dtype, scaled_error, unit_roundoff

#: Launchers' variables: a command run as if started by hand (the job-less tests run so).
LAUNCHER_VARIABLES = ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_RANK",
                      "OMPI_COMM_WORLD_SIZE", "SLURM_PROCID", "HYDI_CONTROL_FD", "MPI_LOCALNRANKS")


def op(x: np.ndarray, t: str) -> np.ndarray:
    return {"N": x, "T": x.T, "H": x.conj().T}[t]


def gemm_scaled_error(c, a, b, c0=None, alpha=1.0, beta=0.0, trans_a="N", trans_b="N",
                      precision=None) -> float:
    """Scaled error of `c` against a float64/complex128 reference of
    ``alpha op(a) op(b) + beta c0``, gauge ``(K + 2) (eps (|alpha||A||B| +
    |beta||C0|) + eta)``.

    The 2 counts the roundings beside the K-term sum: scaling by alpha and
    beta and adding the two (a complex product rounds twice more); at K = 1
    in complex64 the plain ``K eps`` was exceeded by correct products (1.2 on
    average, the same for every schedule). `eta`, the dtype's smallest
    subnormal, is what a rounding into the subnormal range may lose beyond
    ``eps`` times the value (Higham's model of underflow): float16's
    results of K = 1 fall there (7.7e-8 against 6.1e-5, its smallest
    normal), where a correctly rounded product was 108 times the relative
    gauge alone."""
    ref_t = reference_dtype(c.dtype)
    A, B = op(a.astype(ref_t), trans_a), op(b.astype(ref_t), trans_b)
    ref = alpha * (A @ B)
    gauge = abs(alpha) * (np.abs(A) @ np.abs(B))
    if beta != 0:
        ref = ref + beta * c0.astype(ref_t)
        gauge = gauge + abs(beta) * np.abs(c0.astype(ref_t))
    k = A.shape[1] + 2
    eta = float(np.finfo(c.dtype).smallest_subnormal)
    return scaled_error(c, ref, k * (unit_roundoff(c.dtype, precision) * gauge + eta))


def data_warnings(warnings: list) -> list:
    """`warnings` without the note on cores a launcher bound the rank to
    (Open MPI binds ranks to cores by default; :class:`summa.distribution.grid.ProcessGrid`
    warns of it), which depends on the launcher, not on the data."""
    return [w for w in warnings if " may run on " not in w]


def random_array(rng, shape, dtype) -> np.ndarray:
    dtype = np.dtype(dtype)
    x = rng.uniform(-1, 1, shape)
    if dtype.kind == "c":
        x = x + 1j * rng.uniform(-1, 1, shape)
    return x.astype(dtype)


#: (M, N, K): square, uneven, primes, K smaller than the grid, one column, one row
GEMM_SHAPES = [(24, 24, 24), (37, 23, 41), (13, 7, 29), (5, 9, 1), (6, 1, 5), (1, 11, 4)]


def check_against_reference(rng, grid, backend, shape, block=None, **options) -> list:
    """For every dtype of `backend`: ``C = 0.5 A B + 2 C0`` on fresh random data
    distributed with `block`, by ``summa.execution.algorithm.gemm(**options)``, checked on
    rank 0 against the float64 reference. Returns each dtype's SummaStats."""
    from summa.execution.algorithm import SummaStats, gemm
    from summa.distribution.matrix import DistMatrix
    m, n, k = shape
    runs = []
    for dtype in backend.dtypes:
        a, b = random_array(rng, (m, k), dtype), random_array(rng, (k, n), dtype)
        c0 = random_array(rng, (m, n), dtype)
        A, B, C = (DistMatrix.from_global(x, grid, backend, block=block) for x in (a, b, c0))
        stats = SummaStats()
        gemm(A, B, C, alpha=0.5, beta=2.0, stats=stats, **options)
        c = C.gather()
        if grid.rank == 0:
            assert gemm_scaled_error(c, a, b, c0, 0.5, 2.0) <= 1, dtype
        runs.append(stats)
    return runs


def spy_out_of_core(monkeypatch):
    """Record the host blocks (A, B, C) the multiplies of arrays
    (summa.execution.arrays), host-held DistMatrix operands and files hand
    to the out-of-core sweep (run_out_of_core, with its plan)."""
    from summa.api import files, multiply
    from summa.execution import arrays, outofcore
    seen = []
    real = outofcore.run_out_of_core

    def spy(plan, operands, *args, **kwargs):
        seen.append((operands.A.local, operands.B.local, operands.C.local))
        return real(plan, operands, *args, **kwargs)
    for module in (files, multiply, arrays):
        monkeypatch.setattr(module, "run_out_of_core", spy)
    return seen


def held_plan(A, B, C, device, host_copies=None, **request):
    """The out-of-core Plan of ``C <- alpha A @ B + beta C`` on host-held
    DistMatrix operands, for `device`'s kind of backend, on C's grid (its
    ranks on a node; no communication): `request` as
    :class:`summa.planning.PlanRequest` takes it (``device_memory``: the budget
    that cuts the tiles), `host_copies` as :func:`summa.planning.make_plan`."""
    from summa.planning import Machine, PlanRequest, make_plan
    return make_plan((A.shape[0], B.shape[1], A.shape[1]), C.dtype,
                     Machine(device.name, C.grid.size, ranks_on_node=C.grid.local_size),
                     PlanRequest(grid=C.grid.shape, out_of_core=True, **request),
                     host_copies=host_copies)


def without_launcher_banner(stderr: str) -> str:
    """`stderr` without Open MPI's launcher banners (blocks between lines of
    dashes: "Primary job terminated normally, but 1 process returned a
    non-zero exit code ..."), which its mpirun prints after any rank exits
    non-zero; summa's own lines are what a test judges (MPICH's launcher
    adds nothing)."""
    kept, inside = [], False
    for line in stderr.splitlines(keepends=True):
        if line.strip() and set(line.strip()) == {"-"}:
            inside = not inside
        elif not inside:
            kept.append(line)
    return "".join(kept)


def use_fake_cupy(monkeypatch):
    """The NumPy stand-in for CuPy (tests/fake_cupy_kernels.py) imported as
    ``cupy`` for the test, and summa's kernel cache emptied (kernels made
    with another ``cupy`` would be taken). Returns the stand-in's module."""
    import fake_cupy_kernels
    from summa.precision import kernels
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy_kernels.module())
    monkeypatch.setattr(kernels, "cache", {})
    return fake_cupy_kernels


def within_two_ulps(got, want) -> bool:
    """Is every element of `got` within two float64 spacings of `want`'s?"""
    return bool(np.all(np.abs(got - want) <= 2 * np.spacing(np.abs(want))))


def marking_run(run, running: list):
    """`run` wrapped so that `running` is non-empty while a call of it runs
    (a spy's test of what happens inside an executor)."""
    def marked(*args, **kwargs):
        running.append(1)
        try:
            return run(*args, **kwargs)
        finally:
            running.pop()
    return marked


def reduction_cases(rng):
    """``(name, array, axis)``: the layouts the scaling's reductions meet (rows
    by rows, by columns, strided, a complex operand's part, one row, none)."""
    x = rng.standard_normal((37, 53)) * np.ldexp(1.0, rng.integers(-40, 40, (37, 1)))
    x[5, 7], x[9, 2] = np.inf, np.nan  # counted infinite by the largest
    z = rng.standard_normal((11, 13)) + 1j * rng.standard_normal((11, 13))
    return [("C", x, 1), ("C", x, 0), ("F", np.asfortranarray(x), 1),
            ("F", np.asfortranarray(x), 0), ("strided", x[::2, 1::3], 1),
            ("strided", x[::2, 1::3], 0), ("imag", z.imag, 1), ("imag", z.imag, 0),
            ("all of 2-D", x[1:, :5], None), ("1-D strided", x[:, 3], None),
            ("no columns", x[:, :0], 1)]


def expected_reductions(x, axis):
    """NumPy's largest magnitudes (Inf for Inf/NaN) and scaled 2-norms."""
    largest = np.where(np.isfinite(x), np.abs(x), np.inf).max(axis=axis, initial=0.0)
    top = largest if axis is None else np.expand_dims(largest, axis)
    with np.errstate(invalid="ignore"):
        norm = np.sqrt(np.sum(np.square(np.ldexp(x, -np.frexp(top)[1])), axis=axis))
    return largest, norm

