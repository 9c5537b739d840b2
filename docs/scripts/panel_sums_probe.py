"""Where an out-of-core tile's fp64-int8 time goes, per-panel folds against
panel sums (issue 25, s17b: panel sums made out of core slower, 54.5 against
59.2 TFLOP/s at 110 GiB; the probe of s17c, since adapted to PanelSums taking
the exponents of all of K): one tile of C (m x n) over K in panels of `w`, all
on the device (no transfers), each way timed as a whole and by its parts (the
two ways in turns, probe_timing.round_robin's medians; s17c and s17f took the
best of --repeat runs of each in turn).

    python3 docs/scripts/panel_sums_probe.py [--m 16384 --n 32768 --k 32768 --w 16384]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from probe_timing import round_robin  # noqa: E402


def timed(fn, rounds: int) -> float:
    """`fn`'s median seconds (:func:`probe_timing.round_robin`)."""
    return round_robin({"": fn}, rounds)[""]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--m", type=int, default=16384)
    p.add_argument("--n", type=int, default=32768)
    p.add_argument("--k", type=int, default=32768)
    p.add_argument("--w", type=int, default=16384)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--json")
    args = p.parse_args()
    import cupy as cp
    from summa import ozaki, ozaki_gpu
    from summa.backend import get_backend
    backend = get_backend("cupy")
    m, n, k, w = args.m, args.n, args.k, args.w
    a = cp.random.uniform(-1, 1, (m, k))
    b = cp.random.standard_normal((k, n))
    c = cp.empty((m, n))
    panels = [(k0, min(k, k0 + w)) for k0 in range(0, k, w)]
    cap_a, cap_b = ozaki.budgets(ozaki_gpu.moduli_for(k), k)
    exponents = (ozaki_gpu._exponents(a, 1, ozaki.BITS, cap_a),
                 ozaki_gpu._exponents(b, 0, ozaki.BITS, cap_b))
    rows = []

    def per_panel():
        for i, (k0, k1) in enumerate(panels):
            ozaki_gpu.gemm(1.0, a[:, k0:k1], b[k0:k1], c, 0.0 if i == 0 else 1.0, backend=backend)

    def sums_way():
        sums = ozaki_gpu.PanelSums(m, n, k, exponents, backend)
        for k0, k1 in panels:
            sums.add(a[:, k0:k1], b[k0:k1])
        sums.finish(1.0, c, 0.0)

    ways = round_robin({"per-panel folds (as today)": per_panel, "panel sums": sums_way},
                       args.repeat)
    whole = ways["per-panel folds (as today)"]
    rows += [{"what": what, "seconds": seconds} for what, seconds in ways.items()]
    # the parts
    sums = ozaki_gpu.PanelSums(m, n, k, exponents, backend)
    k0, k1 = panels[0]
    rows.append({"what": "PanelSums.add of one panel",
                 "seconds": timed(lambda: (setattr(sums, "seen", 0),
                                               sums.add(a[:, k0:k1], b[k0:k1])), args.repeat)})
    sums.seen = k
    rows.append({"what": "PanelSums.finish of the tile",
                 "seconds": timed(lambda: sums.finish(1.0, c, 0.0), args.repeat)})
    # the sums are all resident: one pass over every plane, no float64 sums in memory
    sums.planes = sums.count
    rows.append({"what": "PanelSums.finish of the tile, one pass over all planes",
                 "seconds": timed(lambda: sums.finish(1.0, c, 0.0), args.repeat)})
    sums.planes = ozaki_gpu.PLANES
    rows.append({"what": "one panel's gemm (fold included)",
                 "seconds": timed(lambda: ozaki_gpu.gemm(1.0, a[:, k0:k1], b[k0:k1], c, 0.0,
                                                             backend=backend), args.repeat)})
    count = sums.count
    kp = -(-(k1 - k0) // 4) * 4
    a8 = cp.zeros((count, m, kp), dtype=cp.int8)
    b8 = cp.zeros((count, sums.np_, kp), dtype=cp.int8)
    out = cp.empty((count, m, sums.np_), dtype=cp.int32)
    for acc in (False, True):
        rows.append({"what": f"{count} INT8 GEMMs of one panel, accumulate={acc}",
                     "seconds": timed(lambda: [backend.int8_gemm_tn(a8[q], b8[q], out[q], acc)
                                                   for q in range(count)], args.repeat)})
    bt = cp.empty((n, k1 - k0))
    rows.append({"what": "transpose of one B panel",
                 "seconds": timed(lambda: backend.transpose(b[k0:k1], bt), args.repeat)})
    marks: list = []
    ozaki_gpu.gemm(1.0, a[:, k0:k1], b[k0:k1], c, 0.0, backend=backend, marks=marks)
    cp.cuda.Device().synchronize()
    for phase, sec in ozaki_gpu.phase_seconds(marks).items():
        rows.append({"what": f"one panel's gemm: phase {phase}", "seconds": sec})
    ap = cp.ascontiguousarray(a[:, k0:k1])
    e = cp.zeros(m, dtype=cp.int32)
    f = cp.zeros(n, dtype=cp.int32)
    consts = ozaki_gpu._constants(count)
    rows.append({"what": "residues of the A panel", "seconds": timed(
        lambda: ozaki_gpu._residues(ap, e, count, m, kp, consts), args.repeat)})
    rows.append({"what": "residues of the B panel (transposed)", "seconds": timed(
        lambda: ozaki_gpu._residues(bt, f, count, sums.np_, kp, consts), args.repeat)})
    rows.append({"what": "exponents of the A panel", "seconds": timed(
        lambda: ozaki_gpu._exponents(ap, 1, ozaki_gpu.ozaki.BITS, cap_a), args.repeat)})
    rows.append({"what": "exponents of the B panel", "seconds": timed(
        lambda: ozaki_gpu._exponents(bt, 1, ozaki_gpu.ozaki.BITS, cap_b), args.repeat)})
    flops = 2.0 * m * n * k
    for r in rows:
        r.update(m=m, n=n, k=k, w=w, moduli=count)
        print(f"{r['what']:<44} {r['seconds'] * 1e3:9.1f} ms")
    print(f"per-panel folds {flops / whole / 1e12:.1f} TFLOP/s on the tile, no transfers")
    if args.json:
        with open(args.json, "a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
