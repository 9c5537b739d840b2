"""The matrix: ``summa.matmul(a, b)`` on every array the user holds, each
cell in a fresh process, against the GPU's own rate for that dtype.

Cells are dtype x layout x budget x size:

============  ==============================================================
dtypes        float64, float32, complex128, complex64, fp64-int8
              (float64 with ``precision="fp64-int8"``), and int32
              (integers below 2**10, multiplied exactly in float64:
              float64's ``cupy.matmul`` is their ceiling)
layouts       ``C``: C-ordered; ``F``: both operands Fortran-ordered (what
              ``np.asfortranarray`` gives, what Fortran codes hand over);
              ``T``: ``a.T @ b``, A a transposed view of a C-ordered array;
              ``strided``: both views ``big[::2, ::2]`` of twice-larger
              arrays (the same logical shape); ``trans`` (not in the
              default): C-ordered arrays with ``trans_a="T", trans_b="T"``;
              ``stack``: A as a stack of two matrices of half its rows (a
              3-D array), one product each with B;
              ``cupy``: CuPy operands already on the GPU (float64, whole
              GPU only), "skipped" where summa refuses them
budgets       ``24GiB``: all but 24 GiB of the GPU taken first (an RTX
              3090's memory); ``8GiB``: the same and
              ``device_memory="8GiB"``; ``whole``: the whole GPU
sizes         ``N`` (N³) or ``MxNxK``; default 16384³ (GEMM-bound)
============  ==============================================================

Every cell makes fresh pageable NumPy arrays, starts CUDA (timed apart),
times the first call, again, and once more into the again call's product
(``out=``: no fresh result to fault in), each checked (Freivalds' residual
<= 1), then, the memory given back, the same dtype's ``cupy.matmul`` on
device data (the ceiling); for fp64-int8 also the bare fp64-int8 product on
device data (the faster of its default scheme and the one summa plans for
device data); and the transfer bound: the bytes that must cross the link (A
and B up, C down) at the rates of summa's own copies from pageable memory,
measured in the same process.
Without a GPU (no CuPy) the ceiling is NumPy's matmul, no budget holds
anything (``8GiB`` still passes ``device_memory``: NumPy's backend then runs
host-resident in tiles), fp64-int8 and CuPy cells are skipped, and only
values are judged.

Goals (issue 38; one H200): GEMM-bound cells (every side >= 16384) first
call >= 0.85 of the ceiling (float64/float32 C order >= 0.88), again >=
0.9; a cell the link bounds (its transfer bound longer than the ceiling,
or than the bare product for fp64-int8) >= 0.8 of the transfer bound
instead; F, T and trans within 10 % of the C cell's time; fp64-int8 >= 0.8
of the bare product's rate; CuPy operands within 5 % of ``cupy.matmul``,
the result a CuPy array. A wrong product fails whatever its time. With
``--profile`` (``summa calibrate``'s profile of this machine) each cell also
records the model's time for the plan its calls ran, judged within 10 % of
its again call (issue 64's "the model within 10 % on every cell").

Usage, on the GPU machine (each call stops starting cells after
``--deadline`` seconds; ``--resume`` skips the cells ``--json`` already
holds from this machine, so the same command, repeated, finishes the
matrix; every row names its machine, and a file of several machines'
rows reports each machine's apart)::

    python3 benchmarks/matrix.py --json matrix.jsonl --resume
    python3 benchmarks/matrix.py --report matrix.jsonl      # the table again
    python3 benchmarks/matrix.py --cpu-sized --in-process   # no GPU: values only
    python3 -m summa calibrate -o h100.json && python3 benchmarks/matrix.py --profile h100.json

Before the first cell, a fresh process warms the machine (small calls of
each dtype chosen, whole and in tiles): a first call is a fresh process's on
a machine whose libraries and kernel caches are warm, timed after CUDA's
start and a first small product of the cell's dtype (``calls.start_cuda``:
cuBLAS loads a dtype's kernels at its first GEMM, ~0.2 s, which
``cupy.matmul``'s first product pays too). A fresh machine's very
first call (compiling fp64-int8's kernels: seconds, once per machine) is
measured by ``benchmarks/fp64_int8_user_case.py`` instead.

It prints a progress line per cell and one table last.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import calls

GiB = calls.GiB
#: dtype name: (NumPy dtype, precision)
DTYPES = {"float64": ("float64", None), "float32": ("float32", None),
          "complex128": ("complex128", None), "complex64": ("complex64", None),
          "fp64-int8": ("float64", "fp64-int8"), "int32": ("int32", None)}
#: "stack": A as a stack of two matrices of half its rows (a 3-D array), B one
#: matrix beside it: the products of summa.matmul's stacks, the C cell's flops.
LAYOUTS = ("C", "F", "T", "strided", "trans", "stack", "cupy")
#: budget: (bytes left free on the GPU or None, device_memory)
BUDGETS = {"24GiB": (24 * GiB, None), "8GiB": (24 * GiB, "8GiB"), "whole": (None, None)}
#: The options each preset sets where the command line does not.
PRESETS = {
    "default": {"dtypes": ",".join(DTYPES), "layouts": "C,F,T,strided,stack,cupy",
                "budgets": ",".join(BUDGETS), "sizes": "16384"},
    # a smoke run on a GPU: every dtype and layout, one budget, 8192³ (about 2 minutes)
    "quick": {"dtypes": ",".join(DTYPES), "layouts": "C,F,T,strided,stack,cupy",
              "budgets": "24GiB", "sizes": "8192"},
    # the whole matrix at sizes a CPU multiplies at once (the test suite's)
    "cpu-sized": {"dtypes": ",".join(DTYPES), "layouts": ",".join(LAYOUTS),
                  "budgets": ",".join(BUDGETS), "sizes": "96x80x112"},
}
#: A side at least this long makes a cell GEMM-bound (the issue's goals apply).
GEMM_BOUND = 16384
#: Cells smaller than this on a side are judged by their values only: their
#: calls take milliseconds, and a GPU's times there are its set-up's noise
#: (the CPU-sized matrix on the H200 machine: 35 of 76 tiny cells "failed").
TIMED_SIDE = 4096
#: How far the model's time (``--profile``) may lie from a cell's again call.
MODEL_TOLERANCE = 0.10
#: Seconds below which a call's deadline starts no further cell.
LEAST_CELL_SECONDS = 20
#: Side of the warm-up's products (:func:`warm_up`), and the device memory its
#: second product of each dtype is cut to (so that it runs in tiles too).
WARM_SIDE, WARM_BUDGET = 2048, "64MiB"


def size_name(m: int, n: int, k: int) -> str:
    """``"N³"`` or ``"MxNxK"``."""
    return f"{m}³" if m == n == k else f"{m}x{n}x{k}"


def cell_name(cell: dict) -> str:
    """The cell's name in the table and the JSON lines: dtype layout budget size."""
    return " ".join((cell["dtype"], cell["layout"], cell["budget"],
                     size_name(cell["m"], cell["n"], cell["k"])))


