"""The ``.npy`` files workflow (``summa multiply``): multiply files into a file.

:func:`multiply_files` checks everything it can before reading a byte (headers,
shapes, dtypes, the output path, the grid), reads each rank's blocks straight
from the files, multiplies, verifies, and only then writes the product
atomically. :func:`summa.api.multiply.matmul_arrays` is the same for arrays in
memory. What is settled before a byte of data is read (the checks of the
files, the plan, the read-ahead) is :mod:`summa.api.fileplan`'s; this module
runs the phases on the grid (read, multiply, scan, check, write), each timed.

Dtype rule: A and B must have the same dtype, or ``dtype`` must be given, in
which case both (and C0) are converted to it; there is no silent promotion,
and integer files need ``dtype``."""

from __future__ import annotations

import contextlib
import functools
import sys
import time
from dataclasses import dataclass, replace

import numpy as np

from ..runtime.mpi import MPI
from ..runtime.agree import collectively
from ..device.account import Account
from ..execution.algorithm import SummaStats, prepare, run_in_memory
from ..device.backend import NumpyBackend
from ..distribution.grid import ProcessGrid, node_rank
from ..host.filemaps import prefetch_scratch
from .. import options as settings
from ..runtime.faults import inject
from ..host.npyio import map_block
from ..host.npyoutput import AtomicNpyWriter
from ..distribution.layout import Layout
from ..distribution.matrix import DistMatrix
from ..runtime.progress import JobProgress
from ..execution.outofcore import SweepOperands, run_out_of_core
from ..planning.model import gemm_flops
from ..planning.hostroom import check_host_room, own_host_bytes
from ..planning.least import check_least_budget
from ..planning.request import PlanRequest
from ..planning.distributed import settled_plan
from ..planning.sweepsetup import prepared_sweep
from ..execution.transpose import PanelsOfA
from .verify import freivalds
from ..execution.jobprogress import block_share, job_progress, multiply_phase, phase_predictions
from ..runtime.watchdog import watch
from .nonfinite import nonfinite_note, overflow_note
from .fileplan import (FilesJob, Timeline, check_files, maps_files, plan_files,
                       read_ahead_inputs, streamable)

__all__ = ["multiply_files", "CheckFailed"]


class CheckFailed(RuntimeError):
    """The product failed Freivalds' test (exit status 3); nothing was written."""


def _nonfinite(M: DistMatrix) -> int:
    xp = M.backend.xp
    return int(M.grid.comm.allreduce(int((~xp.isfinite(M.local)).sum()), op=MPI.SUM))


def _timed(comm, phase: str, fn, *args, **kwargs):
    """Run collective `fn` and return (result, seconds of the slowest rank)."""
    with watch(f"all ranks to start the {phase} phase"):
        comm.Barrier()
    t0 = time.perf_counter()
    result = fn(*args, **kwargs)
    with watch(f"all ranks to finish the {phase} phase"):
        return result, comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)


@dataclass(frozen=True)
class _FilesRun:
    """What the phases of a planned multiply of files share."""

    job: FilesJob
    plan: object
    backend: object
    comm: MPI.Comm
    grid: ProcessGrid
    progress: JobProgress
    warn: object
    record: dict
    timeline: Timeline
    home: object = None
    writer: AtomicNpyWriter | None = None

    @property
    def rank0(self) -> bool:
        return self.comm.Get_rank() == 0

    @functools.cached_property
    def predicted(self) -> dict:
        """The plan's seconds of each phase, for the progress line's time
        left (rank 0's: the others show nothing)."""
        return phase_predictions(self.plan, self.streaming) if self.rank0 else {}

    @property
    def streaming(self) -> bool:
        """Out of core, blocks of files in the compute dtype are memory-mapped
        (:func:`_mapped`) and read as the multiply goes (no read phase
        before it), and the product is
        written into the output file in place: the wall time tends to the
        longest of reading, multiplying and writing, not their sum."""
        return self.plan.device_budget is not None and self.job.block is None


def _warn_stderr(text: str) -> None:
    print(f"summa: warning: {text}", file=sys.stderr, flush=True)


