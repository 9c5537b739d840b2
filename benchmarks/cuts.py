"""Out-of-core cuts of one product against each other: ``summa.matmul`` of
the same fresh pageable arrays into the same ``out=``, under one device
budget, with the planner's cut and with cuts asked for
(``SUMMA_OOC_TILES``), in turns in one process.

In one process on the same arrays the cuts differ by the cut alone: cells
of fresh processes (``matrix.py``) also differ by what each process's host
memory costs it (complex128 16384 x 65536 x 32768 under 8 GiB on an H200:
7.76 s again in one process, 5.70 in another, the same cut).

Usage, on the GPU machine from the source tree::

    PYTHONPATH=. python3 benchmarks/cuts.py --size 16384x65536x32768 --dtype float64 \\
        --cuts plan,1x2,1x3,2x1 --rounds 3

``--layout F`` hands Fortran-ordered operands over; ``--cpu`` runs on the
NumPy backend (for trying the script; its times say nothing of a GPU).
Prints each call as it ends, then one line per cut (best, tiles, C tiles on
the device, panel width) and, with ``--json``, appends the rows as JSON lines.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import calls  # noqa: E402  (benchmarks/calls.py: fresh arrays, the check, JSON lines)


def parse_cut(text: str):
    """``"plan"`` -> None (the planner's), ``"RxC"`` -> ``(R, C)``."""
    if text == "plan":
        return None
    rows, cols = (int(x) for x in text.lower().split("x"))
    return rows, cols


def operands(shape, dtype: str, layout: str):
    """Fresh pageable ``a`` (m x k) and ``b`` (k x n), C- or Fortran-ordered."""
    m, n, k = shape
    if layout == "F":  # the transpose of a fresh C array is Fortran-ordered: no copy
        return calls.fresh((k, m), dtype, 1).T, calls.fresh((n, k), dtype, 2).T
    return calls.fresh((m, k), dtype, 1), calls.fresh((k, n), dtype, 2)


def timed(a, b, c, cut, options: dict) -> dict:
    """One call into `c` under `cut`: its seconds and its plan's cut."""
    import summa
    stats = summa.SummaStats()
    with summa.options.set(ooc_tiles=cut):
        t0 = time.perf_counter()
        summa.matmul(a, b, out=c, stats=stats, **options)
        seconds = time.perf_counter() - t0
    memory = stats.extra["plan"]["memory"]
    return {"seconds": seconds, "tiles": memory["tiles"], "c_buffers": memory["c_buffers"],
            "width": memory["chunk"], "compute": stats.compute, "wait": stats.wait}


def compare(shape, dtype: str, layout: str, cuts: list, rounds: int, options: dict) -> list:
    """Rows of the cuts, each its best of `rounds` calls taken in turns;
    the product checked after the last call of each cut."""
    a, b = operands(shape, dtype, layout)
    import summa
    c = summa.matmul(a, b, **options)  # the result's memory faulted in; kernels loaded
    rows = {}
    for round_ in range(rounds):
        for cut in cuts:
            call = timed(a, b, c, cut, options)
            print(f"round {round_ + 1} {_name(cut):>5}: {call['seconds']:.3f} s, tiles "
                  f"{call['tiles']}, {call['c_buffers']} C tile(s) on the device, "
                  f"{call['width']}-wide panels", flush=True)
            row = rows.setdefault(_name(cut), dict(call, calls=[]))
            row["calls"].append(call["seconds"])
            if call["seconds"] <= min(row["calls"]):
                row.update(call)
            if round_ == rounds - 1:
                row["residual"] = calls.residual(c, a, b)
    return [dict(row, cut=name, shape=list(shape), dtype=dtype, layout=layout,
                 device_memory=options["device_memory"]) for name, row in rows.items()]


def _name(cut) -> str:
    return "plan" if cut is None else f"{cut[0]}x{cut[1]}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default="16384x65536x32768", help="N or MxNxK")
    p.add_argument("--dtype", default="float64")
    p.add_argument("--layout", choices=("C", "F"), default="C")
    p.add_argument("--budget", default="8GiB", help="device_memory of every call")
    p.add_argument("--cuts", default="plan,1x2,1x3,2x1",
                   help="comma-separated: plan (the planner's) or RxC tiles")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--cpu", action="store_true", help="the NumPy backend")
    p.add_argument("--json", help="append the rows to this JSONL file")
    args = p.parse_args(argv)
    shape = calls.parse_size(args.size)
    options = {"device_memory": args.budget, "backend": "numpy" if args.cpu else None}
    options = {key: value for key, value in options.items() if value is not None}
    rows = compare(shape, args.dtype, args.layout, [parse_cut(x) for x in args.cuts.split(",")],
                   args.rounds, options)
    print(f"\n{args.dtype} {args.layout} {'x'.join(map(str, shape))} under {args.budget}, "
          f"best of {args.rounds}:")
    for row in rows:
        print(f"  {row['cut']:>5}  {row['seconds']:7.3f} s  tiles {row['tiles']}  "
              f"{row['c_buffers']} C tile(s)  {row['width']}-wide  residual "
              f"{row['residual']:.1e}")
        calls.append_json(args.json, row)
    return 0 if all(row["residual"] <= 1 for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
