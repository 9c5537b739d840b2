"""Command line: ``python -m summa [run|bench|info]``.

Every rank parses the same arguments and so reaches the same verdict; only
rank 0 prints. Errors the user caused raise :class:`UsageError` (a ValueError)
on every rank; ``__main__`` turns them into one line and exit status 2.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import socket
import sys
import time

from ..runtime.mpi import MPI, launcher_rank
from .. import __version__
from .. import options as settings
from ..device.backend import DTYPES, cupy_available, share_cpu_cores
from ..api.checks import PRECISIONS
from .bench import (DEFAULT_SIZE_CPU, DEFAULT_SIZE_GPU, UsageError, agree_backend, run_bench,
                    run_sweep, versions)
from ..transports.comm import choose_comm
from ..distribution.grid import node_rank, parse_grid
from ..planning.model import SWEEP_RANKS, Profile
from ..precision.ozaki_gpu import check_moduli
from ..planning.planner import make_plan
from ..execution.strips import SCHEDULES
from ..device.traits import traits
from ..runtime.watchdog import Watchdog, timeout_from_env
from .studies import hardware_ranks, is_root, planning_machine, plural, profile_line

#: What --comm accepts.
COMM_MODES = ("auto", "nccl", "cuda-aware", "mpi", "ipc")
PRECISION_CHOICES = PRECISIONS[1:]
#: Longest wait of one step on other ranks before the job is aborted (seconds).
DEFAULT_TIMEOUT = 600.0


class _Parser(argparse.ArgumentParser):
    """ArgumentParser that prints on rank 0 only and raises instead of exiting."""

    quiet = False

    def _print_message(self, message, file=None):
        if not _Parser.quiet:
            super()._print_message(message, file)

    def error(self, message):
        raise UsageError(f"{self.prog}: {message}")


def _bounded(convert, minimum, what: str):
    """An argparse type: `convert` the text and require it to be >= `minimum`."""
    def parse(text: str):
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {text}")
        return value
    return parse


_positive_int = _bounded(int, 1, "an integer")
_nonnegative_int = _bounded(int, 0, "an integer")
_seconds = _bounded(float, 0, "seconds")


def _panel_width(text: str):
    return "auto" if text == "auto" else _positive_int(text)


def _int_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers like 1,2,4, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _grid_list(text: str) -> list[tuple[int, int]]:
    try:
        return [parse_grid(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _dtype_list(text: str) -> list[str]:
    values = [x.strip() for x in text.split(",") if x.strip()]
    bad = [v for v in values if v not in DTYPES]
    if not values or bad:
        raise argparse.ArgumentTypeError(f"unknown dtype(s) {', '.join(bad) or text!r}; "
                                         f"choose from {', '.join(DTYPES)}")
    return values


def _scalar(text: str):
    try:
        value = complex(text.replace(" ", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    return value.real if value.imag == 0 else value


def _grid(text: str):
    try:
        return parse_grid(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--grid", type=_grid, default=None, metavar="PRxPC",
                   help="process grid, e.g. 2x3 (default: by the product's shape, blocks of C "
                        "as square as the rank count allows, taller than wide for float64 on "
                        "GPUs; P x 1 for --schedule strips)")
    p.add_argument("--backend", choices=("auto", "numpy", "cupy"), default="auto",
                   help="array backend (default auto: cupy when a GPU is visible)")
    p.add_argument("--comm", choices=COMM_MODES, default="auto",
                   help="panel broadcaster: nccl, cuda-aware MPI, host-staged mpi, or ipc (GPUs "
                        "of one node copy panels straight out of each other's memory by copy "
                        "engines) (default auto: ipc where every grid row and column is on one "
                        "node with a GPU per rank, in GPU memory where its set-up hides and "
                        "always out of core; else nccl when "
                        "available, else cuda-aware MPI when the library reports CUDA support, "
                        "else mpi)")
    p.add_argument("--nb", type=_panel_width, default=None, metavar="W",
                   help="panel width along K, or 'auto' to pick by a short measurement "
                        "(default 256 on CPU; 4096 on GPU, 8192 with tf32, float16 and in-memory float32)")
    p.add_argument("--block", type=_positive_int, default=None, metavar="B",
                   help="block-cyclic distribution block size (default: balanced blocks)")
    p.add_argument("--lookahead", type=_nonnegative_int, default=1, metavar="L",
                   help="panels broadcast ahead of the GEMM (default 1; 0 disables overlap)")
    p.add_argument("--schedule", choices=SCHEDULES, default="panels",
                   help="panels: SUMMA's panels along K (default); strips: on grids of one "
                        "column (Px1), B gathered in column strips of --nb (auto: the "
                        "default width), every GEMM over all of K (in memory only)")
    p.add_argument("--precision", choices=PRECISION_CHOICES, default="default",
                   help="tf32: float32/complex64 GEMMs on TF32 tensor cores (GPU only; "
                        "float16 always uses tensor cores with float32 accumulation); "
                        "fp64-int8: float64 products from exact INT8 tensor-core products "
                        "(Ozaki scheme II, GPU only; as accurate as float64 where the "
                        "entries of each row of A and column of B are of similar size: "
                        "use with --check)")
    p.add_argument("--moduli", type=_bounded(int, 1, "an integer"), default=None, metavar="L",
                   help="fp64-int8: moduli (INT8 GEMMs) per product; fewer is faster and keeps "
                        "fewer bits (default: at K = 32768 15, at least 50 bits in every row, "
                        "51-52 in rows of random entries; 16 keeps 52 in all; 14 about 10x the "
                        "default's error, still within float64's gauge); "
                        "SUMMA_FP64_INT8_MODULI")
    memory = p.add_mutually_exclusive_group()
    memory.add_argument("--out-of-core", action="store_const", const=True, default=None,
                        help="keep A, B, C in host memory and stream C through the GPU in "
                             "tiles (automatic when the in-memory plan does not fit the GPU; "
                             "multiply on GPUs streams C-ordered files this way by default)")
    memory.add_argument("--in-memory", dest="out_of_core", action="store_const", const=False,
                        help="read A and B into GPU memory first (bench's default; multiply's "
                             "where files cannot be streamed)")
    p.add_argument("--device-memory", metavar="SIZE", default=None,
                   help="cap on GPU memory per rank, e.g. 16GiB (implies --out-of-core)")
    p.add_argument("--timeout", type=_seconds, default=None, metavar="SECONDS",
                   help="abort the job, saying which rank waited for what, when one step that "
                        f"waits on other ranks takes longer (default $SUMMA_TIMEOUT or "
                        f"{DEFAULT_TIMEOUT:g}; 0 disables)")


def _add_problem(p: argparse.ArgumentParser, size_help: str) -> None:
    p.add_argument("--size", type=_positive_int, default=None, metavar="N",
                   help=f"M = N = K = N ({size_help})")
    for dim in ("m", "n", "k"):
        p.add_argument(f"--{dim}", type=_positive_int, default=None,
                       help=f"{dim.upper()} (overrides --size)")
    p.add_argument("--dtype", choices=tuple(DTYPES), default="float64",
                   help="element type (default float64; float16 needs the cupy backend)")
    p.add_argument("--seed", type=int, default=1, help="random seed of A (B uses seed+1)")
    p.add_argument("--json", metavar="FILE", default=None,
                   help="append one JSON object with parameters, versions and timings to FILE")


def _add_run(sub) -> None:
    """``run``: a verified multiply of random matrices sized to the machine."""
    run = sub.add_parser("run", help="verified multiply sized to the machine (the default)",
                         description="Multiply two random matrices sized to the machine, check "
                                     "the product (Freivalds) and print a table.")
    _add_common(run)
    _add_problem(run, f"default {DEFAULT_SIZE_CPU} on CPU, {DEFAULT_SIZE_GPU} on GPU")


def _add_bench(sub) -> None:
    """``bench``: time C = A @ B on random matrices, or a sweep of them."""
    bench = sub.add_parser("bench", help="time C = A @ B on random matrices",
                           description="Time C = A @ B on random distributed matrices.")
    _add_common(bench)
    _add_problem(bench, f"default {DEFAULT_SIZE_CPU} on CPU, {DEFAULT_SIZE_GPU} on GPU")
    bench.add_argument("--repeat", type=_positive_int, default=3,
                       help="timed repetitions (default 3; the best is reported)")
    bench.add_argument("--warmup", type=_nonnegative_int, default=1,
                       help="untimed repetitions first (default 1)")
    bench.add_argument("--check", action="store_true",
                       help="verify the product (Freivalds test against the gauge); exit 3 if wrong")
    bench.add_argument("--no-ideal", dest="ideal", action="store_false",
                       help="skip timing the one-device matmul of the per-rank shape (the "
                            "'ideal' that efficiency is measured against)")
    bench.add_argument("--quiet", action="store_true",
                       help="no progress bar (shown on rank 0 when stderr is a terminal)")
    bench.add_argument("--sweep", action="store_true",
                       help="run a series: every size of --sizes on every grid of --grids "
                            "(the rank count is the launcher's: loop over mpiexec -n for that), "
                            "each appended to --json")
    bench.add_argument("--sizes", type=_int_list, default=None, metavar="LIST",
                       help="sizes N of a --sweep (default: --size)")
    bench.add_argument("--grids", type=_grid_list, default=None, metavar="LIST",
                       help="grids of a --sweep, e.g. 2x2,4x1,1x4 (default: every factorisation "
                            "of the rank count)")


def _add_multiply(sub) -> None:
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
    mult.add_argument("--alpha", type=_scalar, default=1.0, help="scale of the product (1)")
    mult.add_argument("--beta", type=_scalar, default=0.0,
                      help="scale of C0 (0); needs --c")
    mult.add_argument("--c", dest="c", metavar="C0.npy", default=None,
                      help="matrix added as beta * C0")
    mult.add_argument("--trans-a", choices=("N", "T", "H"), default="N",
                      help="use A, its transpose or its conjugate transpose (N)")
    mult.add_argument("--trans-b", choices=("N", "T", "H"), default="N", help="likewise for B")
    mult.add_argument("--dtype", choices=tuple(DTYPES), default=None,
                      help="compute (and output) dtype; default: the inputs' common dtype")
    _add_common(mult)
    checking = mult.add_mutually_exclusive_group()
    checking.add_argument("--check", dest="check", action="store_true", default=None,
                          help="always verify the product")
    checking.add_argument("--no-check", dest="check", action="store_false",
                          help="never verify (default: verify when it costs < 2%% of the "
                               "multiply)")
    mult.add_argument("--quiet", action="store_true", help="no progress bar")
    mult.add_argument("--json", metavar="FILE", default=None,
                      help="append one JSON object with parameters and timings to FILE")


def _add_calibrate(sub) -> None:
    """``calibrate``: measure GEMM and broadcast rates for the model."""
    cal = sub.add_parser("calibrate", help="measure GEMM and broadcast rates for the model",
                         description="Measure this machine (run it with the rank count and "
                                     "ranks per node of interest) and write a JSON profile.")
    cal.add_argument("-o", "--output", default="summa-profile.json", metavar="FILE",
                     help="profile to write (default summa-profile.json)")
    cal.add_argument("--append", action="store_true",
                     help="add these samples to an existing profile (e.g. another rank count)")
    cal.add_argument("--dtypes", type=_dtype_list, default=["float64"], metavar="LIST",
                     help="comma-separated dtypes to measure (default float64)")
    cal.add_argument("--sizes", type=_int_list, default=None, metavar="LIST",
                     help="per-rank block sizes m = n (default 256,512,1024,2048 on CPU; "
                          "4096,8192,16384 on GPU, and 32768 where it fits)")
    cal.add_argument("--widths", type=_int_list, default=None, metavar="LIST",
                     help="panel widths k (default 64..1024 on CPU; 1024..8192 on GPU)")
    cal.add_argument("--comm", choices=("all",) + COMM_MODES[1:], default="all",
                     help="broadcasters to measure (default all that work here)")
    cal.add_argument("--backend", choices=("auto", "numpy", "cupy"), default="auto")
    cal.add_argument("--precision", choices=PRECISION_CHOICES, default="default")
    cal.add_argument("--repeat", type=_positive_int, default=3, help="repetitions (best taken)")


def _add_hardware(parser) -> None:
    """``--hardware NAME`` (a shipped profile) or ``--profile FILE`` (calibrate's)."""
    from ..planning.model import HARDWARE
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--hardware", choices=tuple(HARDWARE), default=None,
                       help="predict for this hardware, from the profile shipped with summa: "
                            + "; ".join(f"{k}: {v}" for k, v in HARDWARE.items()))
    which.add_argument("--profile", default=None, metavar="FILE",
                       help="predict from this profile (summa calibrate on your machine)")


