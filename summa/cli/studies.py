"""Scaling studies: the ``calibrate``, ``model`` and ``plot`` commands."""

from __future__ import annotations

import json
import os

from ..runtime.mpi import MPI, launcher_rank
from ..planning.memory import format_bytes, parse_bytes
from ..planning.model import SWEEP_RANKS, RunSetting, predict, recommend, sweep
from ..planning.profile import (DEFAULT_HARDWARE, HARDWARE, Profile, hardware_profile,
                                profile_backend)
from ..device.traits import traits
from ..device.backend import DTYPES
from ..distribution.grid import node_rank
from ..planning.plan import Machine
from ..planning.planner import make_plan
from ..planning.request import PlanRequest
from ..transports.broadcasters import BROADCASTERS
from ..transports.comm import choose_comm
from .calibrate import calibrate, default_sizes, default_widths
from .common import (COMM_MODES, PRECISION_CHOICES, UsageError, add_hardware,
                     agree_backend, dtype_list, grid_shape, int_list,
                     nonnegative_int, positive_int)

__all__ = ["run_calibrate", "run_model", "run_plot", "load_results", "run_study",
           "add_calibrate_parser", "add_model_parser", "add_plot_parser"]


def run_calibrate(args, comm: MPI.Comm, backend, out) -> int:
    """Measure this machine and write (or, with --append, extend) a profile."""
    # "all": every broadcaster that works here; ipc (copy engines; the model
    # times its copies like broadcasts) only where every rank is on one node.
    one_node = node_rank(comm)[1] == comm.Get_size()
    modes = [m for m in BROADCASTERS if m != "ipc" or one_node] if args.comm == "all" \
        else [args.comm]
    usable = []
    for mode in modes:
        try:
            choose_comm(mode, backend)
            usable.append(mode)
        except ValueError:
            if args.comm != "all":
                raise
    profile = calibrate(comm, backend, dtypes=args.dtypes, precision=args.precision_mode,
                        sizes=args.sizes, widths=args.widths, modes=usable,
                        repeat=args.repeat, optional=("ipc",) if args.comm == "all" else ())
    if comm.Get_rank() != 0:
        return 0
    if args.append and os.path.exists(args.output):
        profile = Profile.load(args.output).merge(profile)
    profile.save(args.output)
    said = [f"{len(profile.gemm)} GEMM samples"]
    if profile.bcast:
        said.append("broadcasts " + ", ".join(
            f"{b['comm']} on {b['ranks']} ranks: alpha {b['alpha'] * 1e6:.1f} us, "
            f"beta {b['beta'] / 1e9:.2f} GB/s" for b in profile.bcast))
    if profile.host_memory():
        said.append("host memory memcpy " + ", ".join(
            f"{gbs:.1f} GB/s on {plural(copiers, 'thread')}"
            for copiers, gbs in profile.host_memory()["copy_gbs"]))
    link = profile.host_link()
    if link:
        said.append(f"host link staged {link['h2d_gbs']:.1f} GB/s up, {link['d2h_gbs']:.1f} "
                    f"down (page-locked {link['pinned_h2d_gbs']:.1f} / "
                    f"{link['pinned_d2h_gbs']:.1f})")
    print(f"profile {args.output}: " + "; ".join(said), file=out)
    return 0


