"""Never out of memory: a notebook's sequence of calls in one process, the
GPU's free memory changing between them, each call's measured device peak
against its plan's.

The calls (fresh pageable NumPy arrays unless said; one GPU):

* float64, float32, a Fortran-ordered float64, complex128 and fp64-int8
  products of ``--size`` (complex128: 0.6 of it), the whole GPU free;
* the same float64 and fp64-int8 products with 24 GiB free, then 8 GiB;
* fp64-int8 with the whole GPU again, after all of those (the call that ran
  out of memory after a dozen others);
* under 24 GiB: a stack ``(3, s, s) @ (s, s)``, an int32 product, two
  float64 products and a ``summa.Matmul`` made and executed after them;
* a ``summa.Matmul`` planned with 40 GiB free and executed with 16 GiB
  (re-planned, with a RuntimeWarning, or refused with one clear error);
* CuPy operands on the GPU (one GEMM where they lie), the whole GPU free;
* a product during which a second process takes half the GPU's free
  memory: it completes, or fails with summa's one-line
  :class:`MemoryError`, never CuPy's.

"Free" is what this process may use: the GPU's unused memory and what
CuPy's pool caches unused (a ballast outside the pools holds the rest, as
another process would). Each call records the plan's device peak
(``device_planned``), the account's high-water mark (``device_peak``,
:mod:`summa.device.account`), what the GPU lost outside CuPy's pools
during the call (libraries' own memory), its seconds, and whether it
failed and how. Exit status 1 where a call ran out of memory with CuPy's
error, or took more than its plan said.

    python3 benchmarks/memory_sequence.py [--size 40960] [--whole 78GiB] [--last] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import warnings

import calls  # JSON lines stamped with machine, date, command

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GIB = 2 ** 30
SMALL_DRAWS = 1 << 20  # summa.device.account.SMALL_DRAWS: CuPy's scalars beside a plan


class Gpu:
    """The GPU's memory as this process sees it, and a ballast outside
    CuPy's pools that leaves only so much free."""

    def __init__(self, whole: int | None = None):
        import cupy as cp
        self.cp, self.held, self.whole = cp, None, whole

    def free(self) -> int:
        cp = self.cp
        return cp.cuda.runtime.memGetInfo()[0] + cp.get_default_memory_pool().free_bytes()

    def leave(self, want: int | None) -> None:
        """Hold all but `want` bytes free (None: the whole GPU, or as much
        as ``--whole`` says)."""
        cp = self.cp
        if self.held is not None:
            cp.cuda.runtime.free(self.held)
            self.held = None
        # (what the pool caches unused it gives back to a call that needs it;
        # the ballast, standing for another process, takes only the rest)
        cp.get_default_memory_pool().free_all_blocks()
        want = self.whole if want is None else want
        if want is None:
            return
        take = self.free() - want
        if take > 0:
            self.held = cp.cuda.runtime.malloc(take)

    def outside_pools(self) -> int:
        """Bytes of the GPU in use outside CuPy's pools (the context, the
        libraries' own memory, the ballast)."""
        cp = self.cp
        free, total = cp.cuda.runtime.memGetInfo()
        return total - free - cp.get_default_memory_pool().total_bytes()


def host(shape, dtype, seed: int):
    """A fresh pageable array of random values, made on the GPU a slab of
    rows at a time (fast, and within the little room a ballast leaves: a
    whole 32768² float64 operand and uniform's temporaries ran out of memory
    beside a ballast leaving 24 GiB and the pool's cached blocks)."""
    import cupy as cp
    import numpy as np
    rng = cp.random.default_rng(seed)
    x = np.empty(shape, dtype)
    rows = x.reshape(-1, shape[-1])
    step = max(1, (256 << 20) // (shape[-1] * 16))
    for r in range(0, rows.shape[0], step):
        part = (min(step, rows.shape[0] - r), shape[-1])
        if np.dtype(dtype).kind == "c":
            rows.real[r:r + part[0]] = rng.uniform(-1, 1, part).get()
            rows.imag[r:r + part[0]] = rng.uniform(-1, 1, part).get()
        elif np.dtype(dtype).kind == "i":
            rows[r:r + part[0]] = rng.integers(-512, 512, part).get()
        else:
            rows[r:r + part[0]] = rng.uniform(-1, 1, part).astype(dtype).get()
    cp.get_default_memory_pool().free_all_blocks()
    return x


def sampled_error(a, b, c, trans_b=False) -> float:
    """Largest relative error of 64 sampled rows of `c` against NumPy."""
    import numpy as np
    rows = np.random.default_rng(0).choice(a.shape[-2], 64, replace=False)
    ref = np.asarray(a[..., rows, :], np.float64 if a.dtype.kind != "c" else np.complex128) \
        @ np.asarray(b, np.float64 if b.dtype.kind != "c" else np.complex128)
    got = np.asarray(c[..., rows, :])
    return float(np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-300))


