"""The entry points' side of a job's progress line
(:class:`summa.runtime.progress.JobProgress`): whether it is shown and how,
each rank's share of a phase, what the plan predicts of each phase, and the
line of a library call on the ranks of the user's own launcher
(:func:`library_reporting`)."""

from __future__ import annotations

import contextlib

import numpy as np

from .. import options as settings
from ..device.traits import traits
from ..distribution.layout import Layout
from ..planning.model import gemm_flops
from ..planning.prediction import predict_plan
from ..runtime.progress import PHASES, Display, JobProgress, active, display_mode, reporting

__all__ = ["job_progress", "block_share", "phase_predictions", "multiply_phase",
           "pool_reporting", "library_reporting"]

#: Flops a second below any rank summa runs on (one slow core's float64):
#: a library call's product of fewer than this many times its threshold's
#: seconds ends before its line could show, the same verdict on every rank.
SLOWEST = 5e8


def job_progress(comm, quiet: bool = False, send=None, mode: str | None = None,
                 phases: tuple = PHASES, after: float = 0.0) -> JobProgress:
    """The JobProgress of a job on `comm` (collective) through `phases`:
    shown unless `quiet` or the ``progress`` setting is off, the same on
    every rank; rank 0 draws it on its stderr as `mode` (default: the
    setting's for that stream) says, each phase once it has run `after`
    seconds, or, given `send`, hands it to that (a pool's worker)."""
    options = settings.current()
    shown = not quiet and options.progress != "off"
    display = None
    if shown and comm.Get_rank() == 0 and send is None:
        display = Display(mode or display_mode(options.progress), options.progress_interval,
                          after=after)
    return JobProgress(comm, shown, display, send, phases)


def block_share(shape, grid) -> float:
    """The share of a ``(rows, cols)`` matrix in this rank's block of
    `grid` (a ProcessGrid) as 2-D blocks split it: the shares of all the
    ranks sum to one."""
    rows, cols = Layout(tuple(shape), grid.shape).local_shape(grid.row, grid.col)
    return rows * cols / max(1, shape[0] * shape[1])


def phase_predictions(plan, streamed: bool = False) -> dict:
    """Seconds the model predicts of each phase of `plan` (``read``,
    ``multiply``, ``write``), by the profile shipped with summa; none on
    CPUs (its rates are GPUs') or where the model has no figure. Streamed
    (files read and written as the multiply goes), the multiply takes the
    longest of its GEMMs and the disk's."""
    if not traits(plan.backend).gpu:
        return {}
    try:
        predicted = predict_plan(plan)
    except Exception:  # noqa: BLE001 -- a line without an ETA, never a failed job
        return {}
    if "seconds" not in predicted:
        return {}
    (m, n, k), disk = plan.shape, predicted["split"].get("disk") or 0.0
    inputs = m * k + k * n
    read = disk * inputs / max(1, inputs + m * n)
    if streamed:
        return {"multiply": max(predicted["seconds"], disk)}
    return {"read": read, "multiply": predicted["seconds"], "write": disk - read}


def multiply_phase(job: JobProgress, plan, grid, predicted: dict | None = None,
                   name: str = "multiply") -> None:
    """Start `job`'s multiply phase of `plan` on `grid` (`name`: its name in
    `job`'s phases): this rank's flops are its block of C's share of them."""
    flops = gemm_flops(np.dtype(plan.dtype), *plan.shape)
    job.phase(name, flops * block_share(tuple(plan.shape[:2]), grid), flops, "flop",
              (predicted or {}).get("multiply"))


@contextlib.contextmanager
def pool_reporting(world, mode: str | None, send):
    """Around a pool's command on every worker (collective): where the
    caller draws a line (`mode` not None), the array entry points report to
    a JobProgress whose rank 0 hands its state to `send` (the answer
    channel); closed with the command, only stopped where it fails."""
    if mode is None:
        yield None
        return
    with _reported(job_progress(world, send=send if world.Get_rank() == 0 else None)) as job:
        yield job



@contextlib.contextmanager
def library_reporting(comm, plan):
    """Around a library call's multiply of `plan` on every rank of `comm`
    (collective): where no caller set a line around it (a pool's worker),
    one of its own, drawn by rank 0 once a phase has run the
    ``progress_after`` setting's seconds, so that short products print
    nothing; ``progress`` off, none; none either for one GEMM where the
    operands lie (queued on their stream, it has no phases to show), nor
    for a product too small to outlast the threshold at :data:`SLOWEST`
    (its window and thread would cost a millisecond a call for nothing).
    Closed with the call, only stopped where it fails (its ranks may not
    all reach the close)."""
    after = settings.current().progress_after
    if active() is not None or plan.placement.resident or \
            gemm_flops(np.dtype(plan.dtype), *plan.shape) < SLOWEST * after:
        yield active()
        return
    with _reported(job_progress(comm, after=after)) as job:
        yield job


@contextlib.contextmanager
def _reported(job):
    """`job` the active line within (:func:`summa.runtime.progress.reporting`);
    closed after, only stopped where the block fails (its ranks may not all
    reach the close, which is collective)."""
    try:
        with reporting(job):
            yield job
    except BaseException:
        job.stop()
        raise
    job.close()