def run_model(args, comm: MPI.Comm, out) -> int:
    """Print predictions (and with --sweep strong/weak scaling tables).

    Without --sweep it predicts the setup ``plan`` (and bench and multiply)
    would take for the same options: its grid, panel width and mode, on
    the profile's device memory (:func:`planning_machine`), and recommends
    another only where it is predicted faster."""
    path, line = profile_line(args.profile, getattr(args, "hardware", None))
    profile = Profile.load(path)  # a missing one refused before anything is printed
    size = args.size or 16384
    m, n, k = args.m or size, args.n or size, args.k or size
    kwargs = dict(lookahead=args.lookahead, comm=args.comm_mode, precision=args.precision_mode,
                  ranks_per_node=args.ranks_per_node or gpus_a_node(profile))
    # a sweep's rank counts are the scaling study's, beyond the machine too
    ranks = None if args.sweep else hardware_ranks(args, profile, profile_backend(profile),
                                                   _running(comm), bounded=False)
    args.profile = path
    if not is_root(comm):
        return 0
    print(f"model: {line}; summa calibrate measures this machine's own", file=out)
    if args.sweep:
        _print_sweeps(args, profile, size, kwargs, out)
        return 0
    plan = _setup(args, profile, (m, n, k), ranks)
    grid, nb = plan.grid, plan.panel_width
    pred = predict(profile, m, n, k, args.dtype, grid, nb, RunSetting(**kwargs))
    print(f"model ({args.profile}): {m} x {n} x {k} {args.dtype} on {plural(ranks, 'rank')}, grid "
          f"{grid[0]}x{grid[1]}, nb {nb}, lookahead {args.lookahead}", file=out)
    print(f"  predicted {pred.seconds:.4f} s, {pred.tflops:.3f} TFLOP/s, efficiency "
          f"{pred.efficiency:.3f} ({pred.panels} panels: compute {pred.panel_compute * 1e3:.3f} ms,"
          f" broadcasts {pred.panel_comm * 1e3:.3f} ms each), data in GPU memory "
          "(summa plan adds the host link and names the bound)", file=out)
    best = recommend(profile, m, n, k, args.dtype, ranks, **kwargs)
    if best.seconds >= pred.seconds:  # never recommend what is predicted slower
        print("  recommended: this setup (no other grid or panel width is predicted faster)",
              file=out)
    else:
        print(f"  recommended: grid {best.grid[0]}x{best.grid[1]}, nb {best.panel_width} "
              f"({best.seconds:.4f} s)", file=out)
    if traits(plan.backend).gpu and (args.device_memory or profile.device_memory):
        print("  " + memory_line(plan, args.device_memory or
                                 f"{profile.device_memory / 2**30:.1f} GiB (the profile's)"),
              file=out)
    return 0


def is_root(comm) -> bool:
    """Does this process print: rank 0 of `comm`, or where `comm` is None
    (a command run without MPI) of its launcher?"""
    return (launcher_rank() if comm is None else comm.Get_rank()) == 0


def _running(comm) -> int:
    """The ranks running this command: `comm`'s (None: this process alone)."""
    return 1 if comm is None else comm.Get_size()


def _print_sweeps(args, profile: Profile, size: int, kwargs: dict, out) -> None:
    """Strong and weak scaling tables over ``args.ranks_list``."""
    for weak in (False, True):
        title = (f"weak scaling, N = {size} x P^(1/3)" if weak
                 else f"strong scaling, N = {size}")
        print(f"{title} ({args.dtype}, profile {args.profile})", file=out)
        print(f"{'ranks':>6} {'N':>8} {'grid':>7} {'nb':>6} {'seconds':>10} {'TFLOP/s':>10} "
              f"{'efficiency':>10}", file=out)
        for p, nsize, pred in sweep(profile, size, args.dtype, ranks=args.ranks_list,
                                    weak=weak, **kwargs):
            print(f"{p:>6} {nsize:>8} {pred.grid[0]}x{pred.grid[1]:<5} {pred.panel_width:>6} "
                  f"{pred.seconds:>10.4f} {pred.tflops:>10.2f} {pred.efficiency:>10.3f}",
                  file=out)
        print(file=out)


def _setup(args, profile: Profile, shape, ranks: int):
    """The Plan ``summa plan`` makes for the same options (its grid, panel
    width and mode): the setup ``model`` predicts."""
    machine, peers = planning_machine(args.profile, profile_backend(profile), ranks)
    ipc = args.comm_mode == "ipc" or (args.comm_mode is None and traits(machine.backend).gpu
                                      and peers)
    return make_plan(shape, args.dtype, machine,
                     PlanRequest(grid=args.grid, device_memory=args.device_memory,
                                 panel_width=args.nb, lookahead=args.lookahead,
                                 precision=args.precision_mode), staged=(ipc, ipc))


def memory_line(plan, device_memory: str) -> str:
    """In memory or out of core within `device_memory` per GPU (as given,
    or the profile's), with the tiles and the peak bytes per rank of
    `plan`: the memory side of a prediction, one line."""
    memory, gib = plan.memory, 2.0**30
    if not plan.out_of_core:
        return (f"memory: fits in {device_memory} per GPU ({memory.device_bytes / gib:.2f} "
                "GiB a rank), in memory")
    return (f"memory: {device_memory} per GPU: out of core, C tiles of {memory.tile[0]} x "
            f"{memory.tile[1]} ({memory.tiles[0]} x {memory.tiles[1]} a rank), peak "
            f"{memory.device_bytes / gib:.2f} GiB on the GPU and {memory.host_bytes / gib:.2f} "
            "GiB of host memory a rank")


