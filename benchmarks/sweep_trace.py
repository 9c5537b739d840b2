"""Where an out-of-core sweep's GPU waits: ``summa.matmul`` of fresh pageable
arrays on one GPU, each call's products traced, in ms from the sweep's start:
each GEMM (an fp64-int8 product whole) as it started on the GPU and how long
it ran, when the sweep's thread queued it, and each upload as the thread
submitted it and as its last copy landed on the GPU.

    python3 benchmarks/sweep_trace.py --size 40960 --precision fp64-int8 --free 24GiB

A GEMM that starts well after the one before ended waited: for its upload
(an upload landing just before it), or for the sweep's thread (queued just
before it). ``--check`` checks each product on the host between the calls, as
``matrix.py`` does, and ``--settle S`` sleeps S seconds after each check: to
see what the process does between calls costs the next one.

It wraps summa's own mover and stager (``summa.execution.movers.CudaMover``,
``summa.device.staging.Stager``) for the run: a maintainer's tool, tied to
them; it needs a GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time

import calls


@contextlib.contextmanager
def traced(report):
    """Within: every CudaMover's sweep calls `report(trace)` at its end,
    `trace` a dict of its GEMMs' ``(start, length)``, their host queue times
    and its uploads' ``(submitted, landed)``, ms; the stager's events timed."""
    import cupy as cp
    from summa.device import staging
    from summa.device.transfers import Transfer
    from summa.execution import movers
    mover, stager = movers.CudaMover, staging.Stager
    saved = {name: getattr(mover, name) for name in ("__init__", "upload", "gemm", "phases")}
    record = stager._record

    def timed_record(self, stream):  # (the stager's own events do not time)
        event = cp.cuda.Event()
        event.record(stream)
        return event

    def init(self, *args, **kwargs):
        saved["__init__"](self, *args, **kwargs)
        self.trace_host, self.trace_queued, self.trace_uploads = time.perf_counter(), [], []

    def upload(self, dst, src):
        submitted = time.perf_counter()
        transfer = saved["upload"](self, dst, src)
        self.trace_uploads.append((submitted, transfer))
        return transfer

    def gemm(self, *args, **kwargs):
        self.trace_queued.append(time.perf_counter())
        return saved["gemm"](self, *args, **kwargs)

    def phases(self):
        out = saved["phases"](self)
        if self.marks and self.end is not None:
            def ms(a, b):
                return 1e3 * self.device.elapsed(a, b)
            marks, host = self.marks, self.trace_host
            # (a staged upload's last copy; a direct one's event does not time)
            landed = [t._event if isinstance(t, Transfer) else None
                      for _, t in self.trace_uploads]
            report({"gemms": [(ms(self.begin, a), ms(a, b)) for a, b in zip(marks[::2],
                                                                           marks[1::2])],
                    "queued": [1e3 * (t - host) for t in self.trace_queued],
                    "uploads": [(1e3 * (s - host), ms(self.begin, e) if e is not None else None)
                                for (s, _), e in zip(self.trace_uploads, landed)],
                    "phases": out})
        return out
    try:
        stager._record = timed_record
        for name, fn in (("__init__", init), ("upload", upload), ("gemm", gemm),
                         ("phases", phases)):
            setattr(mover, name, fn)
        yield
    finally:
        stager._record = record
        for name, fn in saved.items():
            setattr(mover, name, fn)


def show(trace: dict) -> str:
    """The trace as three lines of ms and the phases' seconds."""
    def fmt(x):
        return "?" if x is None else f"{x:.0f}"
    return "\n".join((
        "  GEMMs start+length: " + " ".join(f"{s:.0f}+{d:.0f}" for s, d in trace["gemms"]),
        "  queued by the host: " + " ".join(f"{q:.0f}" for q in trace["queued"]),
        "  uploads submitted->landed: " + " ".join(f"{fmt(s)}->{fmt(e)}"
                                                    for s, e in trace["uploads"]),
        "  waits before / between / after the GEMMs, s: "
        + " / ".join("?" if p is None else f"{p:.3f}" for p in trace["phases"])))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("--size", type=int, default=16384, help="M = N = K (default 16384)")
    parser.add_argument("--dtype", default="float64")
    parser.add_argument("--precision", default=None, help="e.g. fp64-int8")
    parser.add_argument("--free", default=None,
                        help="GPU memory left free, e.g. 24GiB (default: all of it)")
    parser.add_argument("--panel-width", type=int, default=None,
                        help="the calls' panel width (default: the planner's)")
    parser.add_argument("--calls", type=int, default=3, help="calls in this process (default 3)")
    parser.add_argument("--check", action="store_true",
                        help="check each product on the host between the calls")
    parser.add_argument("--settle", type=float, default=0.0,
                        help="seconds to sleep after each check (default 0)")
    parser.add_argument("--json", default=None, help="append each call's trace as a JSON line")
    args = parser.parse_args(argv)
    from summa.device.backend import cupy_available
    if not cupy_available():
        print("sweep_trace: needs CuPy and a GPU", file=sys.stderr)
        return 2
    import summa
    from summa.planning.memory import parse_bytes
    n = args.size
    a, b = calls.fresh((n, n), args.dtype, 1), calls.fresh((n, n), args.dtype, 2)
    calls.start_cuda(args.dtype)
    holds = calls.hold_all_but(parse_bytes(args.free) if args.free else None)
    check = calls.freivalds(a, b)
    options = {"precision": args.precision} if args.precision else {}
    if args.panel_width:
        options["panel_width"] = args.panel_width
    traces = []
    try:
        with traced(traces.append):
            for call in range(args.calls):
                stats = summa.SummaStats()
                t0 = time.perf_counter()
                c = summa.matmul(a, b, stats=stats, **options)
                seconds = time.perf_counter() - t0
                for trace in traces:
                    print(show(trace))
                print(f"call {call + 1}: {seconds:.3f} s, GEMMs {stats.compute:.3f} s, "
                      f"GPU waiting {stats.wait:.3f} s ({n}³ {args.precision or args.dtype}, "
                      f"{args.free or 'whole GPU'})", flush=True)
                calls.append_json(args.json, {"call": call + 1, "size": n, "dtype": args.dtype,
                                              "precision": args.precision, "free": args.free,
                                              "seconds": seconds, "traces": traces[:]})
                traces.clear()
                if args.check:
                    t0 = time.perf_counter()
                    residual = check(c)
                    print(f"  checked in {time.perf_counter() - t0:.2f} s, residual "
                          f"{residual:.2g}", flush=True)
                    time.sleep(args.settle)
                del c
    finally:
        calls.release(holds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