def _add_model(sub) -> None:
    """``model``: predicted time and efficiency from a profile."""
    model = sub.add_parser("model", help="predict time and efficiency from a profile",
                           description="The alpha-beta-gamma model of SUMMA with lookahead "
                                       "(summa/planning/model.py): predicted time, TFLOP/s and "
                                       "efficiency, the recommended grid and panel width, "
                                       "and with --sweep strong- and weak-scaling tables.")
    _add_hardware(model)
    model.add_argument("--size", type=_positive_int, default=None, metavar="N",
                       help="M = N = K (default 16384)")
    for dim in ("m", "n", "k"):
        model.add_argument(f"--{dim}", type=_positive_int, default=None)
    model.add_argument("--dtype", choices=tuple(DTYPES), default="float64")
    model.add_argument("--ranks", type=_positive_int, default=None,
                       help="ranks (GPUs) to predict for (default: the profile's GPUs)")
    model.add_argument("--ranks-per-node", type=_positive_int, default=None,
                       help="ranks per node (default: the profile's GPUs a node; all on one "
                            "where it says nothing)")
    model.add_argument("--grid", type=_grid, default=None, metavar="PRxPC",
                       help="grid (default: the best predicted)")
    model.add_argument("--nb", type=_positive_int, default=None, help="panel width")
    model.add_argument("--lookahead", type=_nonnegative_int, default=1)
    model.add_argument("--comm", dest="comm_mode", default=None,
                       help="broadcaster in the profile (default: its fastest, as --comm "
                            "auto picks)")
    model.add_argument("--precision", dest="precision_mode",
                       choices=("default", "tf32", "fp64-int8"), default="default",
                       help="tf32: float32 on tensor cores; fp64-int8: float64 from INT8 "
                            "products (Ozaki scheme II; where the profile has its rates)")
    model.add_argument("--device-memory", metavar="SIZE", default=None,
                       help="GPU memory per rank (e.g. 22GiB): also say whether the product "
                            "fits or goes out of core, its tile and peak bytes")
    model.add_argument("--sweep", action="store_true",
                       help="strong and weak scaling tables over --ranks-list")
    model.add_argument("--ranks-list", type=_int_list, default=list(SWEEP_RANKS),
                       metavar="LIST", help="rank counts of the sweep (default 1,2,4,...,64)")


