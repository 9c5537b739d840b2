"""fp64-int8's out-of-core sweep without the host link: on data already on
one GPU, the products the plan's tiles and panels make (each tile's panels
accumulated into it, as the sweep runs them), against the bare product of
the whole matrix, by panel width and tiles; phases summed over products.
What a sweep's products cost beyond the bare product: each panel folds its
tile's sums once more and each tile makes B's residues again.

    python3 benchmarks/fp64_int8_sweep.py --size 40960 --widths 16384,20480,40960,8192
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import calls  # JSON lines stamped with machine, date, command

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _sweep(a, b, c, tiles: tuple, width: int, scheme, backend, marks: list) -> None:
    """``c = a @ b`` as a sweep of `tiles` (rows, columns of C) in panels of
    `width`: each tile's first panel product writes it, the next add."""
    from summa.precision import ozaki_gpu
    (m, k), n = a.shape, b.shape[1]
    tm, tn = -(-m // tiles[0]), -(-n // tiles[1])
    for r0 in range(0, m, tm):
        for c0 in range(0, n, tn):
            for i, k0 in enumerate(range(0, k, width)):
                ozaki_gpu.gemm(1.0, a[r0:r0 + tm, k0:k0 + width], b[k0:k0 + width, c0:c0 + tn],
                               c[r0:r0 + tm, c0:c0 + tn], 0.0 if i == 0 else 1.0,
                               backend=backend, scheme=scheme, marks=marks)


def _timed(run, repeat: int) -> tuple:
    """``(best seconds, its phases)`` of `run(marks)` on the GPU."""
    import cupy as cp
    from summa.precision import ozaki_gpu
    best = (float("inf"), {})
    for _ in range(repeat):
        marks, start, end = [], cp.cuda.Event(), cp.cuda.Event()
        start.record()
        run(marks)
        end.record()
        end.synchronize()
        seconds = cp.cuda.get_elapsed_time(start, end) / 1e3
        if seconds < best[0]:
            best = (seconds, {p: round(s, 4) for p, s in ozaki_gpu.phase_seconds(marks).items()})
    return best


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", type=int, default=40960, help="N of the N³ product")
    p.add_argument("--device-memory", help="plan under this cap (default: the GPU's free memory)")
    p.add_argument("--widths", default="", help="more panel widths to sweep the plan's tiles in")
    p.add_argument("--tiles", default="", help="more tilings RxC to sweep at the plan's width")
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--json", help="append one JSON line per case")
    args = p.parse_args()
    import cupy as cp
    from mpi4py import MPI
    from summa.device.backend import get_backend
    from summa.planning.planner import Machine, make_plan
    from summa.planning.request import PlanRequest
    from summa.precision import ozaki_gpu
    backend, n = get_backend("cupy"), args.size
    plan = make_plan((n, n, n), "float64", Machine.live(MPI.COMM_SELF, backend),
                     PlanRequest(precision="fp64-int8", device_memory=args.device_memory),
                     host_held=True)
    memory, width = plan.memory, plan.panel_width
    print(f"plan: tiles {tuple(memory.tiles)}, panels {width} wide, rows a product "
          f"{memory.int8_rows or 'all'}, {memory.int8_planes} products a fold, "
          f"{plan.moduli} moduli", flush=True)
    rng = cp.random.default_rng(1)
    a, b = rng.uniform(-1, 1, (n, n)), rng.uniform(-1, 1, (n, n))
    c = cp.empty((n, n))
    tile_rows = -(-n // memory.tiles[0])
    cases = [("bare", (1, 1), n, ozaki_gpu.Scheme(rows=tile_rows, planes=plan.scheme.planes)),
             ("the plan's sweep", tuple(memory.tiles), width, plan.scheme)]
    cases += [(f"width {w}", tuple(memory.tiles), int(w), plan.scheme)
              for w in filter(None, args.widths.split(","))]
    cases += [(f"tiles {t}", tuple(map(int, t.lower().split("x"))), width, plan.scheme)
              for t in filter(None, args.tiles.split(","))]
    rows = []
    for name, tiles, w, scheme in cases:
        def run(marks, tiles=tiles, w=w, scheme=scheme):
            _sweep(a, b, c, tiles, w, scheme, backend, marks)
        try:
            seconds, phases = _timed(run, args.repeat)
            row = {"case": name, "n": n, "tiles": tiles, "width": w, "seconds": seconds,
                   "tflops": 2 * n**3 / seconds / 1e12, "phases": phases}
        except cp.cuda.memory.OutOfMemoryError as exc:
            row = {"case": name, "n": n, "tiles": tiles, "width": w, "error": str(exc)[:120]}
        cp.get_default_memory_pool().free_all_blocks()
        rows.append(row)
        print(json.dumps(row), flush=True)
        calls.append_json(args.json, row)
    bare = rows[0].get("seconds")
    print(f"\n{'case':28s} {'tiles':>8s} {'width':>6s} {'s':>7s} {'TFLOP/s':>8s} {'bare/s':>7s}")
    for r in rows:
        if "seconds" not in r:
            print(f"{r['case']:28s} {'x'.join(map(str, r['tiles'])):>8s} {r['width']:6d}  "
                  f"out of memory")
            continue
        print(f"{r['case']:28s} {'x'.join(map(str, r['tiles'])):>8s} {r['width']:6d} "
              f"{r['seconds']:7.3f} {r['tflops']:8.1f} "
              f"{bare / r['seconds'] if bare else float('nan'):7.3f}")
    return 1 if any("error" in r for r in rows) else 0  # a case out of memory: not measured


if __name__ == "__main__":
    raise SystemExit(main())
