"""The ``plan`` command: the plan of a product on the hardware of a profile
(peak memory per rank, mode and tiles, the predicted time and what bounds it),
made without MPI or a GPU."""

from __future__ import annotations

import json

from ..runtime.mpi import MPI
from ..device.backend import DTYPES
from ..device.traits import traits
from ..planning.checks import SCHEDULES
from ..planning.profile import Profile
from ..planning.planner import make_plan
from ..planning.request import PlanRequest
from .common import (COMM_MODES, PRECISION_CHOICES, UsageError, add_hardware, grid_shape,
                     nonnegative_int, positive_int)
from .studies import hardware_ranks, is_root, planning_machine, profile_line

__all__ = ["add_parser", "run"]


def add_parser(sub) -> None:
    """``plan``: the plan (peak memory per rank, mode, tiles) of a product."""
    plan = sub.add_parser("plan", help="predicted time, what bounds it, memory per rank",
                          description="Print the plan of C = A @ B on the hardware of a "
                                      "profile: peak bytes per rank on the device and the "
                                      "host (out of core: the C tiles), the predicted time "
                                      "split into GEMMs, host<->GPU link, GPU<->GPU links and "
                                      "disk, which of them bounds the run, and what would "
                                      "move it.")
    plan.add_argument("--size", type=positive_int, default=16384, metavar="N",
                      help="M = N = K: C is M x N, A M x K, B K x N (default 16384)")
    for dim, what in (("m", "rows of A and C"), ("n", "columns of B and C"),
                      ("k", "columns of A, rows of B")):
        plan.add_argument(f"--{dim}", type=positive_int, default=None,
                          help=f"{dim.upper()}: {what} (default --size)")
    plan.add_argument("--dtype", choices=tuple(DTYPES), default="float64")
    plan.add_argument("--ranks", type=positive_int, default=None,
                      help="ranks, one a GPU (default: every GPU of the hardware; at most "
                           "that many)")
    plan.add_argument("--grid", type=grid_shape, default=None, metavar="PRxPC",
                      help="process grid (default: the one bench and multiply would choose)")
    plan.add_argument("--nb", type=positive_int, default=None,
                      help="panel width (default: what bench and multiply use for this "
                           "backend, dtype, precision and mode)")
    plan.add_argument("--lookahead", type=nonnegative_int, default=1)
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
    add_hardware(plan)
    plan.add_argument("--json", metavar="FILE", default=None,
                      help="append the plan as one JSON object to FILE (the fields a run "
                           "records as its plan)")
    plan.add_argument("--comm", choices=COMM_MODES, default="auto",
                      help="broadcaster (default auto): out of core, copy-engine broadcasts "
                           "(ipc; what auto takes on GPUs within a node) stage every panel "
                           "slot they send once more on the device")


def run(args, comm: MPI.Comm, out) -> int:
    """``summa plan``: make the plan on the hardware asked for and print it (on
    the launcher's rank 0 alone), appending it to ``--json``."""
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
        request = PlanRequest(grid=args.grid, device_memory=args.device_memory,
                              panel_width=args.nb, lookahead=args.lookahead,
                              schedule=args.schedule, broadcaster=args.comm,
                              precision=None if args.precision == "default" else args.precision)
        plan = make_plan((m, n, k), args.dtype, machine, request, staged=(ipc, ipc),
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