def _add_plot(sub) -> None:
    """``plot``: scaling plots from bench --json results."""
    plot = sub.add_parser("plot", help="draw scaling plots from bench --json results",
                          description="Strong scaling (time, efficiency vs ranks) and weak "
                                      "scaling (efficiency vs ranks) of measured runs, with "
                                      "model curves when --profile is given.")
    plot.add_argument("results", nargs="+", metavar="RESULTS.jsonl",
                      help="bench --json output of the strong-scaling runs")
    plot.add_argument("--weak", nargs="*", default=[], metavar="RESULTS.jsonl",
                      help="bench --json output of weak-scaling runs (N grown with P)")
    plot.add_argument("-o", "--output", default="scaling.png", metavar="PNG")
    plot.add_argument("--profile", default=None, metavar="FILE", help="draw model curves")
    plot.add_argument("--model-ranks", type=_int_list, default=list(SWEEP_RANKS),
                      metavar="LIST", help="ranks of the model curves (default up to 64)")


def _add_plan(sub) -> None:
    """``plan``: the plan (peak memory per rank, mode, tiles) of a product."""
    plan = sub.add_parser("plan", help="predicted time, what bounds it, memory per rank",
                          description="Print the plan of C = A @ B on the hardware of a "
                                      "profile: peak bytes per rank on the device and the "
                                      "host (out of core: the C tiles), the predicted time "
                                      "split into GEMMs, host<->GPU link, GPU<->GPU links and "
                                      "disk, which of them bounds the run, and what would "
                                      "move it.")
    plan.add_argument("--size", type=_positive_int, default=16384, metavar="N",
                      help="M = N = K: C is M x N, A M x K, B K x N (default 16384)")
    for dim, what in (("m", "rows of A and C"), ("n", "columns of B and C"),
                      ("k", "columns of A, rows of B")):
        plan.add_argument(f"--{dim}", type=_positive_int, default=None,
                          help=f"{dim.upper()}: {what} (default --size)")
    plan.add_argument("--dtype", choices=tuple(DTYPES), default="float64")
    plan.add_argument("--ranks", type=_positive_int, default=None,
                      help="ranks, one a GPU (default: every GPU of the hardware; at most "
                           "that many)")
    plan.add_argument("--grid", type=_grid, default=None, metavar="PRxPC",
                      help="process grid (default: the one bench and multiply would choose)")
    plan.add_argument("--nb", type=_positive_int, default=None,
                      help="panel width (default: what bench and multiply use for this "
                           "backend, dtype, precision and mode)")
    plan.add_argument("--lookahead", type=_nonnegative_int, default=1)
    plan.add_argument("--schedule", choices=SCHEDULES, default="panels",
                      help="panels along K (default), or column strips (grids of one column)")
    plan.add_argument("--precision", choices=PRECISION_CHOICES, default="default",
                      help="tf32: float32 GEMMs on tensor cores (their panels of A are not "
                           "copied transposed); fp64-int8: float64 from INT8 products "
                           "(their residues and sums counted)")
    plan.add_argument("--backend", choices=("numpy", "cupy"), default="cupy")
    plan.add_argument("--order", choices=("C", "F"), default="C",
                      help="how A and B lie in host memory: C (row-major, NumPy's default) or "
                           "F (Fortran order, or a .T view): out of core C is cut the way "
                           "they are read in blocks, and complex128's and float32's panels of B "
                           "are copied row-major for the GEMMs (default C)")
    plan.add_argument("--device-memory", metavar="SIZE", default=None,
                      help="GPU memory cap per rank: plan out of core within it (default: "
                           "the profile's GPU memory, out of core where the product does not "
                           "fit; at most that memory)")
    _add_hardware(plan)
    plan.add_argument("--json", metavar="FILE", default=None,
                      help="append the plan as one JSON object to FILE (the fields a run "
                           "records as its plan)")
    plan.add_argument("--comm", choices=COMM_MODES, default="auto",
                      help="broadcaster (default auto): out of core, copy-engine broadcasts "
                           "(ipc; what auto takes on GPUs within a node) stage every panel "
                           "slot they send once more on the device")


