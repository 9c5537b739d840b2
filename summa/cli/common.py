"""What the commands share: the parser that raises :class:`UsageError` on every
rank instead of exiting, the argument types, the argument groups of the
commands that multiply, the backend every rank agrees on and the versions a
record names."""

from __future__ import annotations

import argparse
import platform
import sys

import numpy as np

from ..runtime.mpi import MPI
from .. import __version__
from ..planning.checks import PRECISIONS, SCHEDULES
from ..device.backend import DTYPES, get_backend
from ..distribution.grid import node_rank, parse_grid
from ..planning.profile import HARDWARE

__all__ = ["UsageError", "Parser", "COMM_MODES", "PRECISION_CHOICES", "DEFAULT_TIMEOUT",
           "add_common", "add_problem", "add_hardware", "agree_backend", "versions",
           "bounded", "positive_int", "nonnegative_int", "seconds", "panel_width", "int_list",
           "grid_list", "dtype_list", "scalar", "grid_shape"]

#: What --comm accepts.
COMM_MODES = ("auto", "nccl", "cuda-aware", "mpi", "ipc")
PRECISION_CHOICES = PRECISIONS[1:]
#: Longest wait of one step on other ranks before the job is aborted (seconds).
DEFAULT_TIMEOUT = 600.0


class UsageError(ValueError):
    """Bad command-line input; reported once, exit status 2."""


def versions() -> dict:
    import mpi4py
    out = {"summa": __version__, "python": platform.python_version(), "numpy": np.__version__,
           "mpi4py": mpi4py.__version__,
           "mpi": MPI.Get_library_version().splitlines()[0].strip()}
    if "cupy" in sys.modules:
        out["cupy"] = sys.modules["cupy"].__version__
    return out


def agree_backend(comm: MPI.Comm, name: str):
    """Pick the backend on every rank and fail everywhere if any rank cannot."""
    try:
        backend, error = None, None
        backend = get_backend(name, node_rank(comm)[0])
    except ValueError as exc:
        error = f"rank {comm.Get_rank()}: {exc}"
    errors = [e for e in comm.allgather(error) if e]
    if errors:
        raise UsageError(errors[0])
    names = set(comm.allgather(backend.name))
    if len(names) > 1:
        raise UsageError(f"ranks chose different backends ({', '.join(sorted(names))}); "
                         "pass --backend numpy or --backend cupy")
    return backend


class Parser(argparse.ArgumentParser):
    """ArgumentParser that prints on rank 0 only and raises instead of exiting."""

    quiet = False

    def _print_message(self, message, file=None):
        if not Parser.quiet:
            super()._print_message(message, file)

    def error(self, message):
        raise UsageError(f"{self.prog}: {message}")


def bounded(convert, minimum, what: str):
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


positive_int = bounded(int, 1, "an integer")
nonnegative_int = bounded(int, 0, "an integer")
seconds = bounded(float, 0, "seconds")


def panel_width(text: str):
    return "auto" if text == "auto" else positive_int(text)


def int_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers like 1,2,4, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def grid_list(text: str) -> list[tuple[int, int]]:
    try:
        return [parse_grid(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def dtype_list(text: str) -> list[str]:
    values = [x.strip() for x in text.split(",") if x.strip()]
    bad = [v for v in values if v not in DTYPES]
    if not values or bad:
        raise argparse.ArgumentTypeError(f"unknown dtype(s) {', '.join(bad) or text!r}; "
                                         f"choose from {', '.join(DTYPES)}")
    return values


def scalar(text: str):
    try:
        value = complex(text.replace(" ", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    return value.real if value.imag == 0 else value


def grid_shape(text: str):
    try:
        return parse_grid(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--grid", type=grid_shape, default=None, metavar="PRxPC",
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
    p.add_argument("--nb", type=panel_width, default=None, metavar="W",
                   help="panel width along K, or 'auto' to pick by a short measurement "
                        "(default 256 on CPU; 4096 on GPU, 8192 with tf32, float16 and in-memory float32)")
    p.add_argument("--block", type=positive_int, default=None, metavar="B",
                   help="block-cyclic distribution block size (default: balanced blocks)")
    p.add_argument("--lookahead", type=nonnegative_int, default=1, metavar="L",
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
    p.add_argument("--moduli", type=bounded(int, 1, "an integer"), default=None, metavar="L",
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
    p.add_argument("--timeout", type=seconds, default=None, metavar="SECONDS",
                   help="abort the job, saying which rank waited for what, when one step that "
                        f"waits on other ranks takes longer (default $SUMMA_TIMEOUT or "
                        f"{DEFAULT_TIMEOUT:g}; 0 disables)")


def add_problem(p: argparse.ArgumentParser, size_help: str) -> None:
    p.add_argument("--size", type=positive_int, default=None, metavar="N",
                   help=f"M = N = K = N ({size_help})")
    for dim in ("m", "n", "k"):
        p.add_argument(f"--{dim}", type=positive_int, default=None,
                       help=f"{dim.upper()} (overrides --size)")
    p.add_argument("--dtype", choices=tuple(DTYPES), default="float64",
                   help="element type (default float64; float16 needs the cupy backend)")
    p.add_argument("--seed", type=int, default=1, help="random seed of A (B uses seed+1)")
    p.add_argument("--json", metavar="FILE", default=None,
                   help="append one JSON object with parameters, versions and timings to FILE")


def add_hardware(parser) -> None:
    """``--hardware NAME`` (a shipped profile) or ``--profile FILE`` (calibrate's)."""
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--hardware", choices=tuple(HARDWARE), default=None,
                       help="predict for this hardware, from the profile shipped with summa: "
                            + "; ".join(f"{k}: {v}" for k, v in HARDWARE.items()))
    which.add_argument("--profile", default=None, metavar="FILE",
                       help="predict from this profile (summa calibrate on your machine)")

