"""What the guard (``user_calls.py``) and the matrix (``matrix.py``) share:
one case in a fresh process on a chosen source tree, cases on several trees
in turns, the GPU held down to what a smaller card has free, CUDA's start
timed apart from the call, and a sampled check of the product.

A case's process prints each result as a line ``ROW {json}`` (:func:`emit`);
:func:`in_fresh_process` starts it and reads those lines back, so a case
that crashes, hangs or runs out of memory costs one row, not the run.
Nothing here imports CuPy or summa at module level: the scripts that use it
answer ``--help`` on any machine.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GiB = 1 << 30
#: What a case's process prints before each of its results.
ROW = "ROW "


def emit(row: dict) -> None:
    """Print `row` for :func:`in_fresh_process` to read back."""
    print(ROW + json.dumps(row), flush=True)


def parse_trees(specs: list[str]) -> dict:
    """``{name: folder}`` from ``NAME=DIR`` arguments (default: this checkout
    as "here")."""
    trees = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"--tree takes NAME=DIR, got {spec!r}")
        trees[name] = path
    return trees or {"here": ROOT}


def in_turns(names: list, trees: dict, rounds: int):
    """``(round, name, tree, folder)`` for every case on every tree, the
    trees' order reversed every other round so that drift over the run
    (a GPU warming up, the host's caches) falls on each alike."""
    for round_ in range(rounds):
        order = list(trees.items())[:: 1 if round_ % 2 == 0 else -1]
        for name in names:
            for tree, folder in order:
                yield round_, name, tree, folder


def in_fresh_process(script: str, args: list[str], tree: str, timeout: float) -> list[dict]:
    """Run ``python SCRIPT ARGS`` with `tree` first on PYTHONPATH and return
    the rows it emitted; one row ``{"error": ...}`` where it failed or
    emitted nothing, ``{"error": "timeout ..."}`` where it ran past
    `timeout` seconds (its whole process group is killed: a pool's workers
    too)."""
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree) + os.pathsep
               + os.environ.get("PYTHONPATH", ""), PYTHONUNBUFFERED="1")
    # One GPU, as the references are (one GPU's cupy.matmul): on a machine of
    # several, summa.matmul's pool takes them all (on two H200s the matrix's
    # cells read 1.07-1.23 x the one-GPU ceiling). CUDA_VISIBLE_DEVICES set
    # by the caller is kept.
    env.setdefault("CUDA_VISIBLE_DEVICES", "0")
    # Out of the checkout: `import summa` must find the tree's, not the folder's.
    child = subprocess.Popen([sys.executable, os.path.abspath(script), *args], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             stdin=subprocess.DEVNULL, cwd=tempfile.gettempdir(),
                             start_new_session=True)
    try:
        out, err = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        out, err = child.communicate()
        rows = _rows(out)
        return rows + [{"error": f"timeout after {timeout:.0f} s", "tail": err[-2000:]}]
    rows = _rows(out)
    if child.returncode != 0 or not rows:
        rows.append({"error": f"exit status {child.returncode}",
                     "tail": (err or out)[-2000:]})
    return rows


def _rows(out: str) -> list[dict]:
    return [json.loads(line[len(ROW):]) for line in out.splitlines() if line.startswith(ROW)]


def parse_size(text: str) -> tuple[int, int, int]:
    """``(m, n, k)`` from ``"N"`` or ``"MxNxK"``."""
    parts = [int(x) for x in text.lower().split("x")]
    if len(parts) == 1:
        parts *= 3
    if len(parts) != 3 or min(parts) < 1:
        raise ValueError(f"a size is N or MxNxK, got {text!r}")
    return tuple(parts)


#: What :func:`stamps` adds to every record: which machine, when, by which command.
STAMPS = ("machine", "date", "command")


def append_json(path: str | None, row: dict) -> None:
    """Append `row` to the JSON-lines file `path` (nothing for None), stamped
    with the machine, date and command (:func:`stamps`) that report.py
    puts above its table. Every script's ``--json`` writes through here.
    The stamp names this process's command; a row's own ``command`` or
    ``date`` (as the records ``python -m summa bench`` writes carry) that
    differs is kept as ``own_command`` or ``own_date``."""
    if path:
        stamp = stamps()
        own = {f"own_{key}": row[key] for key in STAMPS
               if key in row and row[key] != stamp[key]}
        with open(path, "a") as f:
            f.write(json.dumps({**row, **own, **stamp}) + "\n")