def _add_info(sub) -> None:
    """``info``: what summa sees (MPI, ranks, devices, backend)."""
    info = sub.add_parser("info", help="MPI library, ranks per node, devices, backend",
                          description="Print what summa sees: MPI library, ranks, nodes, "
                                      "devices and the backend it would choose.")
    info.add_argument("--backend", choices=("auto", "numpy", "cupy"), default="auto",
                      help="backend to report (default auto)")
    info.add_argument("--comm", choices=COMM_MODES, default="auto",
                      help="broadcaster to report (default auto)")


def _add_options(sub) -> None:
    """``options``: the settings in effect."""
    opts = sub.add_parser("options", help="the settings (SUMMA_* variables) in effect",
                          description="Print the settings given as VARIABLE=value, "
                                      "then those at their defaults (marked), or with "
                                      "--markdown the table of every setting "
                                      "(docs/options.md).")
    opts.add_argument("--markdown", action="store_true",
                      help="docs/options.md: the table of every setting")
    opts.add_argument("--internal", action="store_true",
                      help="the settings tests and the pool use, too")


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``python -m summa``."""
    parser = _Parser(prog="python -m summa",
                     description="Distributed dense matrix multiplication (SUMMA) over MPI "
                                 "ranks, one GPU per rank (or NumPy on CPU ranks). "
                                 "Run under mpiexec, e.g. mpiexec -n 4 python -m summa bench.")
    parser.add_argument("--version", action="version", version=f"summa {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    _add_run(sub)
    _add_bench(sub)
    _add_multiply(sub)
    _add_calibrate(sub)
    _add_model(sub)
    _add_plot(sub)
    _add_plan(sub)
    _add_info(sub)
    _add_options(sub)
    return parser


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


def _run_multiply(args, comm: MPI.Comm, out) -> int:
    from ..api.files import CheckFailed, multiply_files
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
    print(_wall_line(record), file=out)


def _why_unchecked(args) -> str:
    """Why ``multiply`` did not check its product: told not to, or by
    default, where the check would cost more than a small share of it."""
    if args.check is False:
        return "--no-check"
    return "it would cost over 2 % of this multiply; --check makes it"


def _wall_line(record: dict) -> str:
    """The report's last line: the wall time so far, and the part of it in
    none of the timed phases where that is at least a millisecond. The
    phases are each the slowest rank's, so their sum can pass the wall time
    by a rounding's worth: that residue is no time at all, not negative."""
    phases = sum(record.get(f"{p}_seconds") or 0.0 for p in
                 ("startup", "prepare", "read", "setup", "compute", "check", "write", "scan"))
    rest = max(0.0, record["wall_seconds"] - phases)
    return (f"  wall {record['wall_seconds']:.3f} s so far"
            + (f", {rest:.3f} s of it in none of the phases" if rest >= 0.001 else ""))


