"""A randomized correctness sweep: many small products, each drawn from every
option summa has, each checked against a float64 (complex128) reference with
the gauge.

Run by ``tests/test_sweep.py`` (``SUMMA_SWEEP_CASES`` cases per rank count,
``SUMMA_SWEEP_SEED`` to replay a run) and by ``.ci/gpu-check`` with
``SUMMA_TEST_BACKEND=cupy``, where ranks share the GPUs when there are fewer.
A failing case is printed as the dict it was drawn as, which :func:`run_case`
takes back to reproduce it.
"""

from __future__ import annotations

import numpy as np

from helpers import gemm_scaled_error, op, random_array
from summa import options

#: Dimensions the draws favour: one, two, small primes, and sizes around a
#: rank count (below it too: ranks with empty blocks).
SPECIAL_SIZES = (1, 2, 3, 5, 7, 13, 31, 97, 127, 257)


def _dim(rng, largest: int) -> int:
    pick = rng.uniform()
    if pick < 0.35:
        return int(rng.choice([s for s in SPECIAL_SIZES if s <= largest] or [1]))
    if pick < 0.9:
        return int(rng.integers(1, min(largest, 200) + 1))
    return int(rng.integers(1, largest + 1))


def draw_case(rng, nranks: int, backend, modes, largest: int) -> dict:
    """One random case for `nranks` ranks on `backend` with broadcasters `modes`.

    Shapes go up to `largest` in each dimension; grids are every factorization
    of `nranks`; column strips are drawn on grids of one column, in memory.
    """
    from summa.grid import grid_shapes
    dtypes = [d.name for d in backend.dtypes]
    grid = [int(x) for x in grid_shapes(nranks)[rng.integers(len(grid_shapes(nranks)))]]
    dtype = str(rng.choice(dtypes))
    out_of_core = bool(rng.uniform() < 0.25) and dtype != "float16"
    schedule = "strips" if (grid[1] == 1 and not out_of_core and rng.uniform() < 0.4) \
        else "panels"
    ops = ["N", "T", "H"]
    case = {
        "grid": grid, "m": _dim(rng, largest), "n": _dim(rng, largest), "k": _dim(rng, largest),
        "dtype": dtype,
        "trans_a": "N" if out_of_core else str(rng.choice(ops)),
        "trans_b": "N" if out_of_core else str(rng.choice(ops)),
        "alpha": float(np.round(rng.uniform(-2, 2), 3)) or 1.0,
        "beta": float(rng.choice([0.0, 1.0, np.round(rng.uniform(-2, 2), 3)])),
        "block": None if rng.uniform() < 0.5 else [int(rng.integers(1, 40)),
                                                   int(rng.integers(1, 40))],
        "panel_width": int(rng.choice([1, 3, 7, 16, 64, 256])),
        "lookahead": int(rng.integers(0, 4)),
        "broadcaster": str(rng.choice(["auto", *modes])),
        "schedule": schedule,
        "out_of_core": out_of_core,
        "budget_share": float(rng.uniform(0.05, 1.0)),
        "transpose_a": str(rng.choice(["auto", "yes", "no"])),
        "precision": None,
    }
    if backend.name == "cupy" and dtype in ("float32", "complex64") and rng.uniform() < 0.3:
        case["precision"] = "tf32"
    elif backend.name == "cupy" and dtype in ("float64", "complex128") and rng.uniform() < 0.2:
        case["precision"] = "fp64-int8"  # float64 from INT8 products, within the same gauge
    if out_of_core:
        case["block"] = None  # host-resident tiles are cut from balanced blocks
    return case


class Grids:
    """Process grids by shape, made once for a whole sweep (communicators, and
    on GPUs NCCL's, are slow to create), on the nodes `topology` says (default:
    as MPI sees them)."""

    def __init__(self, comm, topology=None):
        self.comm, self.topology, self._grids = comm, topology, {}

    def __call__(self, shape):
        from summa.grid import ProcessGrid
        key = tuple(shape)
        if key not in self._grids:
            self._grids[key] = ProcessGrid(self.comm, key, topology=self.topology)
        return self._grids[key]

    def free(self):
        for grid in self._grids.values():
            grid.free()
        self._grids.clear()