def stamps() -> dict:
    """Where and when this process measured: ``machine`` (cores, host
    memory, the GPUs: CuPy's where this process loaded it, else what
    ``nvidia-smi`` lists), ``date`` (UTC) and ``command``."""
    return {"machine": _machine(), "date": time.strftime("%Y-%m-%d", time.gmtime()),
            "command": " ".join(["python3", *sys.argv])}


def _machine() -> str:
    machine = f"{os.cpu_count()} cores"
    try:
        machine += f", {os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB"
    except (ValueError, OSError):
        pass
    gpus = _gpus()
    return f"{gpus}, {machine}" if gpus else machine


def _gpus() -> str | None:
    """The GPUs as ``name x count``: CuPy's where this process loaded it (no
    CUDA start for a stamp), else ``nvidia-smi``'s (a parent whose cases ran
    in processes of their own), else None."""
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        try:
            return (cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
                    + f" x {cupy.cuda.runtime.getDeviceCount()}")
        except Exception:  # noqa: BLE001 -- a stamp never fails the record
            pass
    global _LISTED
    if _LISTED is None:
        _LISTED = ""
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=20)
            names = [line.strip() for line in out.stdout.splitlines() if line.strip()]
            if out.returncode == 0 and names:
                _LISTED = f"{names[0]} x {len(names)}"
        except (OSError, subprocess.SubprocessError):
            pass
    return _LISTED or None


_LISTED: str | None = None  # nvidia-smi's answer, asked once a process


def hold_all_but(want: int | None, gpus: int = 1, devices=None) -> list:
    """Take all but `want` bytes of each of the first `gpus` GPUs (or of
    `devices`), outside CuPy's pool, so that only `want` stays free to this
    process and any it starts, as on a 24 GB card; nothing for None. The
    ``(device, pointer)`` pairs to give back (:func:`release`)."""
    if want is None:
        return []
    import cupy as cp
    holds = []
    for device in (range(gpus) if devices is None else devices):
        with cp.cuda.Device(device):
            free_now = cp.cuda.runtime.memGetInfo()[0]
            if free_now > want:
                holds.append((device, cp.cuda.runtime.malloc(free_now - want)))
    return holds


def release(holds: list) -> None:
    """Give back what :func:`hold_all_but` took."""
    if holds:
        import cupy as cp
        for device, pointer in holds:
            with cp.cuda.Device(device):
                cp.cuda.runtime.free(pointer)


def fill(x, seed: int, threads: int = 16) -> None:
    """Fill the 2-D NumPy array `x` (any strides; both parts of complex
    values) with uniform [-1, 1) values (integers: below 2**10 in
    magnitude), 1024 rows at a time on `threads`
    threads: a fresh array's first touch runs at 2.4 GB/s on one thread, 32
    on 16 (docs/benchmarks.md, "Host↔GPU copies")."""
    from concurrent.futures import ThreadPoolExecutor
    import numpy as np
    real = x.real.dtype
    rows = [(r, min(r + 1024, x.shape[0])) for r in range(0, x.shape[0], 1024)]

    def one(i):
        r0, r1 = rows[i]
        rng = np.random.default_rng([seed, i])
        part = x[r0:r1]
        if x.dtype.kind in "iu":  # integers below 2**10: exact float64 sums to K = 2**33
            part[...] = rng.integers(0 if x.dtype.kind == "u" else -1023, 1024, part.shape)
            return
        if part.flags.c_contiguous:  # straight into the array, no temporary
            flat = part.view(real) if x.dtype.kind == "c" else part
            rng.random(out=flat, dtype=real)
            flat *= 2
            flat -= 1
            return
        values = rng.random(part.shape, dtype=real) * 2 - 1
        if x.dtype.kind == "c":
            values = values + 1j * (rng.random(part.shape, dtype=real) * 2 - 1)
        part[...] = values
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, range(len(rows))))


def fresh(shape, dtype, seed: int):
    """A fresh pageable C-ordered array of uniform [-1, 1) values (:func:`fill`)."""
    import numpy as np
    x = np.empty(shape, dtype=dtype)
    fill(x, seed)
    return x


def start_cuda(dtype: str = "float64") -> float:
    """Seconds to start CUDA and cuBLAS's GEMMs of `dtype` in this process (0
    where there is no GPU): the process's cost, not the call's, so
    first-call figures leave it out. A process's first GEMM of a dtype
    loads its kernels whatever the shape (H200, float32 32768 x 32768 x
    4096: 0.49 s first against 0.165 again, 0.172 after one 256² product
    that itself took 0.21 s); ``cupy.matmul``'s own first product pays it
    too."""
    t0 = time.perf_counter()
    try:
        import cupy as cp
        cp.cuda.runtime.getDeviceCount()
        (cp.ones((64, 64)) @ cp.ones((64, 64))).get()
        if dtype != "float64":
            (cp.ones((64, 64), dtype) @ cp.ones((64, 64), dtype)).get()
    except Exception:  # no CuPy or no GPU: the call runs on the CPU
        return 0.0
    return time.perf_counter() - t0