def _run_plan(args, comm: MPI.Comm, out) -> int:
    m, n, k = args.m or args.size, args.n or args.size, args.k or args.size
    profile, line = profile_line(args.profile, args.hardware)
    try:
        # the hardware's GPUs and their memory: the defaults and the limits
        ranks = hardware_ranks(args, Profile.load(profile), args.backend,
                               1 if comm is None else comm.Get_size())
        machine, peers = planning_machine(profile, args.backend, ranks)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if machine.free_device and not args.device_memory:
        line += f"; {machine.free_device / 2**30:.1f} GiB a GPU (--device-memory caps it)"
    # auto on GPUs that read each other's memory plans for one node (ipc), the larger of
    # its two figures; without peer access out of core each GPU uploads its own parts
    ipc = args.comm == "ipc" or (args.comm == "auto" and traits(args.backend).gpu and peers)
    try:
        plan = make_plan((m, n, k), args.dtype, machine, grid=args.grid,
                         device_memory=args.device_memory, panel_width=args.nb,
                         lookahead=args.lookahead, schedule=args.schedule,
                         precision=None if args.precision == "default" else args.precision,
                         broadcaster=args.comm, staged=(ipc, ipc),
                         predict=True, profile=profile,
                         storage=("cols", "cols") if args.order == "F" else ("rows", "rows"))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if is_root(comm):
        print(line, file=out)
        print(plan, file=out)
        if args.json:
            with open(args.json, "a") as fh:
                fh.write(json.dumps(plan.as_dict()) + "\n")
    return 0