def call(gpu: Gpu, label: str, fn, free: int | None) -> dict:
    """Run `fn` (returns ``(product, stats)``) with `free` bytes left,
    recording what it planned, drew and lost outside the pools."""
    import cupy as cp
    gpu.leave(free)
    row = {"call": label, "free_gib": round(gpu.free() / GIB, 2)}
    outside = gpu.outside_pools()
    began = time.perf_counter()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _, stats, error = fn()
        row["warnings"] = [str(w.message)[:160] for w in caught
                           if issubclass(w.category, RuntimeWarning)]
        row["error"] = None if error is None else round(error, 16)
        extra = stats.extra if stats is not None else {}
        row.update(device_planned=extra.get("device_planned"),
                   device_peak=extra.get("device_peak"))
    except cp.cuda.memory.OutOfMemoryError as exc:
        row["failed"] = f"CuPy OutOfMemoryError: {exc}"[:300]
    except MemoryError as exc:
        row["failed"] = f"summa {type(exc).__name__}: {exc}"[:300]
    except ValueError as exc:
        row["refused"] = str(exc)[:300]
    row["seconds"] = round(time.perf_counter() - began, 3)
    row["outside_pools_gib"] = round((gpu.outside_pools() - outside) / GIB, 3)
    cp.cuda.runtime.deviceSynchronize()
    return row


def product(a, b, **kwargs):
    """``summa.matmul(a, b, **kwargs)`` with its stats and sampled error."""
    import summa
    from summa.execution.algorithm import SummaStats
    stats = SummaStats()
    c = summa.matmul(a, b, stats=stats, **kwargs)
    return c, stats, sampled_error(a, b, c)


def executed(matmul, a, b):
    """A Matmul's execution (made for `a` and `b`) with its stats and
    sampled error."""
    c = matmul.execute()
    return c, matmul.stats, sampled_error(a, b, c)


def taker(nbytes: int, after: float) -> subprocess.Popen:
    """A second process that takes `nbytes` of the GPU `after` seconds from
    now and holds them for 20 s."""
    code = ("import time, cupy; time.sleep(%r); p = cupy.cuda.runtime.malloc(%d); "
            "print('taken', flush=True); time.sleep(20)") % (after, nbytes)
    return subprocess.Popen([sys.executable, "-c", code])


def sequence(n: int, whole: int | None = None, last: bool = False) -> list:
    """The calls in order (`last`: from the stack on, the earlier calls left out)."""
    import numpy as np
    gpu, rows = Gpu(whole), []
    a, b = host((n, n), np.float64, 1), host((n, n), np.float64, 2)

    def run(label, fn, free=None):
        rows.append(call(gpu, label, fn, free))
        print(json.dumps(rows[-1]), flush=True)

    if not last:
        _first_calls(run, a, b, n)
    _last_calls(run, gpu, a, b, n)
    return rows


def _first_calls(run, a, b, n: int) -> None:
    """The float64, float32, Fortran, complex128 and fp64-int8 calls, the
    whole GPU free, then under 24 and 8 GiB, then fp64-int8 whole again."""
    import numpy as np
    run("float64", lambda: product(a, b))
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    run("float32", lambda: product(a32, b32))
    del a32, b32
    af = np.asfortranarray(a)
    run("float64 a Fortran", lambda: product(af, b))
    del af
    nc = int(0.6 * n) // 256 * 256
    ac, bc = host((nc, nc), np.complex128, 3), host((nc, nc), np.complex128, 4)
    run(f"complex128 {nc}", lambda: product(ac, bc))
    del ac, bc
    run("fp64-int8", lambda: product(a, b, precision="fp64-int8"))
    for free in (24 * GIB, 8 * GIB):
        run(f"float64 {free // GIB} GiB", lambda: product(a, b), free)
        run(f"fp64-int8 {free // GIB} GiB", lambda: product(a, b, precision="fp64-int8"), free)
    run("fp64-int8 whole GPU, after the others", lambda: product(a, b, precision="fp64-int8"))