@settings.entry_point
def multiply_files(a_path, b_path, out_path, comm: MPI.Comm | None = None, *, alpha=1.0,
                   beta=0.0, c_path=None, trans_a="N", trans_b="N", dtype=None, grid=None,
                   block=None, panel_width=None, lookahead=1, backend="auto",
                   broadcaster="auto", precision=None, check=None, quiet=False,
                   warn=None, out_of_core=None, device_memory=None,
                   schedule="panels") -> dict:
    """``out = alpha * op(A) @ op(B) + beta * C0`` from and to .npy files; collective.

    Parameters
    ----------
    a_path, b_path : str
        Input files (C or Fortran order).
    out_path : str
        Output file; written atomically, and only if the product passed the check.
    comm : MPI.Comm, optional
        Ranks to use (default COMM_WORLD).
    c_path : str, optional
        C0, required when ``beta != 0``.
    check : bool or None
        Freivalds' test; None runs it when it costs < 2 % of the multiply.
    out_of_core, device_memory : bool or None, str
        Keep A, B, C in host memory and stream C through the GPU in tiles:
        None (default) does so on GPUs where the files can be read as the
        multiply goes (C order, untransposed, in the compute dtype, no C0,
        balanced blocks; the wall time then tends to the longest of reading,
        multiplying and writing), and where the in-memory plan does not fit;
        False reads everything into GPU memory first. `device_memory` caps the
        GPU memory per rank, e.g. "16GiB".
    schedule : {"panels", "strips"}
        See :func:`summa.execution.algorithm.summa` (strips: grids of one column, in memory).
    warn : callable, optional
        Receives warnings (e.g. NaN/Inf in the inputs) on rank 0; default stderr.
    options : summa.options.Options, optional
        The settings (default: the current ones, from ``SUMMA_*`` variables
        read once here; docs/options.md).

    Returns
    -------
    dict
        Shapes, dtype, grid, timings of each phase (slowest rank) and the check.

    Raises
    ------
    ValueError
        Bad input, the same on every rank, before any data is read.
    CheckFailed
        The product failed the check; nothing was written.
    """
    comm = MPI.COMM_WORLD if comm is None else comm
    timeline = Timeline()
    request = PlanRequest(grid=grid, out_of_core=out_of_core, device_memory=device_memory,
                          trans_a=trans_a, trans_b=trans_b, panel_width=panel_width,
                          lookahead=lookahead, schedule=schedule, precision=precision,
                          broadcaster=broadcaster)
    job = check_files(FilesJob(a_path, b_path, c_path, out_path, alpha=alpha, beta=beta,
                               dtype=dtype, block=block, backend=backend, check=check,
                               request=request), comm)
    check_least_budget(job.shape, job.compute.itemsize, request)  # (before CUDA starts)
    # The disk starts on the inputs while CUDA starts and the multiply plans.
    local, on_node = node_rank(comm)
    ahead = read_ahead_inputs(job.headers, comm, local, on_node)
    try:
        job, be, plan, record = plan_files(job, comm, local, timeline)
        check_host_room(own_host_bytes(plan, maps_files(job, plan)), comm)  # before any read
        with ProcessGrid(comm, plan.grid) as pgrid, contextlib.ExitStack() as stack:
            run = _start_files(_FilesRun(job, plan, be, comm, pgrid, job_progress(comm, quiet),
                                         warn or _warn_stderr, record, timeline), stack, ahead)
            stack.callback(run.progress.stop)  # a failure: the line ends all the same
            operands = _read_files(run)
            inputs_finite, C0, scan = _scan_inputs(run, operands)
            stats = _multiply_files(run, operands)
            _scan_product(run, operands, stats, inputs_finite, scan)
            _record_stats(run, stats)
            _check_product(run, operands, C0)
            _write_product(run, operands[2])
            run.progress.close()
    finally:
        for stop in ahead:  # done, or failed: no thread goes on reading
            stop.set()
    timeline.mark("close")
    return record


