"""Variants of the fp64-int8 fold kernels (summa/ozaki_gpu.py) on one GPU, in
turns: the bare product at N x N x N with each variant swapped in for
``fold`` and ``fold_finish``, its time, its phases, and whether its product
has the current kernels' bits (each variant keeps the per-element order of
operations, so it must).

    python3 docs/scripts/fold_probe.py --size 32768
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

# The constants of up to MAXP products in registers, loaded once per thread.
_HOIST = r"""
    double mo[MAXP], iv[MAXP], wh[MAXP], wl[MAXP];
#pragma unroll
    for (int p = 0; p < MAXP; ++p) {
        mo[p] = p < count ? moduli[p] : 0.0; iv[p] = p < count ? inverses[p] : 0.0;
        wh[p] = p < count ? w_hi[p] : 0.0; wl[p] = p < count ? w_lo[p] : 0.0;
    }
"""
_TERM = r"""
                { double gd = (double)G;
                  double u = gd - mo[p] * rint(gd * iv[p]);
                  HI += u * wh[p];
                  LO += u * wl[p]; }
"""


def _variant(pairs: bool, hoist: bool) -> tuple[str, str]:
    """Sources of ``fold`` and ``fold_finish`` (the same names and arguments
    as summa's): `pairs` two columns a thread (16-byte loads of the sums),
    `hoist` the constants in registers (at most MAXP products a fold)."""
    from summa import ozaki_gpu as oz
    if not pairs and not hoist:
        return oz._FOLD, oz._FOLD_FINISH
    head = ("#define MAXP 4\n" if hoist else "") + (
        "struct __align__(16) pair { double x, y; };\n"
        "struct __align__(8) ipair { int x, y; };\n" if pairs else "")
    cols_loop = ("long long j = 2 * (blockIdx.x * (long long)blockDim.x + threadIdx.x); "
                 "j < cols; j += 2 * (long long)gridDim.x * blockDim.x") if pairs else \
        "long long j = blockIdx.x * (long long)blockDim.x + threadIdx.x; j < cols; " \
        "j += (long long)gridDim.x * blockDim.x"
    if hoist:
        term = lambda g, hi, lo: _TERM.replace("G", g).replace("HI", hi).replace("LO", lo)  # noqa: E731
        loop = "#pragma unroll\n            for (int p = 0; p < MAXP; ++p) {\n" \
               "                if (p >= count) break;\n"
    else:
        term = lambda g, hi, lo: (f"\n                {{ double gd = (double){g};\n"  # noqa: E731
                                  f"                double u = gd - moduli[p] * rint(gd * "
                                  f"inverses[p]);\n                {hi} += u * w_hi[p];\n"
                                  f"                {lo} += u * w_lo[p]; }}\n")
        loop = "            for (int p = 0; p < count; ++p) {\n"
    if pairs:
        body = (r"""
            long long idx = r * cols + j;
            pair h = {0.0, 0.0}, l = {0.0, 0.0};
            if (!first) { h = *(const pair*)(s_hi + idx); l = *(const pair*)(s_lo + idx); }
""" + loop + "                ipair g2 = *(const ipair*)(g + p * plane + r * ldg + j);" +
                term("g2.x", "h.x", "l.x") + term("g2.y", "h.y", "l.y") + "            }\n")
        store = "            *(pair*)(s_hi + idx) = h;\n            *(pair*)(s_lo + idx) = l;"
        ends = [("h.x", "l.x", "j"), ("h.y", "l.y", "j + 1")]
    else:
        body = (r"""
            long long idx = r * cols + j;
            double hi = first ? 0.0 : s_hi[idx], lo = first ? 0.0 : s_lo[idx];
""" + loop + term("g[p * plane + r * ldg + j]", "hi", "lo") + "            }\n")
        store = "            s_hi[idx] = hi;\n            s_lo[idx] = lo;"
        ends = [("hi", "lo", "j")]
    finish = "".join(f"""
            {{ double q = rint(({h} + {lo}) / (m_hi + m_lo));
              double d = ({h} - q * m_hi) + ({lo} - q * m_lo);
              double v = alpha * ldexp(d, t - e[r] - f[{jj}]);
              double* cj = c + r * ldc + {jj};
              *cj = beta == 0.0 ? v : v + beta * *cj; }}""" for h, lo, jj in ends)

    def kernel(name, args, tail):
        return (head + f'extern "C" __global__ void {name}({args}) {{\n' +
                (_HOIST if hoist else "") +
                "    for (long long r = blockIdx.y; r < rows; r += gridDim.y) {\n"
                f"        for ({cols_loop}) {{" + body + tail + "\n        }\n    }\n}\n")
    return (kernel("fold", oz._FOLD_ARGS, store),
            kernel("fold_finish", oz._FOLD_ARGS + ", const int* e, const int* f, double m_hi, "
                   "double m_lo, int t, double alpha, double beta, double* c, long long ldc",
                   finish))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", type=int, default=32768)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--json")
    args = p.parse_args()
    import cupy as cp
    from summa import ozaki_gpu
    from summa.backend import get_backend
    backend = get_backend("cupy")
    n = args.size
    a = cp.random.random((n, n)) * 2 - 1
    b = cp.random.random((n, n)) * 2 - 1
    c = cp.empty((n, n))
    names = {"current": (False, False), "pairs": (True, False), "hoisted": (False, True),
             "pairs+hoisted": (True, True)}
    kernels = {}
    for name, (pairs, hoist) in names.items():
        fold, finish = _variant(pairs, hoist)
        kernels[name] = (cp.RawKernel(fold, "fold"), cp.RawKernel(finish, "fold_finish"), pairs)
    launch = ozaki_gpu._launch
    reference = None
    rows = {name: [] for name in names}
    for _ in range(args.rounds):
        for name, (fold, finish, pairs) in kernels.items():
            ozaki_gpu._kernels["fold"], ozaki_gpu._kernels["fold_finish"] = fold, finish
            ozaki_gpu._launch = (lambda k, r, w, a_, pairs=pairs, folds=(fold, finish): launch(
                k, r, -(-w // 2) if pairs and k in folds else w, a_))
            if name not in rows:
                continue  # failed in an earlier round
            try:
                ozaki_gpu.gemm(1.0, a, b, c, backend=backend)  # warm-up (compiles)
                cp.cuda.Device().synchronize()
                marks = []
                t0 = time.perf_counter()
                ozaki_gpu.gemm(1.0, a, b, c, backend=backend, marks=marks)
                cp.cuda.Device().synchronize()
                seconds = time.perf_counter() - t0
            except Exception as exc:  # noqa: BLE001 -- a variant that does not compile: say so
                print(f"{name}: {exc!r}"[:400], flush=True)
                del rows[name]
                continue
            finally:
                ozaki_gpu._launch = launch
            phases = ozaki_gpu.phase_seconds(marks)
            if reference is None:
                reference = c.copy()
            rows[name].append({"seconds": seconds, "phases": phases,
                               "same_bits": bool((c == reference).all())})
    ozaki_gpu._kernels.clear()
    out = []
    for name, runs in rows.items():
        best = min(runs, key=lambda r: r["seconds"])
        out.append({"variant": name, "n": n, "seconds": best["seconds"],
                    "tflops": 2 * n**3 / best["seconds"] / 1e12, "phases": best["phases"],
                    "same_bits": all(r["same_bits"] for r in runs)})
        print(json.dumps(out[-1]), flush=True)
    if args.json:
        with open(args.json, "a") as f:
            f.writelines(json.dumps(r) + "\n" for r in out)
    print()
    for r in out:
        print(f"{r['variant']:>14} N={n} {r['seconds']:.4f} s {r['tflops']:6.1f} TFLOP/s "
              f"same bits {r['same_bits']}  [" +
              ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in r["phases"].items()) + "]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
