"""The ``multiply`` command: C = alpha op(A) op(B) + beta C0 from and to .npy
files, and its report (each phase's time, start-up and wall time)."""

from __future__ import annotations

import json
import os
import sys
import time

from ..runtime.mpi import MPI
from ..api.files import CheckFailed, multiply_files
from ..device.backend import DTYPES
from .common import add_common, scalar, versions
from .studies import plural

__all__ = ["add_parser", "run", "process_age", "wall_line"]


def add_parser(sub) -> None:
    """``multiply``: C = alpha op(A) op(B) + beta C0 from and to .npy files."""
    mult = sub.add_parser(
        "multiply", help="C = alpha op(A) op(B) + beta C0 from and to .npy files",
        description="Multiply two .npy files: each rank reads only its blocks, the product is "
                    "verified (Freivalds) and written atomically: a temporary file in the "
                    "output's folder is renamed into place only when every rank succeeded. "
                    "A and B must share a dtype unless --dtype is given (both are then "
                    "converted to it; integer files need --dtype). Exit status: 0 done, "
                    "2 bad input, 3 the check failed (nothing written).")
    mult.add_argument("a", metavar="A.npy", help="left operand (C or Fortran order)")
    mult.add_argument("b", metavar="B.npy", help="right operand")
    mult.add_argument("-o", "--output", required=True, metavar="C.npy", help="output file")
    mult.add_argument("--alpha", type=scalar, default=1.0, help="scale of the product (1)")
    mult.add_argument("--beta", type=scalar, default=0.0,
                      help="scale of C0 (0); needs --c")
    mult.add_argument("--c", dest="c", metavar="C0.npy", default=None,
                      help="matrix added as beta * C0")
    mult.add_argument("--trans-a", choices=("N", "T", "H"), default="N",
                      help="use A, its transpose or its conjugate transpose (N)")
    mult.add_argument("--trans-b", choices=("N", "T", "H"), default="N", help="likewise for B")
    mult.add_argument("--dtype", choices=tuple(DTYPES), default=None,
                      help="compute (and output) dtype; default: the inputs' common dtype")
    add_common(mult)
    checking = mult.add_mutually_exclusive_group()
    checking.add_argument("--check", dest="check", action="store_true", default=None,
                          help="always verify the product")
    checking.add_argument("--no-check", dest="check", action="store_false",
                          help="never verify (default: verify when it costs < 2%% of the "
                               "multiply)")
    mult.add_argument("--quiet", action="store_true", help="no progress bar")
    mult.add_argument("--json", metavar="FILE", default=None,
                      help="append one JSON object with parameters and timings to FILE")


def process_age() -> float:
    """Seconds since this process started (Linux: from /proc, so Python's own
    start-up and the imports count; elsewhere since this module was imported)."""
    try:
        with open("/proc/self/stat") as fh:
            started = int(fh.read().rsplit(")", 1)[1].split()[19])  # field 22: start time
        ticks = os.sysconf("SC_CLK_TCK")
        with open("/proc/uptime") as fh:
            return max(0.0, float(fh.read().split()[0]) - started / ticks)
    except (OSError, ValueError, IndexError):
        return time.perf_counter() - _IMPORTED


_IMPORTED = time.perf_counter()


def run(args, comm: MPI.Comm, out) -> int:
    """``summa multiply``: multiply the files, print the report on rank 0 (and
    append it to ``--json``); 3 where the check failed (nothing written)."""
    # Python, the imports, MPI's start, until here: the slowest rank's.
    startup = comm.allreduce(process_age(), op=MPI.MAX)
    try:
        record = multiply_files(
            args.a, args.b, args.output, comm, alpha=args.alpha, beta=args.beta, c_path=args.c,
            trans_a=args.trans_a, trans_b=args.trans_b, dtype=args.dtype, grid=args.grid,
            block=None if args.block is None else (args.block, args.block),
            panel_width=args.nb, lookahead=args.lookahead, backend=args.backend,
            broadcaster=args.comm, precision=None if args.precision == "default"
            else args.precision, check=args.check, quiet=args.quiet,
            out_of_core=args.out_of_core, device_memory=args.device_memory,
            schedule=args.schedule)
    except CheckFailed as exc:
        if comm.Get_rank() == 0:
            print(f"summa: check FAILED: {exc}", file=sys.stderr, flush=True)
        return 3
    record["startup_seconds"] = startup
    record["wall_seconds"] = comm.allreduce(process_age(), op=MPI.MAX)
    if comm.Get_rank() != 0:
        return 0
    _print_multiply(args, record, comm.Get_size(), out)
    if args.json:
        record.update(ranks=comm.Get_size(), versions=versions(),
                      alpha=str(record["alpha"]), beta=str(record["beta"]),
                      date=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
        with open(args.json, "a") as fh:
            fh.write(json.dumps(record) + "\n")
    return 0


def _print_multiply(args, record: dict, ranks: int, out) -> None:
    """``summa multiply``'s report of its `record` on `ranks` ranks: what
    was multiplied, how long each phase took, the wall time."""
    residual = record["check_residual"]
    print(f"summa multiply: {plural(ranks, 'rank')}, grid {record['grid'][0]}x"
          f"{record['grid'][1]}, backend {record['backend']}, comm {record['comm']}", file=out)
    mark = {"N": "", "T": "ᵀ", "H": "ᴴ"}
    print(f"  C = {record['alpha']:g} · {args.a}{mark[record['trans_a']]} @ "
          f"{args.b}{mark[record['trans_b']]}"
          + (f" + {record['beta']:g} · {args.c}" if args.c else "")
          + f" -> {args.output}: {record['m']} x {record['n']} x {record['k']} "
          f"{record['dtype']}", file=out)
    if record.get("out_of_core"):
        print("  out of core: A, B, C in host memory, C streamed through the device in tiles",
              file=out)
    if record.get("streamed"):
        print("  blocks mapped from the files and read as the multiply goes; the product "
              "written in place", file=out)
    print(f"  start-up {record['startup_seconds']:.3f} s (Python, imports, MPI), prepare "
          f"{record['prepare_seconds']:.3f} s (headers, devices, grid, plan), "
          f"read {record['read_seconds']:.3f} s, setup {record['setup_seconds']:.3f} s, "
          f"multiply {record['compute_seconds']:.3f} s "
          f"({record['tflops']:.3f} TFLOP/s), "
          + (f"check {record['check_seconds']:.3f} s (scaled residual {residual:.2e}), "
             if residual is not None else f"check skipped ({_why_unchecked(args)}), ")
          + f"write {record['write_seconds']:.3f} s, NaN/Inf scan {record['scan_seconds']:.3f} s",
          file=out)
    print(wall_line(record), file=out)


def _why_unchecked(args) -> str:
    """Why ``multiply`` did not check its product: told not to, or by
    default, where the check would cost more than a small share of it."""
    if args.check is False:
        return "--no-check"
    return "it would cost over 2 % of this multiply; --check makes it"


def wall_line(record: dict) -> str:
    """The report's last line: the wall time so far, and the part of it in
    none of the timed phases where that is at least a millisecond. The
    phases are each the slowest rank's, so their sum can pass the wall time
    by a rounding's worth: that residue is no time at all, not negative."""
    phases = sum(record.get(f"{p}_seconds") or 0.0 for p in
                 ("startup", "prepare", "read", "setup", "compute", "check", "write", "scan"))
    rest = max(0.0, record["wall_seconds"] - phases)
    return (f"  wall {record['wall_seconds']:.3f} s so far"
            + (f", {rest:.3f} s of it in none of the phases" if rest >= 0.001 else ""))

