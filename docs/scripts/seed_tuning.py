"""Where the user's call spends its time where everything fits one GPU, and
which staging settings shorten it (issue 22: N = 16384 float64 first call).

One process, fresh pageable arrays made once; every call returns a fresh
product (``np.empty``, as the user gets it). First the first call and the
second, then each variant: one warm-up call and the best of ``--repeat``.
Each line: seconds end to end, the sweep's own seconds (the rest is the
call's set-up and return), the GPU's GEMM seconds and its idle time before
the first GEMM, between GEMMs and after the last. Last, what page-locked
allocation costs (the first call makes its staging ring).

    python3 docs/scripts/seed_tuning.py --size 16384 --json seed_tuning.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "docs", "scripts"))

#: name -> (environment, summa.staging settings, matmul keywords)
VARIANTS = {
    "default": ({}, {}, {}),
    "threads 16": ({"SUMMA_COPY_THREADS": "16"}, {}, {}),
    "threads 8": ({"SUMMA_COPY_THREADS": "8"}, {}, {}),
    "touch on all threads": ({}, {"TOUCH_SHARE": 1.0}, {}),
    "no touch": ({}, {"TOUCH_SHARE": 0}, {}),
    "chunk 16 MiB": ({}, {"CHUNK_BYTES": 16 << 20}, {}),
    "out= touched": ({}, {}, {"out": True}),
    "locked A, B, C": ({"SUMMA_HOST_COPIES": "lock"}, {}, {"out": True}),
}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", type=int, default=16384)
    p.add_argument("--dtype", default="float64")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--variants", default="|".join(VARIANTS), help="names, split by |")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    import numpy as np
    t0 = time.perf_counter()
    import cupy as cp
    cp.cuda.Device(0).use()
    cp.cuda.runtime.free(cp.cuda.runtime.malloc(1))
    (cp.ones((64, 64)) @ cp.ones((64, 64))).sum().item()
    cuda_init = time.perf_counter() - t0
    t0 = time.perf_counter()
    import summa
    from summa import staging
    imported = time.perf_counter() - t0
    from seed_case import _fresh, gemm_rate
    n, dtype = args.size, np.dtype(args.dtype)
    a, b = _fresh((n, n), dtype, 1), _fresh((n, n), dtype, 2)
    flops = 2.0 * n**3
    rows = []

    def call(name, label, out=None, **kwargs):
        stats = summa.SummaStats()
        s = time.perf_counter()
        c = summa.matmul(a, b, stats=stats, out=out, **kwargs)
        seconds = time.perf_counter() - s
        ex = stats.extra
        r = {"variant": name, "call": label, "n": n, "dtype": dtype.name, "seconds": seconds,
             "tflops": flops / seconds / 1e12, "sweep_seconds": stats.seconds,
             "gemm_seconds": stats.compute, "head_seconds": ex.get("head_seconds"),
             "between_seconds": ex.get("between_seconds"),
             "tail_seconds": ex.get("tail_seconds"), "setup_seconds": ex.get("setup_seconds")}
        del c
        return r

    def emit(r):
        rows.append(r)
        print(json.dumps(r), flush=True)

    for path in ("enabled", "defrag"):
        try:
            with open(f"/sys/kernel/mm/transparent_hugepage/{path}") as f:
                print(f"transparent huge pages {path}: {f.read().strip()}")
        except OSError:
            pass
    ceiling = gemm_rate(n, dtype)  # its kernels loaded, as in seed_case.py
    emit({"variant": "ceiling", "n": n, "tflops": ceiling})
    emit(call("default", "first"))
    emit(call("default", "second"))
    for name in args.variants.split("|"):
        env, settings, kwargs = VARIANTS[name]
        kwargs = dict(kwargs)
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        kept = {k: getattr(staging, k) for k in settings}
        if settings:
            staging.close_stagers()
            for k, v in settings.items():
                setattr(staging, k, v)
        out = None
        if kwargs.pop("out", False):
            out = np.empty((n, n), dtype)
            summa.host.parallel_copy(out, a)  # touched, as a reused result would be
        try:
            call(name, "warm-up", out=out, **kwargs)
            best = min((call(name, "best", out=out, **kwargs) for _ in range(args.repeat)),
                       key=lambda r: r["seconds"])
            emit(best)
        except Exception as exc:  # noqa: BLE001 -- one variant's failure, the rest go on
            emit({"variant": name, "error": repr(exc)})
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            if settings:
                staging.close_stagers()
                for k, v in kept.items():
                    setattr(staging, k, v)
        del out
    # What page-locked allocation costs: the ring of one direction, chunk by chunk and whole.
    ring = staging.ring_bytes(staging.copy_threads()) // 2
    s = time.perf_counter()
    held = [cp.cuda.alloc_pinned_memory(8 << 20) for _ in range(ring // (8 << 20))]
    by_chunk = time.perf_counter() - s
    s = time.perf_counter()
    held.append(cp.cuda.alloc_pinned_memory(ring))
    whole = time.perf_counter() - s
    del held
    emit({"variant": "pinned allocation", "ring_bytes": ring, "by_8MiB_chunks_seconds": by_chunk,
          "whole_seconds": whole, "import_seconds": imported, "cuda_init_seconds": cuda_init})
    if args.json:
        with open(args.json, "a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    print(f"\n{'variant':>18} {'call':>7} {'seconds':>8} {'TFLOP/s':>8} {'sweep':>7} "
          f"{'GEMMs':>7} {'before':>7} {'between':>7} {'after':>7} {'set-up':>7}")
    for r in rows:
        if r["variant"] == "ceiling":
            print(f"{'ceiling':>18} cupy.matmul {r['tflops']:.2f} TFLOP/s")
            continue
        if "error" in r:
            print(f"{r['variant']:>18} failed: {r['error'][:100]}")
            continue
        if "seconds" not in r:
            print(f"pinned allocation of {r['ring_bytes'] / 2**20:.0f} MiB: "
                  f"{r['by_8MiB_chunks_seconds']:.3f} s in 8 MiB chunks, "
                  f"{r['whole_seconds']:.3f} s whole; import summa {r['import_seconds']:.2f} s")
            continue
        print(f"{r['variant']:>18} {r['call']:>7} {r['seconds']:8.3f} {r['tflops']:8.2f} "
              f"{r['sweep_seconds']:7.3f} {r['gemm_seconds']:7.3f} {r['head_seconds'] or 0:7.3f} "
              f"{r['between_seconds'] or 0:7.3f} {r['tail_seconds'] or 0:7.3f} "
              f"{r['setup_seconds'] or 0:7.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