def _run_study(args, comm: MPI.Comm, out) -> int:
    from . import studies
    if args.command == "calibrate":
        from .calibrate import default_sizes, default_widths
        backend = agree_backend(comm, args.backend)
        args.widths = args.widths or default_widths(backend)
        args.precision_mode = None if args.precision == "default" else args.precision
        for dtype in args.dtypes:
            try:
                backend.check_dtype(dtype)
            except ValueError as exc:
                raise UsageError(str(exc)) from None
        args.sizes = args.sizes or default_sizes(comm, backend, args.dtypes)
        return studies.run_calibrate(args, comm, backend, out)
    if args.command == "model":
        args.precision_mode = None if args.precision_mode == "default" else args.precision_mode
        return studies.run_model(args, comm, out)
    return studies.run_plot(args, comm, out)


def _run_info(args, comm: MPI.Comm, out) -> int:
    backend = agree_backend(comm, args.backend)
    local_rank, local_size = node_rank(comm)
    row = {"rank": comm.Get_rank(), "host": socket.gethostname(), "local_rank": local_rank,
           "backend": backend.describe()}
    rows = comm.gather(row, root=0)
    if comm.Get_rank() != 0:
        return 0
    hosts = sorted({r["host"] for r in rows})
    found = versions()
    print(f"summa {__version__} on Python {found['python']}, numpy {found['numpy']}, "
          f"mpi4py {found['mpi4py']}" + (f", cupy {found['cupy']}" if "cupy" in found
                                             else ""), file=out)
    print(f"MPI library: {found['mpi']} (MPI {'.'.join(map(str, MPI.Get_version()))})",
          file=out)
    print(f"ranks: {comm.Get_size()} on {len(hosts)} node(s), {local_size} on this node; "
          f"near-square grid {'x'.join(map(str, MPI.Compute_dims(comm.Get_size(), 2)))} "
          "(bench, multiply and plan choose by the product's shape and dtype)", file=out)
    print(f"backend: {backend.name}"
          + ("" if backend.is_gpu else
             f" ({'a GPU is visible' if cupy_available() else 'no GPU/CuPy visible'})"), file=out)
    from ..transports.comm import mpi_cuda_aware, nccl_available
    nccl_ok, nccl_note = nccl_available() if backend.is_gpu else (False, "needs cupy")
    aware, aware_note = mpi_cuda_aware()
    print(f"NCCL: {'yes' if nccl_ok else 'no'} ({nccl_note}); CUDA-aware MPI: "
          f"{'yes' if aware else 'no'} ({aware_note})", file=out)
    chosen = choose_comm(args.comm, backend)
    if args.comm == "auto" and backend.is_gpu:
        chosen = (f"ipc in each direction whose grid rows (columns) lie within a node, a "
                  f"GPU per rank (self-tested; in memory where the GEMMs hide its set-up, "
                  f"and out of core), else {chosen}")
    print(f"broadcaster: {chosen} (--comm {args.comm})", file=out)
    from ..device.backend import (compute_priority, cublaslt_path, gemm_library,
                                  transpose_a_setting, transpose_b_setting)
    library = gemm_library()
    if library == "cublaslt" and cublaslt_path():
        library += f" from {cublaslt_path()} (SUMMA_CUBLASLT)"
    print(f"GPU GEMM: {library} (SUMMA_GEMM), compute stream priority: "
          f"{compute_priority()} (SUMMA_COMPUTE_PRIORITY)"
          + ("" if backend.is_gpu else "; both apply to GPUs only"), file=out)
    setting = transpose_a_setting()
    print(f"A's panels copied transposed (read column-major): {setting} (SUMMA_TRANSPOSE_A"
          + ("; auto: float64 and float32 without TF32, on GPUs)" if setting == "auto" else ")"),
          file=out)
    setting = transpose_b_setting()
    print(f"B's panels that lie by columns copied row-major: {setting} (SUMMA_TRANSPOSE_B"
          + ("; auto: complex128 and float32 without TF32, on GPUs)" if setting == "auto"
             else ")"), file=out)
    for r in rows:
        print(f"  rank {r['rank']:>3} on {r['host']} (local rank {r['local_rank']}): "
              f"{r['backend']}", file=out)
    return 0


