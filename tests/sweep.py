"""A randomized correctness sweep: many small products, each drawn from every
option summa has, each checked against a float64 (complex128) reference with
the gauge.

Run by ``tests/test_sweep.py`` (``SUMMA_SWEEP_CASES`` cases per rank count,
``SUMMA_SWEEP_SEED`` to replay a run) and by ``.ci/gpu-check`` with
``SUMMA_TEST_BACKEND=cupy``, where ranks share the GPUs when there are fewer.
A failing case is printed as the dict it was drawn as, its data's seed
included, which :func:`run_case` takes back to reproduce it.

A share of the cases go through the array entry point (``summa.matmul`` of
NumPy arrays, :func:`run_array_case`) holding every array a user may hand
over: C- and Fortran-ordered, transposed, strided and reversed views (NaN
between their elements: a read outside the view shows), read-only, into an
``out=`` array (a whole C-ordered one or a slice of columns of a wider one,
NaN where nothing may be written) or not, under every device budget, in
memory and host-resident; 1-D operands (vectors), stacks of two matrices, a
B of a narrower type, and integers or booleans of two types (checked bit
for bit against NumPy's own product; an end of their type's range stands
for NaN).
"""

from __future__ import annotations

import os

import numpy as np

from helpers import gemm_scaled_error, held_plan, op, random_array
from summa import options
from summa.host.storage import storage_of

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


#: Layouts the array entry point's operands are drawn in: as made (C order),
#: Fortran order, the transpose of a C-ordered array, strided and reversed views.
LAYOUTS = ("C", "F", "T", "strided", "reversed")
#: The "tiny" device budget's share of what the blocks take in memory (or the
#: least that tiles where that is more).
TINY_SHARE = 0.1
#: Share of the cases :func:`draw_case` sends through the array entry point.
ARRAYS_SHARE = 0.25


def draw_case(rng, nranks: int, backend, modes, largest: int, seed: int = 0,
              entry: str | None = None) -> dict:
    """One random case for `nranks` ranks on `backend` with broadcasters `modes`,
    its data drawn from `seed`, through `entry` ("dist": DistMatrix operands,
    "arrays": :func:`summa.matmul` of NumPy arrays; default: drawn, arrays
    for :data:`ARRAYS_SHARE` of the cases).

    Shapes go up to `largest` in each dimension; grids are every factorization
    of `nranks`; column strips are drawn on grids of one column, in memory.
    """
    from summa.distribution.grid import grid_shapes
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
    case["seed"] = int(seed)
    case["entry"] = entry or ("arrays" if rng.uniform() < ARRAYS_SHARE else "dist")
    if case["entry"] == "arrays":
        case.update(_draw_arrays(rng, case))
    # (drawn last: the draws before it, and so the cases of a seed, stay as they were)
    case["transpose_b"] = str(rng.choice(["auto", "yes", "no"]))
    if case["entry"] == "arrays":  # a Matmul planned for operands lying otherwise (drawn last)
        case["planned_on"] = str(rng.choice(["C", "F", "T"])) if rng.uniform() < 0.3 else None
        if case["out"] is not None and rng.uniform() < 0.3:  # filled from a product of its own
            case["out"] = "F"
        # a row of op(A) or a column of op(B) passed as a 1-D array, as NumPy takes vectors
        case["vectors"] = [bool(size == 1 and rng.uniform() < 0.5)
                           for size in (case["m"], case["n"])]
        # B of a narrower type, promoted to the case's as NumPy's matmul does
        narrower = NARROWER.get(case["dtype"], [])
        case["b_dtype"] = str(rng.choice(narrower)) if narrower and rng.uniform() < 0.2 \
            else None
        # a stack of two: one operand's matrix twice, as a view of it (its layout kept)
        case["stacked"] = bool(case["out"] is None and not case["planned_on"]
                               and not all(case["vectors"]) and rng.uniform() < 0.15)
        # integers or booleans of two types, multiplied exactly (NumPy's product, bit for bit)
        case["integers"] = [str(x) for x in rng.choice(INTEGERS, 2)] \
            if case["precision"] is None and rng.uniform() < 0.12 else None
    return case