def profile_line(profile: str | None, hardware: str | None) -> tuple[str, str]:
    """The profile a prediction uses, and one line saying which hardware that
    is: `profile` (a file), the shipped one of `hardware`, else the default."""
    if profile:
        return profile, f"hardware: the profile {profile}"
    name = hardware or DEFAULT_HARDWARE
    assumed = "" if hardware else " (no --hardware or --profile given; others: " + \
        ", ".join(h for h in HARDWARE if h != name) + ")"
    return hardware_profile(name), f"hardware: {name}, {HARDWARE[name]}{assumed}"


def hardware_ranks(args, profile: Profile, backend: str, running: int,
                   bounded: bool = True) -> int:
    """The ranks ``plan`` and ``model`` plan for on the hardware of `profile`.

    Parameters
    ----------
    args : argparse.Namespace
        The command's ``ranks``, ``grid`` and ``device_memory`` (None: not
        given), its ``profile`` or ``hardware``, and ``ranks_per_node`` where
        it has one.
    profile : Profile
        The hardware: on GPUs (`backend`) its GPU count is the default and
        the most ranks, its memory per GPU the most ``--device-memory``.
    running : int
        The ranks where neither the options nor the profile say.
    bounded : bool
        Whether the hardware limits what is asked (``plan``), or only
        gives the defaults (``model``, whose predictions extrapolate).

    Raises
    ------
    ValueError
        Asked for more than the hardware has, or a grid of another rank count.
    """
    ranks = args.ranks or (args.grid[0] * args.grid[1] if args.grid else None)
    if args.grid and args.grid[0] * args.grid[1] != ranks:
        raise ValueError(f"grid {args.grid[0]}x{args.grid[1]} does not hold "
                         f"{plural(ranks, 'rank')}")
    if not traits(backend).gpu:  # a profile counts GPUs, not CPU ranks
        return ranks or running
    if not bounded:
        return ranks or profile.gpus or running
    where = f"--hardware {args.hardware}" if getattr(args, "hardware", None) else \
        f"the profile {args.profile}" if getattr(args, "profile", None) else \
        f"--hardware {DEFAULT_HARDWARE} (the default)"
    gpus, most = profile.gpus, profile.device_memory
    if gpus and (ranks or 0) > gpus:
        asked = f"--ranks {args.ranks}" if args.ranks else \
            f"--grid {args.grid[0]}x{args.grid[1]}"
        raise ValueError(f"{asked} asks for {ranks} ranks, one a GPU, and {where} has "
                         f"{plural(gpus, 'GPU')}" + ("" if profile.data.get("gpus") else
                                                     " (the ranks it was calibrated on; its "
                                                     "\"gpus\" can say more)"))
    per_node = gpus_a_node(profile) or gpus
    if per_node and (getattr(args, "ranks_per_node", None) or 0) > per_node:
        raise ValueError(f"--ranks-per-node {args.ranks_per_node}: {where} has "
                         f"{plural(per_node, 'GPU')} a node")
    if most and args.device_memory and parse_bytes(args.device_memory) > most:
        raise ValueError(f"--device-memory {args.device_memory} is more than a GPU of "
                         f"{where} has ({format_bytes(most)})")
    return ranks or gpus or running