#: Commands that plan or describe and run nothing: no MPI, no ranks to agree with
#: (with --help and --version, what runs on a laptop without an MPI).
ALONE = ("plan", "model", "options")


def runs_alone(argv=None) -> bool:
    """Does ``python -m summa ARGV`` need no MPI: help, the version, or a
    command of :data:`ALONE`? (Read from the words, before anything starts.)"""
    argv = list(sys.argv[1:] if argv is None else argv)
    return bool(argv) and (argv[0] in ALONE or
                           any(a in ("-h", "--help", "--version") for a in argv))


def main(argv=None, comm: MPI.Comm | None = None, out=None) -> int:
    """Run the command line on `comm` (default COMM_WORLD); return the exit status.

    The commands of :data:`ALONE` (and help) run without a `comm` and never
    start MPI; under a launcher only its rank 0 prints them. The settings
    (:class:`summa.options.Options`: the command's options over ``SUMMA_*``
    variables over defaults) are read and checked once here, the same on
    every rank, and are the current ones for the whole command."""
    out = sys.stdout if out is None else out
    alone = comm is None and runs_alone(argv)
    if not alone and comm is None:
        comm = MPI.COMM_WORLD
    rank = launcher_rank() if comm is None else comm.Get_rank()
    _Parser.quiet = rank != 0
    if rank != 0:
        out = io.StringIO()  # one copy of what the command prints: rank 0's
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version"):
        argv = ["run"] + argv
    args = parser.parse_args(argv)
    if comm is not None:
        share_cpu_cores(node_rank(comm)[1])
    if getattr(args, "moduli", None) is not None:
        if args.precision != "fp64-int8":
            raise UsageError("--moduli applies to --precision fp64-int8")
        try:
            check_moduli(args.moduli, args.precision)
        except ValueError as exc:
            raise UsageError(f"--{exc}") from None
    try:
        opts = settings.Options.from_env(fp64_int8_moduli=getattr(args, "moduli", None))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    with settings.set(opts):
        return _run_command(args, comm, out)