#: The integer and boolean types array cases draw (each operand its own).
INTEGERS = ["int64", "int32", "int16", "uint8", "bool"]


def _integers(rng, shape, dtype) -> np.ndarray:
    """Random values of the integer or boolean `dtype`, below 2**10 in
    magnitude (float64 sums them exactly at every K the sweep draws)."""
    if dtype == "bool":
        return rng.uniform(size=shape) < 0.4
    low = 0 if np.dtype(dtype).kind == "u" else -1023
    return rng.integers(low, 1024, shape).astype(dtype)


#: dtypes whose common type with the key's is the key's (a B of one is promoted).
NARROWER = {"float64": ["float32", "float16"], "float32": ["float16"],
            "complex128": ["float64", "complex64", "float32"],
            "complex64": ["float32", "float16"]}


def _draw_arrays(rng, case: dict) -> dict:
    """What an array-entry case adds: each operand's layout (with the steps
    of a strided or reversed view) and writability, op(A)/op(B) of any kind
    (the entry point takes them out of core too), the `out` array, the
    device budget and whether the operands stay in host memory."""
    drawn = {"trans_a": str(rng.choice(["N", "T", "H"])),
             "trans_b": str(rng.choice(["N", "T", "H"]))}
    for side in "ab":
        layout = str(rng.choice(LAYOUTS))
        steps = None
        while layout == "strided" and (steps is None or max(steps) == 1):
            steps = [int(x) for x in rng.choice([1, 2, 3], 2)]
        while layout == "reversed" and (steps is None or min(steps) > 0):
            steps = [int(x) for x in rng.choice([-2, -1, 1], 2)]
        drawn[f"layout_{side}"], drawn[f"steps_{side}"] = layout, steps
        drawn[f"read_only_{side}"] = bool(rng.uniform() < 0.3)
    # most callers leave the width to summa (the plan fits it to the budget)
    drawn["panel_width"] = None if rng.uniform() < 0.5 else case["panel_width"]
    drawn["out"] = rng.choice([None, "C", "columns"], p=[0.5, 0.3, 0.2])
    # tiny: many tiles; share: budget_share of what the blocks take in memory
    drawn["budget"] = rng.choice([None, "tiny", "share"])
    # strips run in device memory only
    drawn["out_of_core"] = False if case["schedule"] == "strips" else \
        rng.choice([None, True, False], p=[0.3, 0.5, 0.2])
    return {key: value if not isinstance(value, np.generic) else value.item()
            for key, value in drawn.items()}


class Grids:
    """Process grids by shape, made once for a whole sweep (communicators, and
    on GPUs NCCL's, are slow to create), on the nodes `topology` says (default:
    as MPI sees them)."""

    def __init__(self, comm, topology=None):
        self.comm, self.topology, self._grids = comm, topology, {}

    def __call__(self, shape):
        from summa.distribution.grid import ProcessGrid
        key = tuple(shape)
        if key not in self._grids:
            self._grids[key] = ProcessGrid(self.comm, key, topology=self.topology)
        return self._grids[key]

    def free(self):
        for grid in self._grids.values():
            grid.free()
        self._grids.clear()