def _last_calls(run, gpu, a, b, n: int) -> None:
    """A stack, int32, float64 under 24 GiB, Matmuls planned and run under
    other free memory, CuPy operands, a second process taking memory."""
    import numpy as np
    import cupy as cp
    import summa
    s = n * 3 // 10 // 256 * 256
    stack, bs = host((3, s, s), np.float64, 5), host((s, s), np.float64, 6)
    run(f"stack (3, {s}, {s}) 24 GiB", lambda: product(stack, bs), 24 * GIB)
    del stack, bs
    ni = n * 4 // 10 // 256 * 256
    ai, bi = host((ni, ni), np.int32, 7), host((ni, ni), np.int32, 8)
    run(f"int32 {ni} 24 GiB", lambda: product(ai, bi), 24 * GIB)
    del ai, bi
    m = n * 8 // 10 // 256 * 256
    am, bm = host((m, m), np.float64, 9), host((m, m), np.float64, 10)
    run(f"float64 {m} 24 GiB", lambda: product(am, bm), 24 * GIB)
    run(f"float64 {m} 24 GiB again", lambda: product(am, bm), 24 * GIB)
    gpu.leave(24 * GIB)
    matmul = summa.Matmul(am, bm)
    run(f"Matmul {m} 24 GiB", lambda: executed(matmul, am, bm), 24 * GIB)
    matmul.free()
    gpu.leave(40 * GIB)
    matmul = summa.Matmul(am, bm)
    run(f"Matmul {m} planned at 40 GiB, run at 16 GiB", lambda: executed(matmul, am, bm), 16 * GIB)
    matmul.free()
    del am, bm
    gpu.leave(None)
    nd = n * 4 // 10 // 256 * 256
    ad, bd = cp.asarray(host((nd, nd), np.float64, 11)), cp.asarray(host((nd, nd), np.float64, 12))

    def on_gpu():
        from summa.execution.algorithm import SummaStats
        stats = SummaStats()
        c = summa.matmul(ad, bd, stats=stats)
        err = float(cp.abs(c[:64] - ad[:64] @ bd).max() / cp.abs(c[:64]).max())
        return c, stats, err
    run(f"CuPy {nd}", on_gpu)
    del ad, bd
    cp.get_default_memory_pool().free_all_blocks()
    gpu.leave(None)
    other = taker(gpu.free() // 2, after=1.0)
    try:
        run("fp64-int8, half the GPU taken mid-call",
            lambda: product(a, b, precision="fp64-int8"))
    finally:
        other.kill()
        other.wait()
    gpu.leave(None)


def verdict(rows: list) -> list:
    """The calls that broke the promise."""
    bad = []
    for r in rows:
        if r.get("failed", "").startswith("CuPy"):
            bad.append(f"{r['call']}: {r['failed']}")
        elif r.get("device_peak") and r.get("device_planned") \
                and r["device_peak"] > r["device_planned"] + SMALL_DRAWS:
            bad.append(f"{r['call']}: drew {r['device_peak'] / GIB:.2f} GiB, planned "
                       f"{r['device_planned'] / GIB:.2f}")
    return bad


def table(rows: list) -> None:
    print(f"{'call':48} {'free':>6} {'planned':>8} {'peak':>8} {'outside':>8} {'s':>7}  result")
    for r in rows:
        gib = (lambda x: f"{x / GIB:.2f}" if x else "-")
        result = r.get("failed") or r.get("refused") or (
            f"err {r['error']:.1e}" if r.get("error") is not None else "ok")
        if r.get("warnings"):
            result += f"; warned: {r['warnings'][0][:60]}"
        print(f"{r['call'][:48]:48} {r['free_gib']:6.1f} {gib(r.get('device_planned')):>8} "
              f"{gib(r.get('device_peak')):>8} {r['outside_pools_gib']:8.2f} "
              f"{r['seconds']:7.2f}  {result[:90]}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=40960)
    parser.add_argument("--json", help="append each call's record to this JSON lines file")
    parser.add_argument("--last", action="store_true",
                        help="only the calls from the stack on (a device call of limited time)")
    parser.add_argument("--whole", help="memory that stands for the whole GPU (e.g. 78GiB: "
                        "an 80 GB card's on a larger one); default: all of it")
    args = parser.parse_args(argv)
    sys.path.insert(0, ROOT)
    from summa.planning.memory import parse_bytes
    rows = sequence(args.size, parse_bytes(args.whole) if args.whole else None, args.last)
    for r in rows:
        calls.append_json(args.json, r)
    table(rows)
    bad = verdict(rows)
    for line in bad:
        print("FAIL", line)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