def freivalds(a, b, rows: int = 512):
    """``check(c)``: Freivalds' scaled residual of `c` against ``a @ b``
    (<= 1 passes) on `rows` random rows of C, in float64 (complex128 for
    complex data). `b` is read on the first check only (two passes: ``b x``
    and ``|b| |x|``), so checking a second product costs a few rows of `a`
    and `c`; whole-array passes cost more than the multiply (a check of
    every row of a 40960² product took a minute on one thread). Any memory
    layout; NumPy arrays; `c` may be a stack of parts of the product (a C
    array whose rows, in order, are its rows); integers judged at float64's
    rounding of the check itself."""
    import numpy as np
    rng = np.random.default_rng()
    x = rng.uniform(-1, 1, b.shape[1])
    products = []

    def b_times_x():
        wide = np.result_type(b.dtype, np.float64)
        bx, bx_abs = np.empty(b.shape[0], wide), np.empty(b.shape[0])
        for r in range(0, b.shape[0], 4096):
            block = b[r:r + 4096].astype(wide, copy=False)
            bx[r:r + 4096], bx_abs[r:r + 4096] = block @ x, np.abs(block) @ np.abs(x)
        return bx, bx_abs

    def check(c) -> float:
        if not products:
            products.extend(b_times_x())
        bx, bx_abs = products
        c = c.reshape(-1, c.shape[-1])  # (a stack's products: the rows of one product)
        wide = np.result_type(c.dtype, np.float64)
        pick = np.sort(rng.choice(c.shape[0], min(rows, c.shape[0]), replace=False))
        sa, sc = a[pick].astype(wide), c[pick].astype(wide)
        eps = np.finfo(c.dtype if c.dtype.kind in "fc" else wide).eps  # (integers: exact)
        gauge = (a.shape[1] + 2) * eps * (np.abs(sa) @ bx_abs) + 1e-300
        return float(np.max(np.abs(sc @ x - sa @ bx) / gauge, initial=0.0))
    return check


def residual(c, a, b, rows: int = 512) -> float:
    """:func:`freivalds`'s residual of one product `c` of `a` and `b`."""
    return freivalds(a, b, rows)(c)


def best_device_seconds(fn, repeat: int = 3, synchronize=None) -> float:
    """Best of `repeat` timed calls of `fn` (device work, waited for by
    `synchronize`, default the current CuPy device's), after one untimed
    call that loads its kernels."""
    if synchronize is None:
        import cupy as cp
        synchronize = cp.cuda.Device().synchronize
    fn()
    times = []
    for _ in range(repeat):
        synchronize()
        t0 = time.perf_counter()
        fn()
        synchronize()
        times.append(time.perf_counter() - t0)
    return min(times)


def device_random(shape, dtype, xp=None):
    """An array of `xp` (CuPy, or NumPy: a backend's ``xp``; default CuPy)
    of uniform [-1, 1) values (both parts, for complex)."""
    import numpy as np
    if xp is None:
        import cupy as xp
    dtype = np.dtype(dtype)
    real = np.empty(0, dtype).real.dtype
    rng = xp.random.default_rng()
    x = rng.random(shape, dtype=real) * 2 - 1
    if dtype.kind == "c":
        x = x + 1j * (rng.random(shape, dtype=real) * 2 - 1)
    return x.astype(dtype, copy=False)


def matmul_seconds(m: int, n: int, k: int, dtype) -> float:
    """Seconds of ``cupy.matmul`` of device data of uniform [-1, 1) values,
    (m x k) @ (k x n), best of three after a first call (which loads its
    kernels); the memory goes back to the device afterwards."""
    import cupy as cp
    seconds = _matmul_best(m, n, k, dtype)  # its arrays are gone on return
    cp.get_default_memory_pool().free_all_blocks()
    return seconds


def _matmul_best(m: int, n: int, k: int, dtype) -> float:
    import cupy as cp
    da, db = device_random((m, k), dtype), device_random((k, n), dtype)
    dc = da @ db
    return best_device_seconds(lambda: cp.matmul(da, db, out=dc))