def _budget(case, shape, itemsize: int, storage: tuple = ("rows", "rows")) -> int:
    """A device budget for an out-of-core case on a grid of `shape`:
    `budget_share` of what the in-memory blocks take, but never less than
    the smallest that tiles into few enough steps (the planner refuses more
    than MAX_SWEEP_GEMMS tiny ones, and a narrow drawn width on a large K
    can come near that), for operands lying as `storage` says (B's
    row-major copies, where the settings make them, take room too)."""
    from summa.planning.memory import Execution, memory_plan
    from summa.planning.widths import too_fine
    # a default width (None) is summa's choice: the budget is planned at 256
    m, n, k, nb = case["m"], case["n"], case["k"], case["panel_width"] or 256
    def execution(budget: int) -> Execution:  # fp64-int8's scratch counts on the GPU
        return Execution(case["lookahead"], "cupy", device_budget=budget, out_of_core=True,
                         staged=(True, True), precision=case.get("precision"),
                         storage=storage)
    full = memory_plan(m, n, k, case["dtype"], shape, nb, execution(1 << 40))
    budget = max(int(full.device_bytes * case["budget_share"]), 1)
    while True:
        try:
            plan = memory_plan(m, n, k, case["dtype"], shape, nb, execution(budget))
            if not too_fine(plan, k, True, 2 * m * n * k):
                return budget
            budget *= 2
        except ValueError:
            budget = budget * 2 + 64 * itemsize