def cells(dtypes, layouts, budgets, sizes) -> list[dict]:
    """Every cell of the selection, C first within a dtype and budget (the
    layouts' goals compare with it); the CuPy row is float64 on the whole GPU."""
    chosen = []
    for m, n, k in sizes:
        for dtype in dtypes:
            for budget in budgets:
                for layout in sorted(layouts, key=LAYOUTS.index):
                    if layout == "cupy" and (dtype, budget) != ("float64", "whole"):
                        continue
                    chosen.append({"dtype": dtype, "layout": layout, "budget": budget,
                                   "m": m, "n": n, "k": k})
    return chosen


# -- one cell, in its own process ---------------------------------------------------------

def operands(cell: dict, seed: int = 1):
    """``(a, b, options, A, B)``: the arrays the call takes, the options
    that say how (trans), and the logical operands ``op(a)``, ``op(b)``
    for the check. Fresh pageable arrays, of the cell's layout."""
    import numpy as np
    m, n, k = cell["m"], cell["n"], cell["k"]
    dtype = DTYPES[cell["dtype"]][0]
    layout = cell["layout"]

    def made(shape, s):
        return calls.fresh(shape, dtype, s)
    if layout == "C":
        a, b = made((m, k), seed), made((k, n), seed + 1)
    elif layout == "F":
        # the transpose of a fresh C array is already Fortran-ordered: no copy
        a = np.asfortranarray(made((k, m), seed).T)
        b = np.asfortranarray(made((n, k), seed + 1).T)
    elif layout == "T":
        a, b = made((k, m), seed).T, made((k, n), seed + 1)
    elif layout == "strided":
        a, b = _strided((m, k), dtype, seed), _strided((k, n), dtype, seed + 1)
    elif layout == "stack":
        a, b = made((m, k), seed), made((k, n), seed + 1)
        return a.reshape(2, m // 2, k), b, {}, a, b  # (C order: a view)
    elif layout == "trans":
        at, bt = made((k, m), seed), made((n, k), seed + 1)
        return at, bt, {"trans_a": "T", "trans_b": "T"}, at.T, bt.T
    else:
        raise ValueError(f"no host operands for layout {layout!r}")
    return a, b, {}, a, b


def _strided(shape, dtype, seed: int):
    """A view ``big[::2, ::2]`` of a twice-larger fresh array, of `shape`
    (only the view's rows are touched: the others cost no memory).

    `big` is made without NumPy's advice to back it by huge pages: a 2 MiB
    page spans two rows of 1 MiB (complex128 65536 wide), so touching every
    other row faulted all of `big` in (a 2048 x 65536 parent: 2072 MB
    resident against 1049 without), and complex128 32768³ (two 68.7 GB
    parents) was killed on a host of 128 GiB."""
    import numpy as np
    advise = getattr(getattr(np, "_core", None), "multiarray", None)
    advise = getattr(advise, "_set_madvise_hugepage", None)
    was = advise(False) if advise else None
    try:
        big = np.empty((2 * shape[0], 2 * shape[1]), dtype)
    finally:
        if advise:
            advise(was)
    view = big[::2, ::2]
    calls.fill(view, seed)
    return view


def compute_dtype(name: str) -> str:
    """The dtype summa computes the cell's dtype `name` in: integers in
    float64 (exact), the rest in their own."""
    import numpy as np
    dtype = DTYPES[name][0]
    return "float64" if np.dtype(dtype).kind in "biu" else dtype


def call_options(cell: dict) -> dict:
    """summa.matmul's keywords for the cell's dtype and budget."""
    options = {}
    precision = DTYPES[cell["dtype"]][1]
    if precision:
        options["precision"] = precision
    device_memory = BUDGETS[cell["budget"]][1]
    if device_memory:  # NumPy's backend takes it too (and plans its tiles by it)
        options["device_memory"] = device_memory
    return options


def timed_calls(a, b, options: dict, check, sync=None) -> dict:
    """First call and again of ``summa.matmul(a, b, **options)``, then
    "reused": once more into the again call's product (``out=``, memory
    already faulted in: a fresh result's first touch cost a float64 16384³
    call about a third of its time on the H200 machine): seconds, `check`'s
    residual of each product, summa's stats; ``error`` where a call raised
    (the rest not run)."""
    import summa
    row, c = {}, None
    for call in ("first", "again", "reused"):
        stats = summa.SummaStats()
        out = {"out": c} if call == "reused" else {}
        if call != "reused":
            c = None  # the earlier product freed first, as a caller's loop does
        t0 = time.perf_counter()
        try:
            c = summa.matmul(a, b, stats=stats, **options, **out)
            if sync:
                sync()
        except Exception as exc:  # noqa: BLE001 -- a refused or failed call is the cell's result
            row["error"] = f"{type(exc).__name__}: {exc}"
            return row
        row[f"{call}_seconds"] = time.perf_counter() - t0
        row[f"{call}_residual"] = check(c)
        row[f"{call}_result"] = type(c).__module__.split(".")[0]
        row[f"{call}_stats"] = stats.as_dict()
    return row


def run_cell(cell: dict) -> dict:
    """The cell's row: the calls, then the references (ceiling, bare
    fp64-int8 product, transfer bound) measured in this process."""
    from summa.device.backend import cupy_available
    gpu = cupy_available()
    row = dict(cell, name=cell_name(cell), gpu=gpu)
    if cell["layout"] == "cupy":
        return cupy_cell(row) if gpu else dict(row, status="skipped",
                                               reason="CuPy operands need a GPU")
    if DTYPES[cell["dtype"]][1] and not gpu:
        return dict(row, status="skipped", reason="fp64-int8 needs a GPU (INT8 tensor cores)")
    row.update(_host_calls(cell, gpu))
    row.update(references(cell, gpu))
    row["status"] = "error" if "error" in row else "done"
    return row


def _host_calls(cell: dict, gpu: bool) -> dict:
    """Make the cell's fresh arrays, start CUDA, hold the GPU down to the
    budget, time the calls (:func:`timed_calls`); the arrays and the hold
    are gone on return, before the references."""
    t0 = time.perf_counter()
    a, b, trans, A, B = operands(cell)
    row = {"make_seconds": time.perf_counter() - t0, "cuda_init_seconds":
           calls.start_cuda(compute_dtype(cell["dtype"]))}
    holds = calls.hold_all_but(BUDGETS[cell["budget"]][0]) if gpu else []
    if gpu:
        import cupy as cp
        row["free_bytes"] = cp.cuda.runtime.memGetInfo()[0]  # what the call found
    try:
        options = dict(call_options(cell), **trans)
        row.update(timed_calls(a, b, options, calls.freivalds(A, B)))
        if cell.get("profile") and "error" not in row:
            row.update(predicted(a, b, options, cell["profile"]))
    finally:
        calls.release(holds)
    return row


def predicted(a, b, options: dict, profile: str) -> dict:
    """The model's seconds (by `profile`) for the plan of the calls just
    made: planned again beside them (the same operands, options and free
    memory), ``predicted_seconds`` and what bounds it; or ``model_error``."""
    import summa
    from summa.planning.prediction import predict_plan
    with summa.Matmul(a, b, **options) as product:
        prediction = predict_plan(product.plan, profile)
    if "error" in prediction:
        return {"model_error": prediction["error"]}
    return {"predicted_seconds": prediction["seconds"], "predicted_bound": prediction["bound"]}


def references(cell: dict, gpu: bool) -> dict:
    """The cell's references, on the whole GPU: ``ceiling_seconds`` (the
    dtype's matmul on device data; NumPy's on a CPU), for fp64-int8
    ``bare_seconds``, and ``transfer_seconds``: A and B up, C down at the
    rates of summa's own staged copies from pageable memory, measured here
    (the link's page-locked rates beside them, for the record)."""
    m, n, k = cell["m"], cell["n"], cell["k"]
    dtype = compute_dtype(cell["dtype"])  # (integers: float64's GEMM is their ceiling)
    if not gpu:
        return {"ceiling_seconds": _numpy_matmul_seconds(m, n, k, dtype)}
    refs = {"ceiling_seconds": calls.matmul_seconds(m, n, k, dtype)}
    if DTYPES[cell["dtype"]][1] == "fp64-int8":
        refs["bare_seconds"] = _bare_fp64_int8_seconds(m, n, k)
    import numpy as np
    size = np.dtype(dtype).itemsize
    moved = min(2 * GiB, max(64 << 20, (m * k + k * n + m * n) * size))
    up, down = _staged_rates(moved)
    pinned_up, pinned_down = _link_rates(moved)
    refs.update(staged_h2d_bytes_per_second=up, staged_d2h_bytes_per_second=down,
                h2d_bytes_per_second=pinned_up, d2h_bytes_per_second=pinned_down,
                transfer_seconds=(m * k + k * n) * size / up + m * n * size / down)
    return refs


def _numpy_matmul_seconds(m: int, n: int, k: int, dtype) -> float:
    """NumPy's matmul of C-ordered arrays: best of three (the CPU's ceiling)."""
    import numpy as np
    a, b = calls.fresh((m, k), dtype, 7), calls.fresh((k, n), dtype, 8)
    c = a @ b
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        np.matmul(a, b, out=c)
        times.append(time.perf_counter() - t0)
    return min(times)


def _bare_fp64_int8_seconds(m: int, n: int, k: int) -> float:
    """summa's fused fp64-int8 product on device data (as fp64_int8_speed.py
    times it): best of three after a first call."""
    import cupy as cp
    from summa.precision import ozaki_gpu
    from summa.device.backend import get_backend
    backend = get_backend("cupy")
    seconds = _bare_best(m, n, k, backend, ozaki_gpu)
    cp.get_default_memory_pool().free_all_blocks()
    return seconds


def _bare_best(m, n, k, backend, ozaki_gpu) -> float:
    """The faster of the fused product with its default scheme and as summa
    plans it on device data (``summa.matmul`` of CuPy arrays: the rows and
    the folds' integer products a pass that the free memory allows; float64
    40960³ on an H200 1.68 s against the default's 1.79)."""
    import cupy as cp
    import summa
    da, db = calls.device_random((m, k), "float64"), calls.device_random((k, n), "float64")
    dc = cp.empty((m, n))
    default = calls.best_device_seconds(
        lambda: ozaki_gpu.gemm(1.0, da, db, dc, backend=backend))
    planned = calls.best_device_seconds(
        lambda: summa.matmul(da, db, precision="fp64-int8", out=dc))
    return min(default, planned)


def _link_rates(nbytes: int = GiB) -> tuple[float, float]:
    """Bytes per second host→GPU and GPU→host between page-locked memory and
    the GPU (best of three of one `nbytes` copy each way)."""
    import cupy as cp
    import numpy as np
    pinned = cp.cuda.alloc_pinned_memory(nbytes)
    host = np.frombuffer(pinned, np.uint8, nbytes)
    host[:] = 1
    device = cp.empty(nbytes, np.uint8)
    up = calls.best_device_seconds(lambda: device.set(host))
    down = calls.best_device_seconds(lambda: device.get(out=host))
    return nbytes / up, nbytes / down


def _staged_rates(nbytes: int = 2 * GiB) -> tuple[float, float]:
    """Bytes per second host→GPU and GPU→host between fresh pageable NumPy
    memory and the GPU through summa's stager (its copy threads and
    page-locked ring, as every call from host arrays moves them): best of
    three of one `nbytes` copy each way. On the H200 machine this, not the
    page-locked rate, bounds a call from pageable arrays (host memory's
    bandwidth: each byte is read, written and read again by the DMA)."""
    import cupy as cp
    import numpy as np
    from summa.device.staging import stager_for
    stager = stager_for(cp.cuda.Device().id)
    host = np.ones((max(1, nbytes // (1 << 17)), 1 << 14))  # rows of 128 KiB, as a call's
    device = cp.empty(host.shape)
    up = calls.best_device_seconds(lambda: stager.upload(device, host).wait())
    down = calls.best_device_seconds(lambda: stager.download(host, device).wait())
    return host.nbytes / up, host.nbytes / down


def cupy_cell(row: dict) -> dict:
    """CuPy operands on the GPU: summa's call against ``cupy.matmul`` of
    the same arrays; "skipped" where summa refuses them (today's answer)."""
    import cupy as cp
    m, n, k = row["m"], row["n"], row["k"]
    row["cuda_init_seconds"] = calls.start_cuda()
    da, db = calls.device_random((m, k), "float64"), calls.device_random((k, n), "float64")
    on_host = calls.freivalds(cp.asnumpy(da), cp.asnumpy(db))
    row.update(timed_calls(da, db, {}, lambda c: on_host(cp.asnumpy(c)),
                           sync=cp.cuda.Device().synchronize))
    error = row.get("error", "")
    if "not an array" in error or "Implicit conversion" in error:
        return dict(row, status="skipped",
                    reason=f"summa refuses CuPy arrays today ({error[:160]})")
    dc = cp.empty((m, n))
    row["ceiling_seconds"] = calls.best_device_seconds(lambda: cp.matmul(da, db, out=dc))
    row["status"] = "error" if error else "done"
    return row


def warm_up(dtypes: list[str]) -> dict:
    """Small ``summa.matmul`` calls of each of `dtypes` in this (fresh)
    process, whole and in tiles, before any cell: a machine's once-only
    costs (CUDA's libraries read from disk, CuPy's kernels compiled into its
    cache) would otherwise fall on the first cell's first call (a fresh
    H200 machine's first cell, float64 32768³ under 8 GiB: 2.32 s, the same
    cell in the next process 1.49 s). Their seconds, per dtype."""
    import numpy as np
    import summa
    from summa.device.backend import cupy_available
    rng, row = np.random.default_rng(0), {"warm_up": True}
    for name in dtypes:
        dtype, precision = DTYPES[name]
        if precision and not cupy_available():
            continue
        a = rng.standard_normal((WARM_SIDE, WARM_SIDE)).astype(dtype)
        options = {"precision": precision} if precision else {}
        t0 = time.perf_counter()
        for budget in (None, WARM_BUDGET):
            summa.matmul(a, a, **options, **({"device_memory": budget} if budget else {}))
        row[name] = time.perf_counter() - t0
    return row


# -- the run: cells in fresh processes, on trees in turns ---------------------------------

def measure(cell: dict, folder: str, timeout: float, in_process: bool = False) -> dict:
    """The cell's row, from a fresh process with `folder` first on
    PYTHONPATH (or from this process); a crash, a timeout or no row is a row
    of status "error" or "timeout" with what the process said last."""
    if in_process:
        try:
            return run_cell(cell)
        except Exception as exc:  # noqa: BLE001 -- one cell's failure is its row
            return dict(cell, name=cell_name(cell), status="error",
                        error=f"{type(exc).__name__}: {exc}")
    rows = calls.in_fresh_process(__file__, ["--cell", json.dumps(cell)], folder, timeout)
    full = [r for r in rows if "status" in r]
    if full:
        return full[-1]
    failed = rows[-1]
    status = "timeout" if failed["error"].startswith("timeout") else "error"
    return dict(cell, name=cell_name(cell), status=status, error=failed["error"],
                tail=failed.get("tail", ""))


def load(path: str | None) -> list[dict]:
    """The rows a JSON-lines file holds (none where it does not exist)."""
    if not path or not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def run_matrix(chosen: list[dict], trees: dict, args) -> tuple[list[dict], list[str]]:
    """Measure `chosen` on `trees` in turns until done or the deadline;
    ``(rows, names of the cells not run)``. With ``--resume`` the rows
    ``--json`` holds count as done and come first."""
    records = load(args.json) if args.resume else []
    here = calls.stamps()["machine"]  # another machine's cells are not this one's
    done = {(r["name"], r.get("tree"), r.get("round", 0)) for r in records
            if r.get("machine", here) == here}
    todo = [(round_, cell, tree, folder)
            for round_, cell, tree, folder in calls.in_turns(chosen, trees, args.rounds)
            if (cell_name(cell), tree, round_) not in done]
    start = time.monotonic()
    if todo and not args.in_process:
        _warm_machine(chosen, trees, args.timeout)
    for i, (round_, cell, tree, folder) in enumerate(todo):
        left = args.deadline - (time.monotonic() - start) if args.deadline else float("inf")
        if left < LEAST_CELL_SECONDS:
            return records, [f"{cell_name(c)} [{t}]" for _, c, t, _ in todo[i:]]
        row = measure(cell, folder, min(args.timeout, left), args.in_process)
        if row["status"] == "timeout" and left < args.timeout:
            # cut by the deadline, not its own timeout: the next call runs it
            return records, [f"{cell_name(c)} [{t}]" for _, c, t, _ in todo[i:]]
        row.update(tree=tree, round=round_, time=time.time())
        records.append(row)
        calls.append_json(args.json, row)
        print(f"[{time.monotonic() - start:6.0f} s] {i + 1}/{len(todo)} {progress(row)}",
              flush=True)
    return records, []


def _warm_machine(chosen: list[dict], trees: dict, timeout: float) -> None:
    """:func:`warm_up` in a fresh process on each tree, for the dtypes of
    `chosen`; its seconds printed, nothing recorded (no cell's row)."""
    dtypes = ",".join(dict.fromkeys(c["dtype"] for c in chosen))
    for tree, folder in trees.items():
        t0 = time.monotonic()
        rows = calls.in_fresh_process(__file__, ["--warm-up", dtypes], folder, timeout)
        said = ", ".join(f"{k} {v:.1f} s" for k, v in rows[-1].items() if k != "warm_up") \
            if "warm_up" in rows[-1] else rows[-1].get("error", "")
        print(f"[warm-up {tree}] {time.monotonic() - t0:.1f} s: {said}", flush=True)


def progress(row: dict) -> str:
    """One line on a measured cell."""
    line = f"{row['name']} [{row.get('tree')}] {row['status']}"
    if "first_seconds" in row:
        line += f": first {row['first_seconds']:.3f} s"
    if "again_seconds" in row:
        line += f", again {row['again_seconds']:.3f} s"
    if row.get("ceiling_seconds") and row.get("again_seconds"):
        line += f", ceiling ÷ again {row['ceiling_seconds'] / row['again_seconds']:.3f}"
    if "again_residual" in row:
        line += f", residual {_worst_residual(row):.2g}"
    for key in ("reason", "error"):
        if row.get(key):
            line += f" ({row[key][:200]})"
    return line


# -- the verdict --------------------------------------------------------------------------

def _worst_residual(row: dict) -> float:
    """The largest of the row's calls' residuals (first, again, into out=)."""
    return max(row.get(f"{call}_residual", 0.0) for call in ("first", "again", "reused"))


def best_of_rounds(records: list[dict]) -> list[dict]:
    """One row per cell, tree and machine (a figure is never another
    machine's): the least seconds over rounds (the references' too), the
    largest residuals, the first error."""
    merged = {}
    for r in records:
        key = (r["name"], r.get("tree"), r.get("machine"))
        if key not in merged:
            merged[key] = dict(r)
            continue
        m = merged[key]
        for field in ("first_seconds", "again_seconds", "reused_seconds", "ceiling_seconds",
                      "bare_seconds", "transfer_seconds"):
            if field in r:
                m[field] = min(m.get(field, float("inf")), r[field])
        for field in ("first_residual", "again_residual", "reused_residual"):
            if field in r:
                m[field] = max(m.get(field, 0.0), r[field])
        if r["status"] != "done" and m["status"] == "done":
            m.update(status=r["status"], error=r.get("error"), reason=r.get("reason"))
    return list(merged.values())


def goals(row: dict, c_rows: dict) -> list[tuple]:
    """``(reference, its seconds, least ratio first, least ratio again)``
    for each goal of a measured GPU cell: reference seconds ÷ the call's
    seconds must reach the least ratio. The reference "C" is the C cell of
    the same dtype, budget, shape and tree (a row of `c_rows`, keyed so),
    its first call against this one's, and again against again."""
    dtype, layout = row["dtype"], row["layout"]
    shape = (row["m"], row["n"], row["k"])
    if layout == "cupy":
        return [("cupy", row.get("ceiling_seconds"), 0.95, 0.95)]
    transfer = row.get("transfer_seconds", 0)
    if DTYPES[dtype][1] == "fp64-int8":  # its own product, or the link where that is slower
        found = [("bare", row.get("bare_seconds"), 0.8, 0.8)] if not \
            transfer > row.get("bare_seconds", 0) else [("bound", transfer, 0.8, 0.8)]
    elif transfer > row.get("ceiling_seconds", 0):  # bound by the link, not the GEMM
        found = [("bound", transfer, 0.8, 0.8)]
    elif min(shape) >= GEMM_BOUND:
        first = 0.88 if layout == "C" and dtype in ("float64", "float32") else 0.85
        found = [("ceiling", row.get("ceiling_seconds"), first, 0.9)]
    else:
        found = []
    if layout in ("F", "T", "trans"):
        c_row = c_rows.get((dtype, row["budget"], shape, row.get("tree"), row.get("machine")))
        found.append(("C", c_row, 1 / 1.1, 1 / 1.1))
    return found


def model_verdict(row: dict) -> tuple[bool, str]:
    """``(within, what it says)`` of a cell measured with ``--profile``:
    the model's time ÷ the again call's, within :data:`MODEL_TOLERANCE`."""
    if "model_error" in row:
        return False, f"model: {row['model_error'][:60]}"
    ratio = row["predicted_seconds"] / row["again_seconds"]
    return abs(ratio - 1) <= MODEL_TOLERANCE, (f"model÷again {ratio:.3f} ({row['predicted_bound']}"
                                               f"; within {MODEL_TOLERANCE:.0%})")


def verdict(row: dict, c_rows: dict) -> tuple[str, str]:
    """``(result, what it was judged by)``: PASS, FAIL or skip."""
    if row["status"] == "skipped":
        return "skip", row.get("reason", "")
    if row["status"] != "done":
        return "FAIL", f"{row['status']}: {row.get('error', '')}"
    if _worst_residual(row) > 1:
        return "FAIL", "wrong product (residual > 1)"
    if not row.get("gpu"):
        return "PASS", "values (no GPU: times not judged)" + (
            f"; {model_verdict(row)[1]}" if row.get("profile") else "")
    if row["layout"] == "cupy" and row.get("again_result") != "cupy":
        return "FAIL", f"returned {row.get('again_result')} arrays, not CuPy's"
    if min(row["m"], row["n"], row["k"]) < TIMED_SIDE:
        return "PASS", f"values (under {TIMED_SIDE} a side: times not judged)"
    ok, said = True, []
    for name, ref, least_first, least_again in goals(row, c_rows):
        refs = (ref.get("first_seconds"), ref.get("again_seconds")) if isinstance(ref, dict) \
            else (ref, ref)
        if None in refs:
            said.append(f"{name}: not measured")
            continue
        first, again = refs[0] / row["first_seconds"], refs[1] / row["again_seconds"]
        ok &= first >= least_first and again >= least_again
        said.append(f"{name}÷t {first:.3f}/{again:.3f} (≥ {least_first:.2f}/{least_again:.2f})")
    if row.get("profile"):
        within, says = model_verdict(row)
        ok &= within
        said.append(says)
    return ("PASS" if ok else "FAIL"), "; ".join(said) or "values"


def table(records: list[dict], not_run: list[str]) -> int:
    """Print one line per cell and tree (with several trees, each one's
    again ÷ the first tree's); return how many failed."""
    rows = sorted(best_of_rounds(records), key=lambda r: str(r.get("machine") or ""))
    machines = list(dict.fromkeys(r.get("machine") for r in rows))
    c_rows = {(r["dtype"], r["budget"], (r["m"], r["n"], r["k"]), r.get("tree"),
               r.get("machine")): r
              for r in rows if r["layout"] == "C" and r["status"] == "done"}
    trees = list(dict.fromkeys(r.get("tree") for r in rows))
    firsts = {(r["name"], r.get("machine")): r.get("again_seconds")
              for r in rows if r.get("tree") == trees[0]} if len(trees) > 1 else {}
    print(f"\n{'cell':<36}{'tree':>8}{'first s':>9}{'again s':>9}{'out= s':>9}{'ceil÷t':>14}"
          f"{'÷' + str(trees[0]) if firsts else '':>9}  {'result':<6} goals")
    failed, machine = 0, object()
    for row in rows:
        if len(machines) > 1 and row.get("machine") != machine:  # each machine's own
            machine = row.get("machine")
            print(f"-- {machine or 'machine not recorded'}")
        result, why = verdict(row, c_rows)
        failed += result == "FAIL"
        first, again = row.get("first_seconds"), row.get("again_seconds")
        ceiling, base = row.get("ceiling_seconds"), firsts.get((row["name"], row.get("machine")))
        ratio = f"{ceiling / first:.3f}/{ceiling / again:.3f}" if ceiling and first and again \
            else ""
        versus = f"{again / base:.3f}" if base and again else ""
        times = "".join(f"{x:>9.3f}" if x is not None else f"{'':>9}"
                        for x in (first, again, row.get("reused_seconds")))
        tree = str(row.get("tree")) if len(trees) > 1 else ""
        print(f"{row['name']:<36}{tree:>8}{times}{ratio:>14}{versus:>9}  {result:<6} "
              f"{why[:160]}")
    if not_run:
        print(f"\nnot run before the deadline ({len(not_run)}): {', '.join(not_run)}; "
              "run the same command again with --resume")
    print(f"\n{len(rows)} cells: {failed} FAIL", flush=True)
    return failed


def main(argv=None) -> int:
    """The command line (``--help``); 0, or 1 where ``--report`` finds a FAIL."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Presets (options given on the command line win): " +
                                "; ".join(f"--{name}: " + ", ".join(f"{k} {v}" for k, v in
                                                                    preset.items())
                                          for name, preset in PRESETS.items()
                                          if name != "default"))
    p.add_argument("--dtypes", help=f"comma-separated of {', '.join(DTYPES)} (default: all)")
    p.add_argument("--layouts", help=f"comma-separated of {', '.join(LAYOUTS)} "
                   f"(default: {PRESETS['default']['layouts']})")
    p.add_argument("--budgets", help=f"comma-separated of {', '.join(BUDGETS)} (default: all)")
    p.add_argument("--sizes", help="comma-separated N or MxNxK (default: 16384)")
    p.add_argument("--quick", action="store_true", help="the quick preset (GPU smoke run)")
    p.add_argument("--cpu-sized", action="store_true", help="the CPU-sized preset")
    p.add_argument("--tree", action="append", default=[], metavar="NAME=DIR",
                   help="a source tree to time (repeat; default: this checkout as 'here')")
    p.add_argument("--rounds", type=int, default=1, help="rounds over the cells (best kept)")
    p.add_argument("--timeout", type=float, default=150, help="seconds per cell (default 150)")
    p.add_argument("--deadline", type=float, default=480,
                   help="start no cell after this many seconds (default 480; 0: none)")
    p.add_argument("--json", help="append one JSON line per cell to this file")
    p.add_argument("--resume", action="store_true",
                   help="skip the cells --json already holds; its rows join the table")
    p.add_argument("--in-process", action="store_true",
                   help="every cell in this process (tests; first calls are not first)")
    p.add_argument("--profile", metavar="FILE",
                   help="a model profile (summa calibrate's): each cell also records the "
                        "model's time for the plan its calls ran, and is judged within "
                        f"{MODEL_TOLERANCE * 100:g} %% of its again call")
    p.add_argument("--report", metavar="FILE", help="print the table of FILE's rows, run nothing")
    p.add_argument("--cell", help=argparse.SUPPRESS)  # one cell, in this (fresh) process
    p.add_argument("--warm-up", help=argparse.SUPPRESS)  # the machine's, in a fresh process
    args = p.parse_args(argv)
    if args.cell:
        calls.emit(run_cell(json.loads(args.cell)))
        return 0
    if args.warm_up:
        calls.emit(warm_up(args.warm_up.split(",")))
        return 0
    if args.report:
        return 1 if table(load(args.report), []) else 0
    chosen, trees = selection(p, args)
    if args.in_process:
        sys.path.insert(0, calls.ROOT)  # this checkout's summa, as a fresh process's tree
    records, not_run = run_matrix(chosen, trees, args)
    table(records, not_run)
    # a cell that raised or timed out is a measurement missing (a goal missed is not)
    return 1 if any(r.get("status") in ("error", "timeout") for r in records) else 0


def selection(parser, args) -> tuple[list[dict], dict]:
    """The cells and trees the command line asks for (a usage error where
    it names what is not there)."""
    preset = PRESETS["quick" if args.quick else "cpu-sized" if args.cpu_sized else "default"]
    picked = {}
    for option, known in (("dtypes", DTYPES), ("layouts", LAYOUTS), ("budgets", BUDGETS)):
        names = [x for x in (getattr(args, option) or preset[option]).split(",") if x]
        unknown = sorted(set(names) - set(known))
        if unknown:
            parser.error(f"unknown {option}: {', '.join(unknown)}")
        picked[option] = names
    try:
        sizes = [calls.parse_size(x) for x in (args.sizes or preset["sizes"]).split(",") if x]
        trees = calls.parse_trees(args.tree)
    except ValueError as exc:
        parser.error(str(exc))
    if args.in_process and args.tree:
        parser.error("--in-process runs this checkout only (no --tree)")
    if args.profile and not os.path.isfile(args.profile):
        parser.error(f"--profile {args.profile}: no such file")
    chosen = cells(picked["dtypes"], picked["layouts"], picked["budgets"], sizes)
    if args.profile:  # each cell's process predicts by it (the cell's name leaves it out)
        chosen = [dict(cell, profile=os.path.abspath(args.profile)) for cell in chosen]
    return chosen, trees


if __name__ == "__main__":
    sys.exit(main())
