"""The user's calls end to end, on one or more source trees in turns: the
guard that says a change made nothing slower.

Every case runs in a fresh process, timed from the data where the user holds
it (fresh pageable NumPy arrays, or ``.npy`` files in the page cache):

===================  ======================================================
``call-f64``         ``summa.matmul(a, b)``, float64 40960³, 24 GiB of the
                     GPU free (an RTX 3090's memory); first call and again
``call-f32``         float32 50000 × 30011 × 45007, 24 GiB free
``call-f64-8gib``    float64 32768³, ``device_memory="8GiB"``, 24 GiB free
``multiply-files``   ``python -m summa multiply A.npy B.npy -o C.npy`` on two
                     24576² float64 files, 24 GiB free (wall time of the
                     whole command)
``bench-fp64-int8``  ``python -m summa bench --size 32768 --precision
                     fp64-int8`` (whole GPU; its best repetition)
``bench-f64``        ``python -m summa bench --size 32768`` in memory
===================  ======================================================

``ceiling`` times ``cupy.matmul`` on device data of each call's shape and
dtype once (the GPU's own rate, the user's calls are divided by it).

Usage, on the GPU machine (each ``--tree NAME=DIR`` puts DIR first on
``PYTHONPATH``; rounds alternate the trees' order so drift cancels)::

    git archive --prefix=before/ REV | tar -x -C /tmp
    python3 benchmarks/user_calls.py --tree before=/tmp/before --tree after=. \\
        --rounds 2 --json user_calls.jsonl

It prints one table last: each case's best seconds per tree (first call /
again), the ratio to the ceiling and, for two trees, the second's time over
the first's (≤ 1.03 is the guard's pass).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import calls  # a case in a fresh process, trees in turns, the GPU held, checks

GiB = 1 << 30
#: name: (kind, dtype, (m, n, k), free bytes or None for the whole GPU, extra)
CASES = {
    "call-f64": ("call", "float64", (40960, 40960, 40960), 24 * GiB, {}),
    "call-f32": ("call", "float32", (50000, 30011, 45007), 24 * GiB, {}),
    "call-f64-8gib": ("call", "float64", (32768, 32768, 32768), 24 * GiB,
                      {"device_memory": "8GiB"}),
    "multiply-files": ("files", "float64", (24576, 24576, 24576), 24 * GiB, {}),
    "bench-fp64-int8": ("bench", "float64", (32768, 32768, 32768), None,
                        {"args": ["--precision", "fp64-int8"]}),
    "bench-f64": ("bench", "float64", (32768, 32768, 32768), None, {"args": []}),
}


def run_call(name: str) -> list[dict]:
    """``summa.matmul`` on fresh pageable arrays, first call and again."""
    import summa
    _, dtype, (m, n, k), free, options = CASES[name]
    a, b = calls.fresh((m, k), dtype, 1), calls.fresh((k, n), dtype, 2)
    held = calls.hold_all_but(free)
    # CUDA's start (a context, ~0.2-1 s) is the process's, not the call's: the
    # documented first-call figures leave it out, and so does this one.
    cuda_init = calls.start_cuda(dtype)
    rows = []
    for call in ("first", "again"):
        t0 = time.perf_counter()
        c = summa.matmul(a, b, **options)
        seconds = time.perf_counter() - t0
        rows.append({"call": call, "seconds": seconds, "residual": calls.residual(c, a, b),
                     "cuda_init_seconds": cuda_init})
        del c
    calls.release(held)
    return rows


def run_files(name: str) -> list[dict]:
    """``python -m summa multiply`` on two .npy files, twice (the files stay
    in the page cache; the command is a fresh process each time)."""
    import numpy as np
    _, dtype, (m, n, k), free, _ = CASES[name]
    folder = os.environ.get("USER_CALLS_DIR", tempfile.gettempdir())
    paths = [os.path.join(folder, f"user_calls_{x}_{m}.npy") for x in "ab"]
    for path, shape, seed in zip(paths, ((m, k), (k, n)), (1, 2)):
        if not os.path.exists(path):
            np.save(path + ".part.npy", calls.fresh(shape, dtype, seed))
            os.replace(path + ".part.npy", path)
    out = os.path.join(folder, "user_calls_c.npy")
    held = calls.hold_all_but(free)
    rows = []
    for call in ("first", "again"):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "summa", "multiply", *paths, "-o", out, "--quiet"],
                       check=True, stdin=subprocess.DEVNULL)
        rows.append({"call": call, "seconds": time.perf_counter() - t0})
        os.unlink(out)
    calls.release(held)
    return rows


def run_bench(name: str) -> list[dict]:
    """``python -m summa bench``: its best repetition's seconds."""
    _, dtype, (m, n, k), _, options = CASES[name]
    with tempfile.TemporaryDirectory() as folder:
        record = os.path.join(folder, "bench.jsonl")
        subprocess.run([sys.executable, "-m", "summa", "bench", "--m", str(m), "--n", str(n),
                        "--k", str(k), "--dtype", dtype, "--repeat", "3", "--no-ideal", "--quiet",
                        "--json", record, *options["args"]],
                       check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        with open(record) as f:
            result = json.loads(f.readline())
    return [{"call": "best", "seconds": result["seconds"], "tflops": result["tflops"]}]


def run_ceiling() -> list[dict]:
    """``cupy.matmul`` on device data of each call's shape: best of three."""
    return [{"case": name, "seconds": calls.matmul_seconds(m, n, k, dtype)}
            for name, (kind, dtype, (m, n, k), _, _) in CASES.items() if kind == "call"]


def child(name: str) -> None:
    """Run one case in this process and print its rows as JSON lines."""
    if name == "ceiling":
        rows = run_ceiling()
    else:
        rows = {"call": run_call, "files": run_files, "bench": run_bench}[CASES[name][0]](name)
    for row in rows:
        calls.emit(row)


def measure(name: str, tree: str, timeout: float) -> list[dict]:
    """One case in a fresh process with `tree` first on PYTHONPATH; a failed
    or timed-out case is one row of call "error"."""
    rows = calls.in_fresh_process(__file__, ["--case", name], tree, timeout)
    return [dict(r, call="error", seconds=float("nan")) if "error" in r else r for r in rows]


def table(records: list[dict], trees: list[str], ceilings: dict) -> None:
    """Best seconds per case, call and tree; ratios to the ceiling and between trees."""
    print(f"\n{'case':<17}{'call':<7}" + "".join(f"{t:>12}" for t in trees)
          + "".join(f"{'ceil/' + t:>12}" for t in trees)
          + (f"{trees[1] + '/' + trees[0]:>14}" if len(trees) == 2 else ""))
    keys = dict.fromkeys((r["case"], r["call"]) for r in records)
    for case, call in keys:
        best = {}
        for tree in trees:
            times = [r["seconds"] for r in records
                     if (r["case"], r["call"], r["tree"]) == (case, call, tree)]
            best[tree] = min(times, default=float("nan"))
        line = f"{case:<17}{call:<7}" + "".join(f"{best[t]:>12.3f}" for t in trees)
        line += "".join(f"{ceilings.get(case, float('nan')) / best[t]:>12.3f}" for t in trees)
        if len(trees) == 2:
            line += f"{best[trees[1]] / best[trees[0]]:>14.3f}"
        print(line, flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tree", action="append", default=[], metavar="NAME=DIR",
                   help="a source tree to time (repeat; default: this checkout as 'here')")
    p.add_argument("--cases", default=",".join(CASES), help="comma-separated (default: all)")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--no-ceiling", action="store_true", help="skip cupy.matmul's rates")
    p.add_argument("--timeout", type=float, default=240, help="seconds per case and tree")
    p.add_argument("--json", help="append every measurement to this JSON-lines file")
    p.add_argument("--case", help=argparse.SUPPRESS)  # one case, in this (fresh) process
    args = p.parse_args(argv)
    if args.case:
        child(args.case)
        return 0
    try:
        trees = calls.parse_trees(args.tree)
    except ValueError as exc:
        p.error(str(exc))
    names = [c for c in args.cases.split(",") if c]
    unknown = set(names) - set(CASES)
    if unknown:
        p.error(f"unknown cases: {', '.join(sorted(unknown))}")
    ceilings = {}
    if not args.no_ceiling:
        rows = measure("ceiling", next(iter(trees.values())), args.timeout)
        ceilings = {r["case"]: r["seconds"] for r in rows if "case" in r}
    records = []
    for round_, name, tree, path in calls.in_turns(names, trees, args.rounds):
        for row in measure(name, path, args.timeout):
            row.update(case=name, tree=tree, round=round_, time=time.time())
            records.append(row)
            print(json.dumps(row), flush=True)
            calls.append_json(args.json, row)
    table(records, list(trees), ceilings)
    # a case that failed or timed out is a measurement missing: the run fails
    return 1 if any(r["call"] == "error" for r in records) else 0


if __name__ == "__main__":
    sys.exit(main())