def _start_files(run: _FilesRun, stack, ahead: list) -> _FilesRun:
    """Warn of the grid's and the plan's notes, open the output file where
    the product is written in place (streamed, no C0), stop the read-aheads
    where the read phase reads it all; `run` with its data's home and the
    writer. Collective."""
    record, budget = run.record, run.plan.device_budget
    record["grid"] = list(run.grid.shape)
    if run.grid.core_note and run.rank0:
        run.warn(run.grid.core_note)
    if run.plan.note and run.rank0:
        run.warn(run.plan.note)
    home = run.backend if budget is None else NumpyBackend()  # out of core: data on the host
    record["out_of_core"] = budget is not None
    writer = None
    if run.streaming and not run.job.c_path:
        writer = stack.enter_context(AtomicNpyWriter(run.job.out, run.job.shape[:2],
                                                     run.job.compute, run.comm,
                                                     keep_errors=True))
    record["streamed"] = run.streaming
    if not run.streaming:  # the read phase's own threads read it all now; the
        for stop in ahead:  # read-aheads would seek the disk away from them
            stop.set()
    run.timeline.mark("grid, plan")
    record["prepare_seconds"] = run.comm.allreduce(
        time.perf_counter() - run.timeline.started, op=MPI.MAX)
    return replace(run, home=home, writer=writer)


def _read_files(run: _FilesRun) -> tuple:
    """The read phase: this rank's blocks of A, B and C (C0, the output
    file's block, or zeros), timed per operand; collective."""
    job, pgrid, home, progress = run.job, run.grid, run.home, run.progress
    (m, n, k), itemsize = job.shape, job.compute.itemsize
    shapes = {"A": (m, k), "B": (k, n), "C": (m, n) if job.c_path else (0, 0)}
    mine = {x: block_share(s, pgrid) * s[0] * s[1] * itemsize for x, s in shapes.items()}
    progress.phase("read", sum(mine.values()), sum(s[0] * s[1] for s in shapes.values())
                   * itemsize, "B", run.predicted.get("read"))
    parts = run.record["read_parts"] = {}  # this rank's seconds per operand

    def read_operand(name, path, trans):
        t0 = time.perf_counter()
        X = (_mapped(job.headers[name], trans, job.compute, pgrid) if run.streaming
             else None) or DistMatrix.from_npy(path, pgrid, home, job.block, trans, job.compute)
        parts[name] = time.perf_counter() - t0
        return X

    def read_all():
        inject("read")
        A = read_operand("A", job.a_path, job.trans[0])
        progress.add(mine["A"])
        B = read_operand("B", job.b_path, job.trans[1])
        progress.add(mine["B"])
        t0 = time.perf_counter()
        if job.c_path:
            C = DistMatrix.from_npy(job.c_path, pgrid, home, job.block, "N", job.compute)
        elif run.writer is not None:
            C = _output_block(run.writer, job.shape[:2], job.compute, pgrid)
        else:
            C = DistMatrix.zeros(job.shape[:2], job.compute, pgrid, home, job.block)
        home.synchronize()
        parts["C"] = time.perf_counter() - t0
        progress.add(mine["C"])
        return A, B, C
    operands, run.record["read_seconds"] = _timed(run.comm, "read", read_all)
    run.timeline.mark("read")
    return operands


def _inputs(run: _FilesRun, operands) -> tuple:
    """A, B and C0 (None where there is none) of `operands` (A, B, C)."""
    A, B, C = operands
    return A, B, C if run.job.c_path else None


def _scan_inputs(run: _FilesRun, operands) -> tuple:
    """Warn of NaN/Inf in the inputs read whole (streamed ones are scanned
    only where the product is not finite), and keep C0 for the check;
    returns ``(inputs finite or None where not scanned, C0 or None, this
    rank's seconds)``. Collective."""
    t0 = time.perf_counter()
    inputs_finite = None
    if not run.streaming:  # mapped operands would be read whole here: the product is asked
        inputs_finite = _warn_nonfinite(run.job.headers, _inputs(run, operands), run.rank0,
                                        run.warn)
    C0 = operands[2].copy() if run.job.check and run.job.beta != 0 else None
    scan = time.perf_counter() - t0
    run.timeline.mark("NaN/Inf scan")
    return inputs_finite, C0, scan