def run_case(case: dict, grids: Grids, backend, seed: int | None = None) -> float:
    """Run `case` (a dict :func:`draw_case` made) on every rank, its data
    drawn from `seed` (default: the case's own), through the case's entry
    point; return the scaled error (rank 0; NaN elsewhere)."""
    seed = case.get("seed", 0) if seed is None else seed
    if case.get("entry") == "arrays":
        return run_array_case(case, grids.comm, backend, seed, grids.topology)
    from summa.execution.algorithm import gemm
    from summa.device.backend import NumpyBackend
    from summa.distribution.matrix import DistMatrix
    from summa.execution.outofcore import SweepOperands, summa_out_of_core
    grid = grids(case["grid"])
    rng = np.random.default_rng(seed)
    m, n, k = case["m"], case["n"], case["k"]
    dtype, ta, tb = case["dtype"], case["trans_a"], case["trans_b"]
    a = random_array(rng, (m, k) if ta == "N" else (k, m), dtype)
    b = random_array(rng, (k, n) if tb == "N" else (n, k), dtype)
    c0 = random_array(rng, (m, n), dtype)
    block = tuple(case["block"]) if case["block"] else None
    with options.set(transpose_a=case["transpose_a"],
                     transpose_b=case.get("transpose_b", "auto")):
        if case["out_of_core"]:
            host = NumpyBackend()
            A, B, C = (DistMatrix.from_global(x, grid, host) for x in (a, b, c0))
            plan = held_plan(A, B, C, backend,
                             device_memory=_budget(case, grid.shape, np.dtype(dtype).itemsize),
                             panel_width=case["panel_width"], lookahead=case["lookahead"],
                             precision=case["precision"], broadcaster=case["broadcaster"])
            summa_out_of_core(plan, SweepOperands(A, B, C), backend, alpha=case["alpha"],
                              beta=case["beta"])
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
    Return the scaled error (rank 0; NaN elsewhere); a product that lands
    outside `out`'s columns, a call that does not return `out` or one that
    writes into an operand fails (infinite error)."""
    import summa
    rng = np.random.default_rng(seed)
    m, n, k = case["m"], case["n"], case["k"]
    dtype, ta, tb = case["dtype"], case["trans_a"], case["trans_b"]
    shapes = (m, k) if ta == "N" else (k, m), (k, n) if tb == "N" else (n, k)
    if case.get("integers"):  # (their product's type; computed in float64, alpha 1)
        a, b = (_integers(rng, s, t) for s, t in zip(shapes, case["integers"]))
        dtype, case = np.result_type(a, b), dict(case, alpha=1.0, dtype="float64")
    else:
        a = random_array(rng, shapes[0], dtype)
        b = random_array(rng, shapes[1], case.get("b_dtype") or dtype)
    root = comm.Get_rank() == 0
    given = {side: laid_out(x, case[f"layout_{side}"], case[f"steps_{side}"],
                            case[f"read_only_{side}"]) for side, x in (("a", a), ("b", b))}
    out, whole = out_array(case["out"], (m, n), dtype, rng) if root else (None, None)
    planned = [laid_out(x, case["planned_on"], None, False) if case.get("planned_on") else None
               for x in (a, b)]
    # a budget for the operands as they lie, and as the Matmul's were planned (integers:
    # as their float64 copies lie, summa.host.copies.converted's layout)
    as_computed = (lambda x: np.empty_like(x, np.float64, subok=False)) \
        if case.get("integers") else (lambda x: x)
    storages = {tuple(storage_of(as_computed(x[side]), t) for side, t in zip("ab", (ta, tb)))
                for x in (given, dict(zip("ab", planned))) if x["a"] is not None}
    vectors = case.get("vectors") or (False, False)
    given = {side: as_passed(x, t, side, v) for (side, x), t, v in
             zip(given.items(), (ta, tb), vectors)}
    if out is not None and any(vectors):  # the product's shape: 1-D, or 0-d (a view: the
        # Ellipsis keeps both vectors' out an array, not a NumPy scalar copied out of it)
        out = out[0 if vectors[0] else slice(None), 0 if vectors[1] else slice(None), ...]
    passed = dict(given)  # (given: the matrices, which the stack views)
    if case.get("stacked"):  # (a vector stays one: the other operand is the stack)
        side = "b" if vectors[0] else "a"
        passed[side] = np.broadcast_to(given[side], (2,) + given[side].shape)
    # (every run draws within its plan's peak, the device's and, NumPy's
    # device being the host, the host's: summa.device.account;
    # SUMMA_SWEEP_MEMORY=0 turns the check off)
    with options.set(transpose_a=case["transpose_a"],
                     transpose_b=case.get("transpose_b", "auto"),
                     memory_check=os.environ.get("SUMMA_SWEEP_MEMORY", "1") == "1"):
        budgets = [array_budget(case, np.dtype(case["dtype"]).itemsize, s) for s in storages]
        asked = dict(comm=comm, grid=tuple(case["grid"]), backend=backend.name,
                     out_of_core=case["out_of_core"],
                     device_memory=None if None in budgets else max(budgets),
                     alpha=case["alpha"], trans_a=ta, trans_b=tb,
                     panel_width=case["panel_width"], lookahead=case["lookahead"],
                     broadcaster=case["broadcaster"], precision=case["precision"],
                     schedule=case["schedule"])
        if case.get("planned_on") and topology is None:  # (a Matmul takes no topology)
            with summa.Matmul(*(x if root else None for x in planned), **asked) as product:
                c = product.execute(given["a"] if root else None,
                                    given["b"] if root else None, out=out)
        else:
            c = summa.matmul(passed["a"] if root else None, passed["b"] if root else None,
                             out=out, topology=topology, **asked)
    if not root:
        return float("nan")
    if out is not None and c is not out:
        return float("inf")  # the product must come back in the caller's array
    if not all(np.array_equal(given[side], as_passed(x, t, side, v))
               for side, x, t, v in zip("ab", (a, b), (ta, tb), vectors)):
        return float("inf")  # the operands are the caller's: never written
    stack = (2,) if case.get("stacked") else ()
    if np.shape(c) != stack + tuple(size for size, v in zip((m, n), vectors) if not v):
        return float("inf")  # a vector's dimension dropped from the product, as NumPy's
    if stack and not np.array_equal(c[0], c[1]):
        return float("inf")  # the stack's two products are of the same matrices
    c = np.reshape(c[0] if stack else c, (m, n))
    if whole is not None and not _unwritten(np.delete(whole, np.s_[1:1 + n], axis=1)):
        return float("inf")  # written outside out's columns
    if c.dtype != dtype:
        return float("inf")  # B's narrower type promoted to A's, as NumPy's matmul does
    if case.get("integers"):  # exact, wrapping as NumPy's integer matmul wraps
        return 0.0 if np.array_equal(c, op(a, ta) @ op(b, tb)) else float("inf")
    return gemm_scaled_error(c, op(a, ta), op(b.astype(dtype), tb), None, case["alpha"], 0.0,
                             precision=case["precision"])


def as_passed(x: np.ndarray, trans: str, side: str, vector: bool) -> np.ndarray:
    """The stored operand `x` as the case passes it: `x`, or with `vector`
    the one row of op(x) (`side` "a") or column of op(x) ("b") as the 1-D
    array NumPy's matmul takes there (a view)."""
    if not vector:
        return x
    row_of_x = (side == "a") == (trans == "N")
    return x[0] if row_of_x else x[:, 0]