def _settings_text(internal: bool) -> str:
    """``summa options``: the settings given, as VARIABLE=value, then those at
    their defaults, marked so (all of them where none was given)."""
    chosen = settings.current().variables(internal=internal)
    lines = [f"{k}={v}" for k, v in chosen.items()]
    lines.append("# at their defaults (docs/options.md says what each sets):")
    lines += [f"# {k}={v}" if v is not None else f"# {k} (chosen at run time)"
              for k, v in settings.defaults(internal).items() if k not in chosen]
    return "\n".join(lines) + "\n"


def _run_command(args, comm: MPI.Comm, out) -> int:
    """The command `args` names, under the watchdog where it waits on other ranks."""
    if args.command == "options":
        out.write(settings.document() if args.markdown else _settings_text(args.internal))
        return 0
    if args.command == "info":
        return _run_info(args, comm, out)
    if args.command in ("model", "plot"):
        return _run_study(args, comm, out)
    if args.command == "plan":
        return _run_plan(args, comm, out)
    # The collective commands: their waits on other ranks are watched.
    timeout = getattr(args, "timeout", None)  # calibrate has only SUMMA_TIMEOUT
    timeout = timeout if timeout is not None else timeout_from_env(DEFAULT_TIMEOUT)
    if args.command == "calibrate":
        command = _run_study
    elif args.command == "multiply":
        command = _run_multiply
    elif getattr(args, "sizes", None) and args.command == "bench" and not args.sweep or \
            getattr(args, "grids", None) and not args.sweep:
        raise UsageError(f"--{'sizes' if args.sizes else 'grids'} lists a series: it needs "
                         "--sweep (one size: --size)")
    elif getattr(args, "sweep", False):
        def command(args, comm, out):
            return run_sweep(args, comm, out)
    else:
        def command(args, comm, out):
            return run_bench(args, comm, out, verify_default=(args.command == "run"))
    if not timeout:
        return command(args, comm, out)
    with Watchdog(timeout, comm):
        return command(args, comm, out)