def _multiply_files(run: _FilesRun, operands) -> SummaStats:
    """The set-up and multiply phases, each timed; this rank's stats."""
    job, be, comm = run.job, run.backend, run.comm
    A, B, C = operands
    # One-time costs (communicators, their self-test, the BLAS library's
    # start) are timed on their own, so "multiply" is the multiply; out of
    # core the plan is made final for the broadcasters made there.
    (plan, broadcasters), run.record["setup_seconds"] = _timed(comm, "setup", _warm_up, run,
                                                                operands)
    run.timeline.mark("setup")
    stats = SummaStats()
    multiply_phase(run.progress, plan, run.grid, run.predicted)
    inject("multiply")

    # (blocks read onto the devices before it are the plan's too: held)
    holding = sum(x.local.nbytes for x in operands) if plan.device_budget is None else 0
    # the inputs are read ahead into scratch of the readers' own
    # (summa.host.filemaps): where the page cache did not hold the files,
    # 8 MiB past a streamed plan in the GPU suite's NumPy runs
    # (one read-ahead at a time: the largest input's bounds them all)
    reading = prefetch_scratch(max(job.headers["A"].nbytes, job.headers["B"].nbytes))

    def multiply():
        with Account.of(plan, be, "the multiply", holding, reading).drawing(comm) as account:
            if plan.device_budget is None:
                result = run_in_memory(plan, A, B, C, alpha=job.alpha, beta=job.beta,
                                       progress=run.progress.step)
            else:
                result = run_out_of_core(
                    plan, SweepOperands(A, B, C), be, alpha=job.alpha, beta=job.beta,
                    progress=run.progress.step, fresh_c=run.writer is not None,
                    broadcasters=broadcasters)
            be.synchronize()
        stats.__dict__.update(result.__dict__)
        stats.extra.update(account.report())
    _, run.record["compute_seconds"] = _timed(comm, "multiply", multiply)
    run.timeline.mark("multiply")
    return stats


def _scan_product(run: _FilesRun, operands, stats, inputs_finite, scan: float) -> None:
    """Warn where the product is not finite though the inputs are (it
    overflowed), scanning streamed inputs only then; record the scan's
    time (with `scan`, this rank's of the inputs). Collective."""
    comm, C = run.comm, operands[2]
    t0 = time.perf_counter()
    # NaN/Inf anywhere in the inputs make whole rows or columns of the
    # product NaN/Inf (0 · Inf is NaN): where it is finite, so were they,
    # and streamed inputs are scanned (a second read) only where it is not.
    product_finite = stats.extra.get("product_finite") if run.plan.device_budget is not None \
        else (C.backend.all_finite(C.local) if inputs_finite else None)
    if product_finite is not None:
        product_finite = comm.allreduce(bool(product_finite), op=MPI.LAND)
    if run.streaming and product_finite is False:
        inputs_finite = _warn_nonfinite(run.job.headers, _inputs(run, operands), run.rank0,
                                        run.warn)
    if inputs_finite and product_finite is False and run.rank0:
        run.warn(overflow_note(run.job.compute, "the inputs are"))
    run.record["scan_seconds"] = comm.allreduce(scan + time.perf_counter() - t0, op=MPI.MAX)
    run.timeline.mark("NaN/Inf scan")


def _record_stats(run: _FilesRun, stats: SummaStats) -> None:
    """The multiply's figures in the record."""
    record, (m, n, k) = run.record, run.job.shape
    # out of core: where the GPU waited (its first uploads, later panels,
    # the last write-back: streamed, the product's copy into the file)
    record.update({f"gpu_idle_{key}": stats.extra.get(f"{key}_seconds")
                   for key in ("head", "between", "tail")})
    record.update(panel_width=stats.panel_width, comm=stats.comm, panels=stats.panels,
                  schedule=stats.extra.get("schedule", "panels"),
                  transposed_a=bool(stats.extra.get("transposed_a", False)))
    record["tflops"] = gemm_flops(run.job.compute, m, n, k) / record["compute_seconds"] / 1e12
    record["check_residual"] = None


