"""Command line: ``python -m summa [run|bench|info]``.

Every rank parses the same arguments and so reaches the same verdict; only
rank 0 prints. Errors the user caused raise :class:`UsageError` (a ValueError)
on every rank; ``__main__`` turns them into one line and exit status 2.
"""

from __future__ import annotations

import argparse
import io
import sys

from ..runtime.mpi import MPI, launcher_rank
from .. import __version__
from .. import options as settings
from ..device.backend import share_cpu_cores
from ..distribution.grid import node_rank
from ..precision.ozaki_gpu import check_moduli
from ..runtime.watchdog import Watchdog, timeout_from_env
from . import info, multiply, options, plan
from .bench import add_bench_parser, add_run_parser, run_bench, run_sweep
from .common import DEFAULT_TIMEOUT, Parser, UsageError
from .studies import add_calibrate_parser, add_model_parser, add_plot_parser, run_study

__all__ = ["main", "build_parser", "runs_alone", "ALONE", "UsageError"]


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``python -m summa``."""
    parser = Parser(prog="python -m summa",
                     description="Distributed dense matrix multiplication (SUMMA) over MPI "
                                 "ranks, one GPU per rank (or NumPy on CPU ranks). "
                                 "Run under mpiexec, e.g. mpiexec -n 4 python -m summa bench.")
    parser.add_argument("--version", action="version", version=f"summa {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    add_run_parser(sub)
    add_bench_parser(sub)
    multiply.add_parser(sub)
    add_calibrate_parser(sub)
    add_model_parser(sub)
    add_plot_parser(sub)
    plan.add_parser(sub)
    info.add_parser(sub)
    options.add_parser(sub)
    return parser


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
    Parser.quiet = rank != 0
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


def _run_command(args, comm: MPI.Comm, out) -> int:
    """The command `args` names, under the watchdog where it waits on other ranks."""
    if args.command == "options":
        return options.run(args, out)
    if args.command == "info":
        return info.run(args, comm, out)
    if args.command in ("model", "plot"):
        return run_study(args, comm, out)
    if args.command == "plan":
        return plan.run(args, comm, out)
    # The collective commands: their waits on other ranks are watched.
    timeout = getattr(args, "timeout", None)  # calibrate has only SUMMA_TIMEOUT
    timeout = timeout if timeout is not None else timeout_from_env(DEFAULT_TIMEOUT)
    if args.command == "calibrate":
        command = run_study
    elif args.command == "multiply":
        command = multiply.run
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

