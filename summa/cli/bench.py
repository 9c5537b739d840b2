"""The ``run`` and ``bench`` commands: time C = A @ B on random matrices, check
it, and compare with the one-device rate of the per-rank share. Here their
arguments, checks and plan, the record and the report; the timed runs
themselves are :mod:`summa.cli.benchrun`'s."""

from __future__ import annotations

import json
import sys
import time

import numpy as np

from ..runtime.mpi import MPI
from .. import options as settings
from ..planning.checks import check_scalars
from ..transports.comm import choose_comm
from ..distribution.grid import ProcessGrid, check_grid_ranks, grid_shapes
from ..planning.plan import Machine
from ..planning.planner import make_plan
from ..planning.request import PlanRequest
from ..planning.precision import moduli_for
from ..planning.hostroom import check_host_room, own_host_bytes
from ..planning.least import check_least_budget
from ..execution.jobprogress import job_progress
from ..device.traits import traits
from .benchrun import BenchJob, Measured, bench_schedule, gather_ranks, measure
from .ideal import ideal_bytes
from .common import (UsageError, add_common, add_problem, agree_backend, grid_list,
                     int_list, nonnegative_int, positive_int, versions)

__all__ = ["run_bench", "run_sweep", "add_run_parser", "add_bench_parser"]

#: Sizes of the default run: quick on CPU ranks, big enough to fill GPUs.
DEFAULT_SIZE_CPU = 2048
DEFAULT_SIZE_GPU = 32768


def _shape(args, default: int) -> tuple[int, int, int]:
    size = args.size or default
    return (args.m or size, args.n or size, args.k or size)


def _rank_line(r: dict) -> str:
    """One rank's split of the time (and device memory) for the bench report."""
    line = (f"  rank {r['rank']:>3} ({r['coords'][0]},{r['coords'][1]}): compute "
            f"{r['compute']:.4f} s, broadcasts {r['comm_seconds']:.4f} s, exposed "
            f"{r['wait']:.4f} s")
    if r.get("head_seconds") is not None:  # out of core: where the GPU waited
        line += (f" (GPU idle {r['head_seconds']:.4f} s before the first GEMM, "
                 f"{r.get('between_seconds') or 0:.4f} s between GEMMs, "
                 f"{r['tail_seconds']:.4f} s after the last)")
    if r["reserved_bytes"]:
        line += (f", device memory {r['memory_bytes'] / 2**30:.2f} GiB in use, "
                 f"{r['reserved_bytes'] / 2**30:.2f} GiB pool, grew "
                 f"{r['pool_growth_bytes']} B after the first call")
    if r.get("opened_blocks") is not None:  # direct copies (ipc): the set-up, if any
        line += (f", opened {r['opened_blocks']} peer blocks in "
                 f"{1e3 * r['connect_seconds']:.1f} ms")
    if r.get("staging_bytes"):  # ipc's staging buffers, outside the pool but planned
        line += f", {r['staging_bytes'] / 2**30:.2f} GiB of broadcast staging"
    return line


def run_bench(args, comm: MPI.Comm, out, verify_default: bool) -> int:
    """``run`` and ``bench``: time C = A @ B on random matrices (`args`, the
    command line's), check it where asked (or `verify_default`), print the
    table on rank 0 to `out` and append the record to ``--json``; collective.
    Returns the exit status (3: the check failed)."""
    job = _check_bench(args, comm, verify_default)
    plan, grid = _plan_bench(job, comm, out)
    # one line as multiply's: every rank's counts, drawn by rank 0
    progress = job_progress(comm, getattr(args, "quiet", False), phases=job.phases)
    try:
        measured = measure(job, plan, grid, progress)  # its operands freed on return
        per_rank = gather_ranks(job, grid, measured)
        grid_shape = grid.shape
    except BaseException:
        progress.stop()  # this rank's line ends; the others may not reach a close
        raise
    finally:
        grid.free()
    residual = measured.residual
    if comm.Get_rank() != 0:
        return 3 if residual is not None and residual > 1 else 0
    record, ideal_skipped = _bench_record(job, plan, measured, per_rank, comm.Get_size(),
                                          grid_shape)
    _print_bench(job, record, per_rank, ideal_skipped, out)
    if args.json:
        with open(args.json, "a") as fh:
            fh.write(json.dumps(record) + "\n")
    if not record["check_passed"]:
        print(f"summa: check FAILED: scaled residual {residual:.3e} > 1", file=sys.stderr)
        return 3
    return 0