def _check_product(run: _FilesRun, operands, C0) -> None:
    """The check phase where asked: Freivalds' test, CheckFailed (and the
    output file abandoned) where it fails; collective."""
    job = run.job
    if not job.check:
        return
    run.progress.phase("check", 0)
    inject("check")
    residual, run.record["check_seconds"] = _timed(
        run.comm, "check", freivalds, *operands, alpha=job.alpha, beta=job.beta, C0=C0,
        precision=job.request.precision, compute=run.backend)
    run.record["check_residual"] = residual
    run.timeline.mark("check")
    if not residual <= 1:
        run.progress.close()
        if run.writer is not None:
            run.writer.abandon()
        raise CheckFailed(f"the product failed the check: scaled residual "
                          f"{residual:.3e} > 1; {job.out_path} was not written")


def _write_product(run: _FilesRun, C: DistMatrix) -> None:
    """The write phase: the product to a temporary file renamed into place
    once every rank succeeded; collective."""
    comm, (m, n, _) = run.comm, run.job.shape
    size = m * n * run.job.compute.itemsize
    run.progress.phase("write", block_share((m, n), run.grid) * size, size, "B",
                       run.predicted.get("write"))
    if run.writer is not None:  # the product is in the file: on disk, then renamed
        _, run.record["write_seconds"] = _timed(comm, "write", collectively, comm,
                                                run.writer.flush)
    else:
        _, run.record["write_seconds"] = _timed(comm, "write", C.to_npy, run.job.out)
    run.progress.add(block_share((m, n), run.grid) * size)
    run.timeline.mark("write")


def _warn_nonfinite(headers, matrices, rank0: bool, warn) -> bool:
    """Warn (rank 0) of NaN/Inf in the inputs A, B, C0 (None: not given);
    return whether they are all finite. Collective."""
    finite = True
    for name, M in zip(("A", "B", "C0"), matrices):
        if M is None or M.grid.comm.allreduce(M.backend.all_finite(M.local), op=MPI.LAND):
            continue  # counted only where there are some
        finite = False
        bad = _nonfinite(M)
        if rank0:
            warn(nonfinite_note(headers[name].path, bad))
    return finite


def _mapped(header, trans: str, compute, grid) -> DistMatrix | None:
    """The rank's block of op(X) of a file as a memory map
    (:func:`summa.host.npyio.map_block`) where it can be used as it lies
    (:func:`summa.api.fileplan.streamable`); None elsewhere (the same on every rank).
    Collective."""
    if not streamable(header, trans, compute):
        return None
    layout = Layout(header.shape if trans == "N" else header.shape[::-1], grid.shape)
    local = collectively(grid.comm, map_block, header,
                         layout.rows.global_indices(grid.row),
                         layout.cols.global_indices(grid.col), trans != "N")
    ok = grid.comm.allreduce(local is not None, op=MPI.LAND)
    return DistMatrix(grid, layout, local, NumpyBackend()) if ok else None


def _output_block(writer, shape, dtype, grid) -> DistMatrix:
    """The rank's block of the product, mapped from the output file."""
    layout = Layout(shape, grid.shape)
    local = collectively(grid.comm, writer.map_block, layout.rows.global_indices(grid.row),
                         layout.cols.global_indices(grid.col))
    return DistMatrix(grid, layout, local, NumpyBackend())


def _warm_up(run: _FilesRun, operands) -> tuple:
    """Create (and self-test) the broadcasters the multiply will use, settle an
    "auto" panel width, and run one small GEMM. Returns ``(plan,
    broadcasters)``: out of core the sweep's, the plan made final for them
    (:func:`summa.planning.sweepsetup.prepared_sweep`); in memory the plan,
    its width and direct copies settled (:func:`summa.planning.distributed.settled_plan`),
    and None."""
    A, B, C = operands
    backend, dtype, precision = run.backend, run.job.compute, run.job.request.precision
    made = (run.plan, None)
    if run.plan.device_budget is None:  # in memory
        # the planner settles "auto" (measured once per problem) and whether
        # auto's broadcasters copy directly; the set-up and the run take them
        plan, _ = settled_plan(run.plan, A, B, C, PanelsOfA)
        prepare(plan, A, B, C)
        made = (plan, None)
    else:
        made = prepared_sweep(run.plan, SweepOperands(A, B, C), backend)
    x = backend.asarray(np.ones((64, 64), dtype=dtype))
    backend.gemm(1, x, x, backend.asarray(np.zeros((64, 64), dtype=dtype)), precision=precision)
    backend.synchronize()
    return made