def laid_out(x: np.ndarray, layout: str, steps, read_only: bool) -> np.ndarray:
    """`x`'s values in `layout` (:data:`LAYOUTS`; `steps` the view's row and
    column steps for "strided" and "reversed"), read-only where asked."""
    # (always a copy: a vector is C- and F-ordered at once, where NumPy would
    # hand back `x` itself, made read-only here for every later use)
    if layout == "F":
        y = np.array(x, order="F")
    elif layout == "T":
        y = np.array(x.T, order="C").T
    elif layout in ("strided", "reversed"):
        rows, cols = steps
        # NaN (or an end of an integer type) between the view's elements: a read
        # outside the view shows
        big = np.full((abs(rows) * x.shape[0], abs(cols) * x.shape[1]), _stale(x.dtype),
                      x.dtype)
        y = big[::rows, ::cols]
        y[...] = x
    else:
        y = x.copy()
    y.flags.writeable = not read_only
    return y


def out_array(kind, shape, dtype, rng):
    """``(out, the array it is a slice of)``: None; "C", a C-ordered array;
    "F", a Fortran-ordered one (its rows not contiguous: filled at the end);
    "columns", columns 1 to n of a wider C-ordered array (contiguous rows,
    strided as a whole); NaN everywhere, so stale values show."""
    if kind is None:
        return None, None
    if kind in ("C", "F"):
        return np.full(shape, _stale(dtype), dtype, order=kind), None
    whole = np.full((shape[0], shape[1] + 1 + int(rng.integers(0, 3))), _stale(dtype), dtype)
    return whole[:, 1:1 + shape[1]], whole


def _stale(dtype):
    """What an `out` of `dtype` holds before the call: NaN, or for integers
    an end of their type's range (booleans: True)."""
    dtype = np.dtype(dtype)
    if dtype.kind in "fc":
        return np.nan
    return True if dtype.kind == "b" else np.iinfo(dtype).max if dtype.kind == "u" else \
        np.iinfo(dtype).min


def _unwritten(x: np.ndarray) -> bool:
    """Does `x` (part of an `out`) still hold only :func:`_stale` values?"""
    return bool(np.isnan(x).all() if x.dtype.kind in "fc" else (x == _stale(x.dtype)).all())


def array_budget(case: dict, itemsize: int, storage: tuple = ("rows", "rows")):
    """`device_memory` for an array-entry case of operands lying as
    `storage` says: None, :data:`TINY_SHARE` ("tiny") or `budget_share`
    ("share") of what the blocks take in memory. Under the case's settings
    (its transposed copies take room)."""
    if case["budget"] is None:
        return None
    if case["budget"] == "tiny":
        # not the least that tiles: its thousands of one-row tiles took 20 s a case
        case = dict(case, budget_share=TINY_SHARE)
    return _budget(case, tuple(case["grid"]), itemsize, storage)


# -- valid cases summa gets wrong or refuses today ----------------------------------------

#: Valid cases that fail today: ``(name, does a case have the property?,
#: one such case (run on one rank by tests/test_sweep.py, strict xfail:
#: it fails there until fixed), the error it raises today)``. The sweep
#: leaves such cases out (several ranks can hang on them).
KNOWN_FAILURES: list = []  # (issue 38's one-column strided operand: multiplied since)


def known_failure(case: dict, backend) -> str | None:
    """The name of the :data:`KNOWN_FAILURES` entry `case` has the property
    of, or None."""
    for name, has, _, _ in KNOWN_FAILURES:
        if has(case, backend):
            return name
    return None