def _check_bench(args, comm: MPI.Comm, verify_default: bool) -> BenchJob:
    """The backend, dtype, shape, precision and broadcaster of `args`, the
    same verdict on every rank (UsageError); collective."""
    _check_budget(args)  # before the backend starts
    backend = agree_backend(comm, args.backend)
    try:
        dtype = backend.check_dtype(args.dtype)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    shape = _shape(args, DEFAULT_SIZE_GPU if backend.is_gpu else DEFAULT_SIZE_CPU)
    precision = None if args.precision == "default" else args.precision
    try:
        check_scalars(1.0, 0.0, dtype, precision, backend)
        choose_comm(args.comm, backend)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return BenchJob(args, backend, dtype, shape, precision,
                    check=getattr(args, "check", False) or verify_default,
                    repeat=getattr(args, "repeat", 1), warmup=getattr(args, "warmup", 1),
                    block=None if args.block is None else (args.block, args.block))


def _check_budget(args) -> None:
    """Refuse a ``--device-memory`` no out-of-core plan of `args`' product
    can take (:func:`summa.planning.least.check_least_budget`), from the
    arguments alone (the same on every rank): a budget of 1 B is refused
    at once, not once CuPy and CUDA have started."""
    try:
        itemsize = np.dtype(args.dtype).itemsize
    except TypeError:
        return  # the backend names a dtype it does not take
    try:
        check_least_budget(_shape(args, min(DEFAULT_SIZE_CPU, DEFAULT_SIZE_GPU)), itemsize,
                           PlanRequest(device_memory=args.device_memory, panel_width=args.nb,
                                       out_of_core=args.out_of_core, schedule=bench_schedule(args)))
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _plan_bench(job: BenchJob, comm: MPI.Comm, out) -> tuple:
    """The Plan and the ProcessGrid of `job`, their notes printed on rank 0;
    collective."""
    args = job.args
    try:
        # bad input: one message, before any warning
        plan = make_plan(job.shape, job.dtype, Machine.live(comm, job.backend),
                         PlanRequest(grid=args.grid, out_of_core=args.out_of_core,
                                     device_memory=args.device_memory, panel_width=args.nb,
                                     lookahead=args.lookahead, schedule=job.schedule,
                                     precision=job.precision, broadcaster=args.comm),
                         host_copies="lock")  # the same blocks every repetition: lock once
        check_host_room(own_host_bytes(plan), comm)  # before any matrix is made
        grid = ProcessGrid(comm, plan.grid)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if grid.core_note and grid.rank == 0:
        print(f"summa: warning: {grid.core_note}", file=sys.stderr, flush=True)
    if plan.note and grid.rank == 0:
        print(f"summa: {plan.note}", file=out)
    return plan, grid


def _ideal(job: BenchJob, per_rank: list, tflops: float, size: int,
           transposed_a: bool) -> dict:
    """Ideal: P x the one-device rate on the largest per-rank share
    (HPL-style timing makes the slowest rank the measure, so the largest
    share is fair); ``ideal_tflops``, ``efficiency``,
    ``ideal_row_major_tflops`` (None where not measured) and
    ``ideal_skipped`` (the bytes it would have needed, where they did not
    fit)."""
    found = dict(ideal_tflops=None, efficiency=None, ideal_row_major_tflops=None,
                 ideal_skipped=None)
    if not getattr(job.args, "ideal", False):
        return found
    (m, n, k), flops = job.shape, job.flops
    biggest = max(per_rank, key=lambda r: r["local_shape"][0] * r["local_shape"][1])
    if biggest["ideal_seconds"] is None:
        found["ideal_skipped"] = ideal_bytes((*biggest["local_shape"], k), job.dtype,
                                              transposed_a, job.precision)
    elif biggest["ideal_seconds"]:
        mloc, nloc = biggest["local_shape"]
        work = (flops / (m * n * k)) * mloc * nloc * k / 1e12
        found["ideal_tflops"] = work / biggest["ideal_seconds"] * size
        found["ideal_row_major_tflops"] = work / biggest["ideal_row_major_seconds"] * size
        found["efficiency"] = tflops / found["ideal_tflops"]
    return found


