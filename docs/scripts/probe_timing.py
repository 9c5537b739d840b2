"""Fair timing of GEMM variants on a power-capped GPU (shared by the probes).

An H200's float64 GEMMs run at its 700 W cap, so its clocks follow its
temperature: a variant timed first, on a cool GPU, runs faster than the same
work timed later. ``round_robin`` therefore times the variants in turns (one
run of each per round, after one warm-up run of each) and reports each one's
median.
"""
import time

import cupy


def round_robin(cases, rounds: int = 5) -> dict:
    """Median seconds of each ``name: fn`` in `cases` over `rounds` turns."""
    for fn in cases.values():  # warm-up: plans, workspaces, clocks
        fn()
    cupy.cuda.Device().synchronize()
    times = {name: [] for name in cases}
    for _ in range(rounds):
        for name, fn in cases.items():
            t0 = time.perf_counter()
            fn()
            cupy.cuda.Device().synchronize()
            times[name].append(time.perf_counter() - t0)
    return {name: sorted(ts)[len(ts) // 2] for name, ts in times.items()}
