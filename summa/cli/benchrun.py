"""The ``run`` and ``bench`` commands' timed runs (:mod:`summa.cli.bench`
parses, plans and reports them): A and B generated where the plan keeps
them, the warm-up and timed repetitions of the multiply, each timed on the
slowest rank, the check, and every rank's figures gathered on rank 0."""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass

import numpy as np

from ..runtime.mpi import MPI
from ..device.account import Account
from ..execution.algorithm import SummaStats, run_in_memory
from ..device.backend import NumpyBackend
from ..distribution.grid import ProcessGrid
from ..distribution.matrix import DistMatrix
from ..execution.outofcore import SweepOperands, run_out_of_core
from ..planning.model import gemm_flops
from ..planning.sweepsetup import prepared_sweep
from ..planning.distributed import settled_plan
from ..execution.transpose import PanelsOfA
from ..runtime.progress import JobProgress
from ..execution.jobprogress import block_share, multiply_phase, phase_predictions
from ..api.verify import freivalds
from ..runtime.watchdog import watch
from .ideal import single_device_seconds

__all__ = ["BenchJob", "Measured", "bench_schedule", "measure", "gather_ranks"]


def bench_schedule(args) -> str:
    """The schedule `args` ask for (``run`` has no ``--schedule``)."""
    return getattr(args, "schedule", "panels")  # a sweep's runs use panels


@dataclass(frozen=True)
class BenchJob:
    """One ``run`` or ``bench`` of random matrices, checked
    (:func:`summa.cli.bench._check_bench`): the command's arguments with their
    defaults settled, and the backend every rank agreed on.

    Attributes
    ----------
    args : argparse.Namespace
        The command line's arguments.
    backend : summa.device.backend.Backend
    dtype : numpy.dtype
    shape : tuple
        ``(m, n, k)``.
    precision : str or None
        None for ``--precision default``.
    check : bool
    repeat, warmup : int
    block : tuple or None
        ``(B, B)`` of ``--block B``.
    """

    args: object
    backend: object
    dtype: np.dtype
    shape: tuple
    precision: str | None
    check: bool
    repeat: int
    warmup: int
    block: tuple | None

    @property
    def schedule(self) -> str:
        return bench_schedule(self.args)

    @property
    def phases(self) -> tuple:
        """Its progress line's phases: the generation, each run, the check."""
        runs = self.warmup + self.repeat
        return ("generate", *(f"run {i + 1}/{runs}" for i in range(runs)), "check")

    @property
    def flops(self) -> int:
        m, n, k = self.shape
        return gemm_flops(self.dtype, m, n, k)


@dataclass(frozen=True)
class Measured:
    """One rank's figures of the repetitions (:func:`measure`)."""

    times: list
    best_stats: SummaStats
    nb: object
    generate_seconds: float
    pin_first: float
    locked: object
    reserved_first: int
    residual: float | None
    memory: int
    reserved: int
    local_shape: tuple


def measure(job: BenchJob, plan, grid: ProcessGrid, progress: JobProgress) -> Measured:
    """Generate A and B, run the warm-up and timed repetitions, check the
    product where asked; this rank's figures (the operands are dropped when
    it returns, so the ideal's may take their room). Collective; closes
    `progress`."""
    backend = job.backend
    operands, generate_seconds = _generate(job, plan, grid, progress)
    runs = _repetitions(job, plan, grid, operands, progress)
    if job.check:
        progress.phase("check", 0)
    residual = freivalds(*operands, precision=job.precision, compute=backend) \
        if job.check else None
    progress.close()
    return Measured(**runs, generate_seconds=generate_seconds, residual=residual,
                     memory=backend.memory_in_use(), reserved=backend.memory_reserved(),
                     local_shape=operands[2].local.shape)


def _generate(job: BenchJob, plan, grid: ProcessGrid, progress: JobProgress) -> tuple:
    """This rank's blocks of random A and B and of a zero C, where the plan
    keeps them; ``((A, B, C), seconds)``. Collective."""
    (m, n, k), dtype, backend, seed = job.shape, job.dtype, job.backend, job.args.seed
    home = backend if plan.device_budget is None else NumpyBackend()  # out of core: on the host
    mine = [block_share(shape, grid) * shape[0] * shape[1] * dtype.itemsize
            for shape in ((m, k), (k, n))]
    progress.phase("generate", sum(mine), (m * k + k * n) * dtype.itemsize, "B")
    # Host-held data is still generated on the GPU (many times faster).
    t_gen = time.perf_counter()
    A = DistMatrix.random((m, k), dtype, grid, home, seed=seed, block=job.block,
                          compute=backend)
    progress.add(mine[0])
    B = DistMatrix.random((k, n), dtype, grid, home, seed=seed + 1, block=job.block,
                          compute=backend)
    progress.add(mine[1])
    C = DistMatrix.zeros((m, n), dtype, grid, home, block=job.block)
    backend.synchronize()
    return (A, B, C), time.perf_counter() - t_gen