def _bench_record(job: BenchJob, plan, measured: Measured, per_rank: list, size: int,
                  grid_shape) -> tuple:
    """The JSON record of a run (rank 0), and the bytes the ideal would have
    needed where it was skipped for want of room (else None)."""
    args, (m, n, k), stats = job.args, job.shape, measured.best_stats
    best = min(measured.times)
    tflops = job.flops / best / 1e12
    residual = measured.residual
    transposed_a = bool(stats.extra.get("transposed_a", False))
    ideal = _ideal(job, per_rank, tflops, size, transposed_a)
    # Out of core, the sweep's own plan: it knows its broadcasters' staging.
    planned = stats.extra.get("device_bytes_planned", plan.memory.device_bytes)
    record = {"command": args.command or "run", "m": m, "n": n, "k": k,
              "dtype": job.dtype.name, "precision": args.precision,
              "ranks": size, "grid": list(grid_shape), "backend": job.backend.name,
              "comm": stats.comm, "nb": measured.nb, "block": args.block,
              "lookahead": args.lookahead, "schedule": job.schedule,
              "transposed_a": transposed_a,
              "repeat": job.repeat, "warmup": job.warmup,
              "times": measured.times, "seconds": best, "tflops": tflops,
              "tflops_per_rank": tflops / size,
              "panels": stats.panels, "check_residual": residual,
              "check_passed": residual is None or residual <= 1,
              "ideal_tflops": ideal["ideal_tflops"], "efficiency": ideal["efficiency"],
              "ideal_row_major_tflops": ideal["ideal_row_major_tflops"],
              "out_of_core": bool(per_rank[0].get("out_of_core")), "tile": per_rank[0].get("tile"),
              "planned_device_bytes": planned, "planned_host_bytes": plan.memory.host_bytes,
              "plan": plan.as_dict(),
              "versions": versions(), "ranks_detail": per_rank,
              "date": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    if args.precision == "fp64-int8":  # what decides its speed and accuracy, and its knobs
        # one rank in memory makes one product over all of K; else one a panel
        whole = tuple(grid_shape) == (1, 1) and not record["out_of_core"]
        record["fp64_int8"] = {"moduli": moduli_for(k if whole else min(measured.nb, k)),
                               **{key: value for key, value in
                                  sorted(settings.current().variables().items())
                                  if key.startswith(("SUMMA_FP64_INT8_", "SUMMA_OOC_TILES",
                                                     "SUMMA_INT8_GEMM"))}}
    return record, ideal["ideal_skipped"]


def _print_bench(job: BenchJob, record: dict, per_rank: list, ideal_skipped, out) -> None:
    """The report of a run (rank 0): the table, then where the time went."""
    m, n, k, size, grid_shape = (record[key] for key in ("m", "n", "k", "ranks", "grid"))
    residual, ok, tflops = record["check_residual"], record["check_passed"], record["tflops"]
    print(f"summa {record['command']}: {size} rank{'' if size == 1 else 's'}, grid {grid_shape[0]}x{grid_shape[1]}, "
          f"backend {job.backend.describe()}, comm {record['comm']}"
          + (", column strips" if job.schedule == "strips" else "")
          + (", A's panels transposed" if record["transposed_a"] else ""), file=out)
    header = f"{'M x N x K':>22} {'dtype':>10} {'nb':>5} {'seconds':>9} {'TFLOP/s':>9} " \
             f"{'per rank':>9} {'max err/gauge':>14}"
    err = "-" if residual is None else f"{residual:.2e} {'ok' if ok else 'FAIL'}"
    print(header, file=out)
    label = job.dtype.name + (f"/{job.precision}" if job.precision else "")
    print(f"{f'{m} x {n} x {k}':>22} {label:>10} {record['nb']:>5} {record['seconds']:>9.4f} "
          f"{tflops:>9.3f} {tflops / size:>9.3f} {err:>14}", file=out)
    where = "GPU" if job.backend.is_gpu and not per_rank[0].get("out_of_core") else "host"
    print(f"data: A and B generated in {max(r['generate_seconds'] for r in per_rank):.2f} s "
          f"({where} memory)", file=out)
    _print_where(job, record, per_rank, ideal_skipped, out)


def _print_where(job: BenchJob, record: dict, per_rank: list, ideal_skipped, out) -> None:
    """The report's lines after the table: out of core, the ideal, the
    memory plan, and each rank's split of the time."""
    size, tflops, planned = record["ranks"], record["tflops"], record["planned_device_bytes"]
    if per_rank[0].get("out_of_core"):
        tm, tn = per_rank[0]["tile"]
        rows, cols = per_rank[0]["tiles"]
        print(f"out of core: A, B, C in host memory, C streamed through the device in "
              f"{rows} x {cols} tiles of up to {tm} x {tn}", file=out)
        unlocked = [r["rank"] for r in per_rank if not r.get("host_locked")]
        print(f"  host memory page-locked in {max(r['pin_seconds'] for r in per_rank):.2f} s "
              "on the first call" + (f"; NOT locked on ranks {unlocked}: copies there are "
                                     "synchronous and slow" if unlocked else ""), file=out)
    if record["efficiency"] is not None:
        also = " (also with A column-major)" if record["transposed_a"] else ""
        print(f"ideal ({size} x the faster one-device product of the per-rank shape: "
              f"{job.backend.xp.__name__}.matmul or summa's GEMM{also}): "
              f"{record['ideal_tflops']:.3f} TFLOP/s; efficiency {record['efficiency']:.3f}",
              file=out)
        if record["transposed_a"]:
            row_major = record["ideal_row_major_tflops"]
            print(f"  against A row-major as given ({row_major:.3f} TFLOP/s): "
                  f"{tflops / row_major:.3f}", file=out)
    elif ideal_skipped:
        print(f"ideal: not measured: one device's product of the per-rank shape needs "
              f"{ideal_skipped / 2**30:.1f} GiB, more than its free memory "
              "(--no-ideal skips it without asking)", file=out)
    if planned:
        print(f"memory plan: {planned / 2**30:.2f} GiB of device memory per rank "
              f"(largest rank; measured pool below)", file=out)
    for r in per_rank:
        print(_rank_line(r), file=out)


def run_sweep(args, comm: MPI.Comm, out) -> int:
    """``bench --sweep``: every size of ``--sizes`` on every grid of ``--grids``,
    one bench run each, all appended to ``--json``. Returns the worst status."""
    import copy
    if not args.json:
        raise UsageError("bench --sweep needs --json FILE to collect the series")
    p = comm.Get_size()
    grids = args.grids or grid_shapes(p)
    for grid in grids:
        try:
            check_grid_ranks(grid, p)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    sizes = args.sizes or [args.size or (DEFAULT_SIZE_CPU if traits(args.backend).cpu_only
                                         else None)]
    status = 0
    for size in sizes:
        for grid in grids:
            one = copy.copy(args)
            one.size, one.grid, one.m, one.n, one.k = size, grid, None, None, None
            status = max(status, run_bench(one, comm, out, verify_default=False))
    return status


def add_run_parser(sub) -> None:
    """``run``: a verified multiply of random matrices sized to the machine."""
    run = sub.add_parser("run", help="verified multiply sized to the machine (the default)",
                         description="Multiply two random matrices sized to the machine, check "
                                     "the product (Freivalds) and print a table.")
    add_common(run)
    add_problem(run, f"default {DEFAULT_SIZE_CPU} on CPU, {DEFAULT_SIZE_GPU} on GPU")


def add_bench_parser(sub) -> None:
    """``bench``: time C = A @ B on random matrices, or a sweep of them."""
    bench = sub.add_parser("bench", help="time C = A @ B on random matrices",
                           description="Time C = A @ B on random distributed matrices.")
    add_common(bench)
    add_problem(bench, f"default {DEFAULT_SIZE_CPU} on CPU, {DEFAULT_SIZE_GPU} on GPU")
    bench.add_argument("--repeat", type=positive_int, default=3,
                       help="timed repetitions (default 3; the best is reported)")
    bench.add_argument("--warmup", type=nonnegative_int, default=1,
                       help="untimed repetitions first (default 1)")
    bench.add_argument("--check", action="store_true",
                       help="verify the product (Freivalds test against the gauge); exit 3 if wrong")
    bench.add_argument("--no-ideal", dest="ideal", action="store_false",
                       help="skip timing the one-device matmul of the per-rank shape (the "
                            "'ideal' that efficiency is measured against)")
    bench.add_argument("--quiet", action="store_true",
                       help="no progress line (rank 0's stderr: redrawn on a terminal, "
                            "else a line a minute)")
    bench.add_argument("--sweep", action="store_true",
                       help="run a series: every size of --sizes on every grid of --grids "
                            "(the rank count is the launcher's: loop over mpiexec -n for that), "
                            "each appended to --json")
    bench.add_argument("--sizes", type=int_list, default=None, metavar="LIST",
                       help="sizes N of a --sweep (default: --size)")
    bench.add_argument("--grids", type=grid_list, default=None, metavar="LIST",
                       help="grids of a --sweep, e.g. 2x2,4x1,1x4 (default: every factorisation "
                            "of the rank count)")