def gpus_a_node(profile: Profile) -> int | None:
    """The GPUs on each node of a `profile` of several nodes (None: one node,
    or GPUs not counted)."""
    return -(-profile.gpus // profile.nodes) if profile.gpus and profile.nodes > 1 else None


def plural(count: int, noun: str) -> str:
    """``"1 rank"``, ``"2 ranks"``."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def planning_machine(profile_path, backend: str, ranks: int) -> tuple:
    """``(Machine, peers)``: `ranks` ranks of `backend` as the profile at
    `profile_path` describes them, each GPU with the profile's device memory
    free where it says (:attr:`summa.planning.profile.Profile.device_memory`),
    as many on a node as its GPUs a node (:attr:`~summa.planning.profile.Profile.nodes`),
    their host copy threads sharing its cores where it says
    (:attr:`~summa.planning.profile.Profile.cores`), and whether a node's GPUs
    read each other's memory. ``plan`` and ``model`` plan on it alike.
    Raises ValueError where the profile does not load."""
    profile = Profile.load(profile_path)
    if not traits(backend).gpu:
        return Machine(backend, ranks), profile.peer_access
    on_node = gpus_a_node(profile) and min(ranks, gpus_a_node(profile))
    return Machine(backend, ranks, free_device=profile.device_memory,
                   ranks_on_node=on_node, cores=profile.cores), profile.peer_access


def load_results(path) -> list[dict]:
    """The JSON lines that ``bench --json`` appended to `path`."""
    try:
        with open(path) as fh:
            return [json.loads(line) for line in fh if line.strip()]
    except FileNotFoundError:
        raise ValueError(f"{path}: no such results file") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not JSON lines from bench --json ({exc})") from None


def run_plot(args, comm: MPI.Comm, out) -> int:
    """Strong scaling (time and efficiency vs P) and weak scaling (efficiency vs
    P) of measured runs, with model curves when a profile is given."""
    if comm.Get_rank() != 0:
        return 0
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = []
    for path in args.results:
        rows += load_results(path)
    if not rows:
        raise ValueError("no results to plot")
    profile = Profile.load(args.profile) if args.profile else None
    fig, (ax_t, ax_e, ax_w) = plt.subplots(1, 3, figsize=(15, 4.5))
    _plot_strong((ax_t, ax_e), rows, profile, args.model_ranks)
    _plot_weak(ax_w, rows, [r for path in args.weak for r in load_results(path)
                            if r.get("efficiency") is not None], profile, args.model_ranks)
    for ax, title, ylabel in ((ax_t, "strong scaling: time", "seconds"),
                              (ax_e, "strong scaling: efficiency", "efficiency"),
                              (ax_w, "weak scaling: efficiency", "efficiency")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("ranks (GPUs)")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    ax_t.set_yscale("log")
    ax_e.set_ylim(0, 1.1)
    ax_w.set_ylim(0, 1.1)
    fig.tight_layout()
    fig.savefig(args.output, dpi=120)
    print(f"wrote {args.output} ({len(rows)} measured runs"
          + (f", model from {args.profile})" if profile else ")"), file=out)
    return 0


def _plot_strong(axes, rows: list, profile, model_ranks) -> None:
    """Time and efficiency against ranks on `axes`, a series per size,
    dtype, precision and comm of the measured `rows`, with the model's
    curves over their ranks and `model_ranks` where `profile` is given."""
    ax_t, ax_e = axes
    groups = {}
    for r in rows:
        key = (r["m"], r["dtype"], r.get("precision", "default"), r.get("comm"))
        groups.setdefault(key, []).append(r)
    for (size, dtype, precision, comm_mode), runs in sorted(groups.items()):
        runs.sort(key=lambda r: r["ranks"])
        label = f"N={size} {dtype}{'/' + precision if precision else ''} {comm_mode}"
        ps = [r["ranks"] for r in runs]
        ax_t.plot(ps, [r["seconds"] for r in runs], "o", label=f"{label} measured")
        eff = [r["efficiency"] for r in runs if r.get("efficiency") is not None]
        if eff:
            ax_e.plot([r["ranks"] for r in runs if r.get("efficiency") is not None], eff, "o",
                      label=f"{label} measured")
        if profile is None:
            continue
        curve_p = sorted(set(ps) | set(model_ranks))
        preds = [recommend(profile, size, size, size, dtype, p,
                           precision=None if precision == "default" else precision,
                           comm=comm_mode if comm_mode in profile.comm_modes() else None)
                 for p in curve_p]
        ax_t.plot(curve_p, [q.seconds for q in preds], "-", label=f"{label} model")
        ax_e.plot(curve_p, [q.efficiency for q in preds], "-", label=f"{label} model")


def _plot_weak(ax, rows: list, weak_runs: list, profile, model_ranks) -> None:
    """Weak scaling's efficiency against ranks on `ax`: the measured
    `weak_runs`, and where `profile` is given the model's series from the
    smallest run (of `weak_runs`, else of the strong `rows`)."""
    if profile is not None:
        base = min(weak_runs or rows, key=lambda r: (r["ranks"], r["m"]))
        weak = sweep(profile, base["m"], base["dtype"], ranks=model_ranks, weak=True)
        ax.plot([p for p, _, _ in weak], [q.efficiency for _, _, q in weak], "-",
                label=f"model, N = {base['m']} x P^(1/3)")
    if weak_runs:
        ax.plot([r["ranks"] for r in weak_runs], [r["efficiency"] for r in weak_runs], "o",
                label="measured")


def add_calibrate_parser(sub) -> None:
    """``calibrate``: measure GEMM and broadcast rates for the model."""
    cal = sub.add_parser("calibrate", help="measure GEMM and broadcast rates for the model",
                         description="Measure this machine (run it with the rank count and "
                                     "ranks per node of interest) and write a JSON profile.")
    cal.add_argument("-o", "--output", default="summa-profile.json", metavar="FILE",
                     help="profile to write (default summa-profile.json)")
    cal.add_argument("--append", action="store_true",
                     help="add these samples to an existing profile (e.g. another rank count)")
    cal.add_argument("--dtypes", type=dtype_list, default=["float64"], metavar="LIST",
                     help="comma-separated dtypes to measure (default float64)")
    cal.add_argument("--sizes", type=int_list, default=None, metavar="LIST",
                     help="per-rank block sizes m = n (default 256,512,1024,2048 on CPU; "
                          "4096,8192,16384 on GPU, and 32768 where it fits)")
    cal.add_argument("--widths", type=int_list, default=None, metavar="LIST",
                     help="panel widths k (default 64..1024 on CPU; 1024..8192 on GPU)")
    cal.add_argument("--comm", choices=("all",) + COMM_MODES[1:], default="all",
                     help="broadcasters to measure (default all that work here)")
    cal.add_argument("--backend", choices=("auto", "numpy", "cupy"), default="auto")
    cal.add_argument("--precision", choices=PRECISION_CHOICES, default="default")
    cal.add_argument("--repeat", type=positive_int, default=3, help="repetitions (best taken)")


def add_model_parser(sub) -> None:
    """``model``: predicted time and efficiency from a profile."""
    model = sub.add_parser("model", help="predict time and efficiency from a profile",
                           description="The alpha-beta-gamma model of SUMMA with lookahead "
                                       "(summa/planning/model.py): predicted time, TFLOP/s and "
                                       "efficiency, the recommended grid and panel width, "
                                       "and with --sweep strong- and weak-scaling tables.")
    add_hardware(model)
    model.add_argument("--size", type=positive_int, default=None, metavar="N",
                       help="M = N = K (default 16384)")
    for dim in ("m", "n", "k"):
        model.add_argument(f"--{dim}", type=positive_int, default=None)
    model.add_argument("--dtype", choices=tuple(DTYPES), default="float64")
    model.add_argument("--ranks", type=positive_int, default=None,
                       help="ranks (GPUs) to predict for (default: the profile's GPUs)")
    model.add_argument("--ranks-per-node", type=positive_int, default=None,
                       help="ranks per node (default: the profile's GPUs a node; all on one "
                            "where it says nothing)")
    model.add_argument("--grid", type=grid_shape, default=None, metavar="PRxPC",
                       help="grid (default: the best predicted)")
    model.add_argument("--nb", type=positive_int, default=None, help="panel width")
    model.add_argument("--lookahead", type=nonnegative_int, default=1)
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
    model.add_argument("--ranks-list", type=int_list, default=list(SWEEP_RANKS),
                       metavar="LIST", help="rank counts of the sweep (default 1,2,4,...,64)")


def add_plot_parser(sub) -> None:
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
    plot.add_argument("--model-ranks", type=int_list, default=list(SWEEP_RANKS),
                      metavar="LIST", help="ranks of the model curves (default up to 64)")


def run_study(args, comm: MPI.Comm, out) -> int:
    if args.command == "calibrate":
        backend = agree_backend(comm, args.backend)
        args.widths = args.widths or default_widths(backend)
        args.precision_mode = None if args.precision == "default" else args.precision
        for dtype in args.dtypes:
            try:
                backend.check_dtype(dtype)
            except ValueError as exc:
                raise UsageError(str(exc)) from None
        args.sizes = args.sizes or default_sizes(comm, backend, args.dtypes)
        return run_calibrate(args, comm, backend, out)
    if args.command == "model":
        args.precision_mode = None if args.precision_mode == "default" else args.precision_mode
        return run_model(args, comm, out)
    return run_plot(args, comm, out)