def _repetitions(job: BenchJob, plan, grid: ProcessGrid, operands, progress: JobProgress) -> dict:
    """The warm-up and timed runs of the multiply, each timed on the slowest
    rank: the timed ones' seconds, the fastest one's stats, the panel width,
    and the first call's pool, page-locking time and whether it locked.
    Collective."""
    A, B, C = operands
    backend, total = job.backend, job.warmup + job.repeat
    times, stats = [], SummaStats()
    predicted = phase_predictions(plan) if grid.rank == 0 else None  # the line's ETA
    for i in range(total):
        with watch(f"all ranks to start repetition {i}"):
            grid.comm.Barrier()
        multiply_phase(progress, plan, grid, predicted, name=f"run {i + 1}/{total}")
        t0 = time.perf_counter()
        # (the blocks made before it are the plan's too, and counted as held)
        holding = sum(x.local.nbytes for x in operands) if plan.device_budget is None else 0
        with Account.of(plan, backend, "the benchmark", holding).drawing(grid.comm) as account:
            if plan.device_budget is None:
                # "auto" is settled by the planner, measured before the first
                # call (timed with it, as before) and cached for the rest; so
                # is whether auto's broadcasters copy directly, asked each call
                settled, measured = settled_plan(plan, A, B, C, PanelsOfA)
                stats = run_in_memory(settled, A, B, C, progress=progress.step)
                stats.extra["panel_width_measured"] = measured
            else:
                # the sweep's broadcasters (kept per grid once made) and the
                # plan made final for them, timed with each call as before
                sweep = SweepOperands(A, B, C)
                final, broadcasters = prepared_sweep(plan, sweep, backend)
                stats = run_out_of_core(final, sweep, backend, broadcasters=broadcasters,
                                        progress=progress.step)
        stats.extra.update(account.report())
        nb = stats.panel_width
        backend.synchronize()
        with watch(f"all ranks to finish repetition {i}"):
            elapsed = grid.comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
        if i == 0:
            first = dict(reserved_first=backend.memory_reserved(),
                         pin_first=stats.extra.get("pin_seconds", 0.0),
                         locked=stats.extra.get("host_locked"))
        if i >= job.warmup:
            times.append(elapsed)
            if elapsed == min(times):
                best_stats = SummaStats(**stats.as_dict())
    return dict(times=times, best_stats=best_stats, nb=nb, **first)


def gather_ranks(job: BenchJob, grid: ProcessGrid, measured: Measured) -> list | None:
    """Every rank's figures (:func:`summa.cli.bench._rank_line`) on rank 0,
    with the ideal each measured where asked; None elsewhere. Collective."""
    best, backend = measured.best_stats, job.backend
    ideal_seconds = row_major_seconds = None
    if getattr(job.args, "ideal", False):
        ideal_seconds, row_major_seconds = single_device_seconds(
            backend, (*measured.local_shape, job.shape[2]), job.dtype, job.precision,
            transposed_a=best.extra.get("transposed_a", False))
    extra = {key: best.extra.get(key) for key in (
        "connect_seconds", "release_seconds", "opened_blocks", "own_first", "head_seconds",
        "between_seconds", "tail_seconds")}
    return grid.comm.gather(dict(rank=grid.rank, coords=[grid.row, grid.col],
                                 host=socket.gethostname(), device=backend.device,
                                 out_of_core=best.extra.get("out_of_core", False),
                                 tile=best.extra.get("tile"), tiles=best.extra.get("tiles"),
                                 pin_seconds=measured.pin_first, host_locked=measured.locked,
                                 generate_seconds=measured.generate_seconds,
                                 memory_bytes=measured.memory, reserved_bytes=measured.reserved,
                                 pool_growth_bytes=measured.reserved - measured.reserved_first,
                                 ideal_seconds=ideal_seconds,
                                 ideal_row_major_seconds=row_major_seconds,
                                 local_shape=list(measured.local_shape), **extra,
                                 staging_bytes=best.extra.get("staging_bytes", 0),
                                 panel_sums=best.extra.get("panel_sums"),
                                 **{key: getattr(best, key)
                                    for key in ("seconds", "compute", "wait",
                                                "comm_seconds")}), root=0)