def _budget(case, shape, itemsize: int) -> int:
    """A device budget for an out-of-core case on a grid of `shape`:
    `budget_share` of what the in-memory blocks take, but never less than
    the smallest that tiles."""
    from summa.plan import memory_plan
    m, n, k, nb = case["m"], case["n"], case["k"], case["panel_width"]
    full = memory_plan(m, n, k, case["dtype"], shape, nb, case["lookahead"], "cupy",
                       device_budget=1 << 40, out_of_core=True, staged=(True, True))
    budget = max(int(full.device_bytes * case["budget_share"]), 1)
    while True:
        try:
            memory_plan(m, n, k, case["dtype"], shape, nb, case["lookahead"], "cupy",
                        device_budget=budget, out_of_core=True, staged=(True, True))
            return budget
        except ValueError:
            budget = budget * 2 + 64 * itemsize


def run_case(case: dict, grids: Grids, backend, seed: int) -> float:
    """Run `case` on every rank; return the scaled error (rank 0; NaN elsewhere)."""
    from summa.algorithm import gemm
    from summa.backend import NumpyBackend
    from summa.matrix import DistMatrix
    from summa.outofcore import summa_out_of_core
    grid = grids(case["grid"])
    rng = np.random.default_rng(seed)
    m, n, k = case["m"], case["n"], case["k"]
    dtype, ta, tb = case["dtype"], case["trans_a"], case["trans_b"]
    a = random_array(rng, (m, k) if ta == "N" else (k, m), dtype)
    b = random_array(rng, (k, n) if tb == "N" else (n, k), dtype)
    c0 = random_array(rng, (m, n), dtype)
    block = tuple(case["block"]) if case["block"] else None
    with options.set(transpose_a=case["transpose_a"]):
        if case["out_of_core"]:
            host = NumpyBackend()
            A, B, C = (DistMatrix.from_global(x, grid, host) for x in (a, b, c0))
            summa_out_of_core(case["alpha"], A, B, case["beta"], C, backend,
                              _budget(case, grid.shape, np.dtype(dtype).itemsize),
                              panel_width=case["panel_width"], lookahead=case["lookahead"],
                              precision=case["precision"], comm=case["broadcaster"])
        else:
            A, B, C = (DistMatrix.from_global(x, grid, backend, block=block)
                       for x in (a, b, c0))
            # C poisoned where beta = 0: its old values must not be read.
            if case["beta"] == 0:
                C.local.fill(np.nan)
            gemm(A, B, C, alpha=case["alpha"], beta=case["beta"], trans_a=ta, trans_b=tb,
                 panel_width=case["panel_width"], lookahead=case["lookahead"],
                 broadcaster=case["broadcaster"], precision=case["precision"],
                 schedule=case["schedule"])
        c = C.gather()
    if grid.rank != 0:
        return float("nan")
    # The reference takes op() itself: pass the stored arrays untransposed.
    return gemm_scaled_error(c, op(a, ta), op(b, tb), c0, case["alpha"], case["beta"],
                             precision=case["precision"])


def run_array_case(case: dict, comm, backend, seed: int, topology=None) -> float:
    """Run `case` through the array entry point (:func:`summa.matmul` of NumPy
    arrays held on rank 0, the product returned there, into an `out` array or
    not), on the nodes `topology` says; its beta and block do not apply.
    Host-resident (the paths that read the root's arrays in place or share
    them on a node) where the case is out of core, in tiles, and in one tile
    for most others. Return the scaled error (rank 0; NaN elsewhere)."""
    import summa
    rng = np.random.default_rng(seed)
    m, n, k = case["m"], case["n"], case["k"]
    dtype, ta, tb = case["dtype"], case["trans_a"], case["trans_b"]
    a = random_array(rng, (m, k) if ta == "N" else (k, m), dtype)
    b = random_array(rng, (k, n) if tb == "N" else (n, k), dtype)
    root = comm.Get_rank() == 0
    out = np.full((m, n), np.nan, dtype) if rng.uniform() < 0.5 and root else None
    # host-resident (out of core) most of the time; strips run in device memory only
    resident = case["out_of_core"] or (case["schedule"] != "strips" and rng.uniform() < 0.6)
    budget = None
    if case["out_of_core"]:
        budget = _budget(case, tuple(case["grid"]), np.dtype(dtype).itemsize)
    with options.set(transpose_a=case["transpose_a"]):
        c = summa.matmul(a if root else None, b if root else None, comm=comm,
                         grid=tuple(case["grid"]), backend=backend.name, out=out,
                         out_of_core=resident, device_memory=budget,
                         topology=topology, alpha=case["alpha"], trans_a=ta, trans_b=tb,
                         panel_width=case["panel_width"], lookahead=case["lookahead"],
                         broadcaster=case["broadcaster"], precision=case["precision"],
                         schedule=case["schedule"])
    if not root:
        return float("nan")
    assert out is None or c is out
    return gemm_scaled_error(c, op(a, ta), op(b, tb), None, case["alpha"], 0.0,
                             precision=case["precision"])
