"""The user's workflow: multiply .npy files, or NumPy arrays held on one rank.

:func:`multiply_files` checks everything it can before reading a byte (headers,
shapes, dtypes, the output path, the grid), reads each rank's blocks straight
from the files, multiplies, verifies, and only then writes the product
atomically. :func:`matmul_arrays` is the same for arrays in memory.

Dtype rule: A and B must have the same dtype, or ``dtype`` must be given, in
which case both (and C0) are converted to it; there is no silent promotion,
and integer files need ``dtype``.
"""

from __future__ import annotations

import contextlib
import inspect
import sys
import time
import warnings
from dataclasses import dataclass, replace

import numpy as np
from mpi4py import MPI

from ..runtime.agree import collectively
from ..execution.algorithm import SummaStats, gemm, prepare, summa
from ..device.backend import NumpyBackend, get_backend, resolve_dtype
from ..distribution.grid import ProcessGrid, node_rank
from ..host.filemaps import read_ahead
from ..host.blocks import (host_block, node_shares, operand_block, own_range, result_block,
                           root_block, root_result_block, stored_operand)
from ..host import shared as host_arrays
from .. import options as settings
from .. import pool
from .arrays import check_arrays, op_shape
from .checks import check_operands, check_scalars
from ..host.shared import parallel_copy
from ..runtime.faults import inject
from ..host.npyio import AtomicNpyWriter, NpyError, check_output_path, map_block, read_header
from ..distribution.layout import Layout
from .operands import describe, kept_device
from ..distribution.matrix import DistMatrix
from ..runtime.progress import Progress
from ..device.traits import traits
from ..execution.outofcore import SweepOperands, run_out_of_core
from ..precision.ozaki_gpu import asked_moduli, check_moduli
from ..planning.planner import Machine, make_plan
from ..planning.selection import grid_broadcasters, peer_access
from ..host.storage import conjugated, op_view, storage_of
from .verify import freivalds
from ..runtime.watchdog import watch

__all__ = ["multiply_files", "FilesJob", "matmul", "matmul_arrays", "host_matmul", "check_is_cheap",
           "CheckFailed", "PlanRequest", "plan_arrays", "run_arrays", "run_planned",
           "run_on_device", "ArrayOperands", "pooled_size"]

#: Assumed rates for deciding whether a check is cheap (bytes/s of memory
#: traffic for the matrix-vector products, flop/s for the multiply).
_RATES = {"cupy": (3e12, 5e13), "numpy": (1e10, 5e10)}


class CheckFailed(RuntimeError):
    """The product failed Freivalds' test (exit status 3); nothing was written."""


def check_is_cheap(m: int, n: int, k: int, itemsize: int, backend_name: str) -> bool:
    """True when Freivalds' test should cost under 2 % of the multiply.

    The test reads A, B and C about eight times in float64 (two vectors, each
    with a value and a gauge pass): ``64 (MK + KN + MN)`` bytes at memory speed,
    against ``2 MNK`` flops at GEMM speed.
    """
    bandwidth, rate = _RATES.get(backend_name, _RATES["numpy"])
    check = 64 * (m * k + k * n + m * n) / bandwidth
    multiply = 2 * m * n * k / rate
    return check < 0.02 * multiply


def _compute_dtype(headers: dict, dtype) -> np.dtype:
    if dtype is not None:
        return resolve_dtype(dtype)
    for header in headers.values():  # A, B, C0: the message names the file
        if header is not None and header.dtype.kind in "iu":
            raise NpyError(f"{header.path}: integer dtype {header.dtype.name}; pass --dtype "
                           "(e.g. float64) to convert it")
    a, b = headers["A"], headers["B"]
    if a.dtype != b.dtype:
        raise NpyError(f"{a.path} is {a.dtype.name} but {b.path} is {b.dtype.name}; pass "
                       f"--dtype to compute in one type (both are converted to it)")
    return resolve_dtype(a.dtype)


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
class FilesJob:
    """One multiply of .npy files: what the call asked for, and once checked
    (:func:`_check_files`, before a byte of data is read) the files' headers,
    the product's shape, the compute dtype and the output path to write.

    The fields up to `schedule` are :func:`multiply_files`' arguments
    (`trans`: ``(trans_a, trans_b)``; `check` and `out_of_core` stay None
    where the call left them to summa until the plan settles them).

    Attributes
    ----------
    headers : dict
        ``"A"``, ``"B"``, ``"C0"`` (None where there is none): the files'
        :class:`summa.host.npyio.NpyHeader`.
    shape : tuple
        ``(m, n, k)`` of the product.
    compute : numpy.dtype
        The dtype the product is computed and written in.
    out : str
        The output path, checked (:func:`summa.host.npyio.check_output_path`).
    """

    a_path: str
    b_path: str
    c_path: str | None
    out_path: str
    alpha: object = 1.0
    beta: object = 0.0
    trans: tuple = ("N", "N")
    dtype: object = None
    grid: object = None
    block: tuple | None = None
    panel_width: object = None
    lookahead: int = 1
    backend: str = "auto"
    broadcaster: str = "auto"
    precision: str | None = None
    check: bool | None = None
    out_of_core: bool | None = None
    device_memory: object = None
    schedule: str = "panels"
    headers: dict | None = None
    shape: tuple | None = None
    compute: np.dtype | None = None
    out: str | None = None


class _Timeline:
    """Where the time of one call went, in order: (step, seconds since the
    call) on this rank, so that no second of the wall time is in none of the
    phases."""

    def __init__(self):
        self.started = time.perf_counter()
        self.steps = []

    def mark(self, step: str) -> None:
        self.steps.append((step, round(time.perf_counter() - self.started, 4)))


@dataclass(frozen=True)
class _FilesRun:
    """What the phases of a planned multiply of files share."""

    job: FilesJob
    plan: object
    backend: object
    comm: MPI.Comm
    grid: ProcessGrid
    progress: Progress
    warn: object
    record: dict
    timeline: _Timeline
    home: object = None
    writer: AtomicNpyWriter | None = None

    @property
    def rank0(self) -> bool:
        return self.comm.Get_rank() == 0

    @property
    def streaming(self) -> bool:
        """Out of core, blocks of C-ordered files are memory-mapped and read
        as the multiply goes (no read phase before it), and the product is
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
    timeline = _Timeline()
    job = _check_files(FilesJob(
        a_path, b_path, c_path, out_path, alpha=alpha, beta=beta, trans=(trans_a, trans_b),
        dtype=dtype, grid=grid, block=block, panel_width=panel_width, lookahead=lookahead,
        backend=backend, broadcaster=broadcaster, precision=precision, check=check,
        out_of_core=out_of_core, device_memory=device_memory, schedule=schedule), comm)
    # The disk starts on the inputs while CUDA starts and the multiply plans.
    local, on_node = node_rank(comm)
    ahead = _read_ahead_inputs(job.headers, comm, local, on_node)
    try:
        job, be, plan, record = _plan_files(job, comm, local, timeline)
        with ProcessGrid(comm, plan.grid) as pgrid, contextlib.ExitStack() as stack:
            run = _start_files(_FilesRun(job, plan, be, comm, pgrid, Progress(
                comm.Get_rank() == 0 and not quiet), warn or _warn_stderr, record, timeline),
                stack, ahead)
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


def _check_files(job: FilesJob, comm) -> FilesJob:
    """Everything about the files that can be checked before a byte of data
    is read, the same on every rank: the ops, C0 where beta needs it, the
    headers' shapes and dtypes, the output path. Returns `job` with its ops
    upper-case, its headers, ``(m, n, k)``, compute dtype and output path;
    collective."""
    a_path, b_path, c_path = job.a_path, job.b_path, job.c_path
    trans_a, trans_b = str(job.trans[0]).upper(), str(job.trans[1]).upper()
    for name, t in (("trans_a", trans_a), ("trans_b", trans_b)):
        if t not in ("N", "T", "H"):
            raise ValueError(f"{name} must be N, T or H, got {t!r}")
    if job.beta != 0 and c_path is None:
        raise ValueError("beta is not 0, so C0 is needed: pass --c C0.npy")
    headers = {"A": read_header(a_path, comm), "B": read_header(b_path, comm),
               "C0": read_header(c_path, comm) if c_path is not None else None}
    (m, k), (k2, n) = op_shape(headers["A"].shape, trans_a), op_shape(headers["B"].shape,
                                                                          trans_b)
    if k != k2:
        raise NpyError(f"inner dimensions differ: op({a_path}) is {m}x{k} but op({b_path}) "
                       f"is {k2}x{n}")
    if headers["C0"] is not None and headers["C0"].shape != (m, n):
        raise NpyError(f"{c_path}: is {headers['C0'].shape[0]}x{headers['C0'].shape[1]}, "
                       f"but the product is {m}x{n}")
    compute = _compute_dtype(headers, job.dtype)
    out = check_output_path(job.out_path, [a_path, b_path, c_path], comm)
    return replace(job, trans=(trans_a, trans_b), headers=headers, shape=(m, n, k),
                   compute=compute, out=out)


def _plan_files(job: FilesJob, comm, local: int, timeline: _Timeline) -> tuple:
    """The backend (of node rank `local`), the check and the mode where the
    call left them to summa, and the Plan of a checked `job`; collective.
    Returns ``(job with those settled, backend, plan, the record so far)``."""
    (m, n, k), (trans_a, trans_b) = job.shape, job.trans
    be = collectively(comm, get_backend, job.backend, local)
    compute = be.check_dtype(job.compute)
    check = job.check
    if check is None:
        check = check_is_cheap(m, n, k, compute.itemsize, be.name)
    record = {"a": str(job.a_path), "b": str(job.b_path), "output": job.out, "m": m, "n": n,
              "k": k, "dtype": compute.name, "trans_a": trans_a, "trans_b": trans_b,
              "alpha": job.alpha, "beta": job.beta, "backend": be.name,
              "timeline": timeline.steps}
    timeline.mark("headers, devices")
    out_of_core = job.out_of_core
    if out_of_core is None and streams_by_default(be.name, job.headers, trans_a, trans_b,
                                                  compute, job.block, job.schedule):
        out_of_core = True  # streamed: reading, multiplying and writing overlap
    # bad input: one message, before any warning
    plan = make_plan((m, n, k), compute, Machine.live(comm, be), grid=job.grid, trans_a=trans_a,
                     trans_b=trans_b, out_of_core=out_of_core, device_memory=job.device_memory,
                     panel_width=job.panel_width, lookahead=job.lookahead,
                     schedule=job.schedule, precision=job.precision,
                     broadcaster=job.broadcaster)
    record["plan"] = plan.as_dict()
    return replace(job, compute=compute, check=check, out_of_core=out_of_core), be, plan, record


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
    steps = 3 if job.c_path else 2
    progress.phase("read", steps)
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
        progress.step(1, steps)
        B = read_operand("B", job.b_path, job.trans[1])
        progress.step(2, steps)
        t0 = time.perf_counter()
        if job.c_path:
            C = DistMatrix.from_npy(job.c_path, pgrid, home, job.block, "N", job.compute)
        elif run.writer is not None:
            C = _output_block(run.writer, job.shape[:2], job.compute, pgrid)
        else:
            C = DistMatrix.zeros(job.shape[:2], job.compute, pgrid, home, job.block)
        home.synchronize()
        parts["C"] = time.perf_counter() - t0
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
    job, plan, be, comm = run.job, run.plan, run.backend, run.comm
    A, B, C = operands
    # One-time costs (communicators, their self-test, the BLAS library's
    # start) are timed on their own, so "multiply" is the multiply.
    _, run.record["setup_seconds"] = _timed(comm, "setup", _warm_up, run, operands)
    run.timeline.mark("setup")
    stats = SummaStats()
    run.progress.phase("multiply", 1)
    inject("multiply")

    def multiply():
        if plan.device_budget is None:
            gemm(A, B, C, alpha=job.alpha, beta=job.beta, panel_width=plan.panel_width,
                 lookahead=job.lookahead, broadcaster=job.broadcaster,
                 precision=job.precision, stats=stats, progress=run.progress.step,
                 schedule=job.schedule)
        else:
            stats.__dict__.update(run_out_of_core(
                plan, SweepOperands(A, B, C), be, alpha=job.alpha, beta=job.beta,
                progress=run.progress.step, fresh_c=run.writer is not None).__dict__)
        be.synchronize()
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
        run.warn(_overflow_note(run.job.compute, "the inputs are"))
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
    record["tflops"] = ((8 if run.job.compute.kind == "c" else 2) * m * n * k
                        / record["compute_seconds"] / 1e12)
    record["check_residual"] = None


def _check_product(run: _FilesRun, operands, C0) -> None:
    """The check phase where asked: Freivalds' test, CheckFailed (and the
    output file abandoned) where it fails; collective."""
    job = run.job
    if not job.check:
        return
    run.progress.phase("check", 1)
    inject("check")
    residual, run.record["check_seconds"] = _timed(
        run.comm, "check", freivalds, *operands, alpha=job.alpha, beta=job.beta, C0=C0,
        precision=job.precision, compute=run.backend)
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
    comm = run.comm
    run.progress.phase("write", 1)
    if run.writer is not None:  # the product is in the file: on disk, then renamed
        _, run.record["write_seconds"] = _timed(comm, "write", collectively, comm,
                                                run.writer.flush)
    else:
        _, run.record["write_seconds"] = _timed(comm, "write", C.to_npy, run.job.out)
    run.timeline.mark("write")


def _read_ahead_inputs(headers, comm, local: int, size: int) -> list:
    """Start reading A's and B's bytes into the page cache (one after the
    other, each of the node's `size` ranks, this one `local`, its share of
    them) where every rank is on one node, so that the disk works from the
    start (what is read twice is read from memory); the events that stop it."""
    if size != comm.Get_size():
        return []  # several nodes: each reads only its blocks, when it maps them
    stops = []
    for header in (headers["A"], headers["B"]):
        nbytes = int(np.prod(header.shape)) * header.dtype.itemsize
        first = header.offset + nbytes * local // size
        last = header.offset + nbytes * (local + 1) // size
        stop = read_ahead(header.path, first, last)
        if stop is not None:
            stops.append(stop)
    return stops


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
            warn(_nonfinite_note(headers[name].path, bad))
    return finite


def streams_by_default(backend_name: str, headers: dict, trans_a: str, trans_b: str, compute,
                       block=None, schedule: str = "panels") -> bool:
    """Does a multiply of these files stream them through the GPUs unless told
    otherwise? On GPUs, where both can be read as the multiply goes and there
    is no C0: measured on one H200 (N = 24576), streamed 9.4 s against 12.5 s
    in memory with the files in the page cache, 16.2 against 20.3 s from the
    disk."""
    return (traits(backend_name).gpu and block is None and headers.get("C0") is None
            and schedule == "panels" and _streamable(headers["A"], trans_a, compute)
            and _streamable(headers["B"], trans_b, compute))


def _streamable(header, trans: str, compute) -> bool:
    """Can the out-of-core multiply read this file as it goes (:func:`_mapped`)?"""
    return trans == "N" and not header.fortran_order and header.dtype == compute


def _mapped(header, trans: str, compute, grid) -> DistMatrix | None:
    """The rank's block of a file as a memory map (:func:`summa.host.npyio.map_block`)
    where it can be used as it lies: untransposed, C-ordered, in the compute
    dtype; None elsewhere (the same on every rank). Collective."""
    if not _streamable(header, trans, compute):
        return None
    layout = Layout(header.shape, grid.shape)
    local = collectively(grid.comm, map_block, header,
                         layout.rows.global_indices(grid.row),
                         layout.cols.global_indices(grid.col))
    ok = grid.comm.allreduce(local is not None, op=MPI.LAND)
    return DistMatrix(grid, layout, local, NumpyBackend()) if ok else None


def _output_block(writer, shape, dtype, grid) -> DistMatrix:
    """The rank's block of the product, mapped from the output file."""
    layout = Layout(shape, grid.shape)
    local = collectively(grid.comm, writer.map_block, layout.rows.global_indices(grid.row),
                         layout.cols.global_indices(grid.col))
    return DistMatrix(grid, layout, local, NumpyBackend())


def _warm_up(run: _FilesRun, operands) -> None:
    """Create (and self-test) the broadcasters the multiply will use, settle an
    "auto" panel width, and run one small GEMM."""
    A, B, C = operands
    backend, dtype, precision = run.backend, run.job.compute, run.job.precision
    if run.plan.device_budget is None:  # in memory
        prepare(A, B, C, run.plan.panel_width, run.job.broadcaster, precision)
    else:
        # as the out-of-core sweep makes them
        grid_broadcasters(C.grid, run.job.broadcaster, backend)
    x = backend.asarray(np.ones((64, 64), dtype=dtype))
    backend.gemm(1, x, x, backend.asarray(np.zeros((64, 64), dtype=dtype)), precision=precision)
    backend.synchronize()


#: Options matmul on arrays passes on to the multiply (the rest are its own).
_MATMUL_OPTIONS = ("alpha", "trans_a", "trans_b", "panel_width", "lookahead", "broadcaster",
                   "precision", "moduli", "schedule", "stats")


@settings.entry_point
def matmul_arrays(a, b, comm: MPI.Comm | None = None, root: int = 0, grid=None,
                  backend="auto", out=None, out_of_core=None, device_memory=None,
                  gpus=None, workers=None, topology=None, **kwargs):
    """``alpha * op(a) @ op(b)`` for arrays held on rank `root` (None
    elsewhere), returned as the caller's kind of array; collective.

    Host arrays stay where they lie, whatever their order or strides (the
    plan's ``storage``, :mod:`summa.host.storage`), and on GPUs stream through
    them in tiles (:mod:`summa.execution.outofcore`); on several ranks the root
    scatters the blocks (or the ranks read them in place) and gathers the
    product. GPU arrays on one rank are one GEMM there, queued on the current
    stream as ``cupy.matmul`` is, where the product fits; elsewhere they go
    through host memory (the plan's note says why) and the product back to
    their GPU. The whole rule: docs/user-guide.md, "Arrays you can pass".

    Parameters
    ----------
    a, b : array
        On `root`, of one dtype (float64, float32, complex128, complex64;
        float16 on GPUs); never modified. NumPy arrays; host arrays of other
        libraries NumPy views in place (``__array__``, the buffer protocol,
        DLPack on the CPU: torch CPU tensors, memoryviews) and lists; arrays
        on one CUDA GPU: CuPy's, and DLPack or CUDA-array-interface
        producers (torch CUDA tensors, JAX arrays), viewed through CuPy.
    grid : str or tuple, optional
        Default: the one ``bench`` takes for the product's shape
        (:func:`summa.distribution.grid.grid_for`).
    out : array, optional
        On `root`: where the product goes, of its shape and dtype with
        contiguous rows, overlapping neither operand, where the product
        comes back (the operands' GPU; host memory where both lie there),
        written in place and returned as passed. Where the call raises, its
        values are undefined.
    out_of_core : bool, optional
        None (default): host-resident on GPUs as above; False: copy the
        operands into GPU memory first (the in-memory SUMMA); True:
        host-resident on CPUs too (tests), GPU operands through host memory.
    device_memory : str, optional
        Cap on each rank's GPU memory, e.g. "16GiB" (default: 90 % of what
        is free); GPU operands count against it.
    gpus, workers : int, optional
        In a plain Python process (no launcher, no `comm`): the pool of
        worker ranks (:mod:`summa.pool`): `gpus` (``SUMMA_GPUS``; default
        every visible GPU for host arrays, the operands' own for GPU arrays),
        or without GPUs `workers` (``SUMMA_WORKERS``; default one per 8
        cores). One means this process alone.
    topology : summa.distribution.topology.Topology, optional
        The nodes of `comm`'s ranks (default: as MPI sees them).
    **kwargs
        ``alpha``, ``trans_a``, ``trans_b``, ``panel_width``, ``lookahead``,
        ``broadcaster`` (``"host"``: with node-shared operands every GPU
        uploads its own panel parts), ``precision``, ``moduli`` (with
        ``precision="fp64-int8"``: INT8 products per float64 product, 3-30),
        ``schedule``, ``stats`` (a SummaStats filled with this rank's timings
        and ``extra["plan"]``; see :func:`summa.gemm`).
    options : summa.options.Options, optional
        The settings (default: the current ones, from ``SUMMA_*`` variables
        read once here; docs/options.md); a pool's workers get them too.

    Returns
    -------
    array or None
        The product on `root` (None elsewhere): `out` where given; else the
        kind of `a` (of the GPU operand where only one is) where its library
        wraps it without a copy: torch's tensors, JAX's arrays; else CuPy
        for GPU arrays, NumPy for host arrays. A product made in host memory
        that does not fit in the GPU's free memory stays in host memory
        (NumPy, or a torch CPU tensor), with a RuntimeWarning.

    Raises
    ------
    ValueError
        The same on every rank, before any data moves: arrays that cannot be
        multiplied (not arrays, not 2-D, dtypes differing or unsupported,
        inner dimensions differing), operands on two GPUs or not on a CUDA
        GPU, GPU arrays without CuPy, an unusable `out`, a device budget too
        small for any tile, a host too small for the plan.
    """
    called = time.perf_counter()
    unknown = sorted(set(kwargs) - set(_MATMUL_OPTIONS))
    if unknown:
        raise TypeError(f"matmul got unexpected keyword argument(s) {', '.join(unknown)}")
    moduli = check_moduli(kwargs.pop("moduli", None), kwargs.get("precision"))
    operands = ArrayOperands(a, b, out, root)
    here = dict(kwargs, grid=grid, backend=backend, out_of_core=out_of_core,
                device_memory=device_memory)
    # The backend binds its GPU; the caller's current one is current again after.
    with asked_moduli(moduli), kept_device():  # the pool's workers get moduli with the rest
        size, operands = pooled_size(operands, comm, gpus, workers, backend)
        if size > 1:
            host_a, host_b, host_out = operands.given.host_arrays()
            return operands.given.give_back(pool.matmul(host_a, host_b, size, out=host_out,
                                                        **here))
        return _matmul_here(operands, MPI.COMM_WORLD if comm is None else comm, called,
                            dict(here, topology=topology))


def pooled_size(operands: "ArrayOperands", comm, gpus=None, workers=None,
                backend="auto") -> tuple:
    """``(ranks, operands)``: the pool of worker ranks (:mod:`summa.pool`) a
    product of `operands` runs on, and `operands` described where that was
    asked. Only a plain Python process (`comm` None, a world of one rank, no
    launcher) has a pool: there `operands` are described (their
    ValueError raised) and the ranks are :func:`_pool_size`'s; elsewhere 1
    (the ranks of `comm`), and `operands` as they came. `gpus`, `workers`
    and `backend` as for :func:`matmul_arrays`."""
    if comm is not None or MPI.COMM_WORLD.Get_size() != 1 or pool.launched():
        return 1, operands
    operands = operands.described()
    return _pool_size(operands.given.placement, gpus, workers, backend), operands


def _pool_size(placement, gpus, workers, backend: str) -> int:
    """Ranks a plain process's multiply runs on (:func:`summa.pool.pool_size`):
    operands on a GPU stay on theirs (one rank) unless more GPUs are asked
    for (`gpus`, ``SUMMA_GPUS``): on one GPU the product is one GEMM there,
    where a pool would take them through host memory."""
    cpu_only = traits(backend).cpu_only
    if placement.where != "host" and not cpu_only and gpus in (None, "") and \
            settings.current().gpus in (None, ""):
        return 1
    return pool.pool_size(gpus if not cpu_only else None, workers, use_gpus=not cpu_only)


@dataclass(frozen=True)
class ArrayOperands:
    """The operands of one product as the caller passed them, held on rank
    `root` (None elsewhere), and where given the array the product goes
    into (:func:`matmul_arrays`).

    Attributes
    ----------
    a, b : array or None
    out : array or None
    root : int
    given : summa.api.operands.Operands or None
        On the root once described (:meth:`described`): NumPy or CuPy
        arrays over the caller's, where they lie.
    """

    a: object
    b: object
    out: object = None
    root: int = 0
    given: object = None

    def described(self) -> "ArrayOperands":
        """These operands with :attr:`given` (:func:`summa.api.operands.describe`,
        raising its ValueError); call it on the root."""
        return self if self.given is not None else replace(
            self, given=describe(self.a, self.b, self.out))


def _matmul_here(operands: ArrayOperands, comm, called: float, kwargs: dict):
    """:func:`matmul_arrays` on the ranks of `comm` (no pool), `kwargs` its
    other arguments: check and plan, run, give the product back."""
    alpha, stats = kwargs.pop("alpha", 1.0), kwargs.pop("stats", None)
    backend, topology = kwargs.pop("backend", "auto"), kwargs.pop("topology", None)
    be, plan, operands = plan_arrays(operands, comm, PlanRequest(**kwargs), backend, topology)
    if plan.placement.resident:  # one GEMM where the operands lie: no grid to make
        return run_planned(plan, None, be, operands, alpha, stats, called)
    with ProcessGrid(comm, plan.grid, topology=topology) as pgrid:
        if pgrid.core_note and pgrid.rank == 0:
            warnings.warn(pgrid.core_note, RuntimeWarning, stacklevel=2)
        return run_planned(plan, pgrid, be, operands, alpha, stats, called)


@dataclass(frozen=True)
class PlanRequest:
    """What a call asked of the plan of an array product: the arguments of
    the same names of :func:`matmul_arrays` (and :class:`summa.Matmul`) that
    :func:`summa.planning.make_plan` takes, with their defaults."""

    grid: object = None
    out_of_core: bool | None = None
    device_memory: object = None
    trans_a: str = "N"
    trans_b: str = "N"
    panel_width: object = None
    lookahead: int = 1
    schedule: str = "panels"
    precision: object = None
    broadcaster: str = "auto"


def plan_arrays(operands: ArrayOperands, comm, request: PlanRequest = PlanRequest(),
                backend="auto", topology=None):
    """Describe and check the root's `operands` (:class:`ArrayOperands`) and
    plan their product (:func:`summa.planning.make_plan`, host-held, or
    where they lie on a GPU, :class:`summa.planning.planner.Placement`);
    collective. On one rank the backend binds the GPU the operands lie on.
    `request` (:class:`PlanRequest`), `backend` and `topology` as for
    :func:`matmul_arrays`.

    Returns
    -------
    (Backend, Plan, ArrayOperands)
        The rank's backend, the Plan (the same on every rank), and
        `operands` described on the root (:meth:`ArrayOperands.described`).
    """
    trans_a, trans_b = str(request.trans_a).upper(), str(request.trans_b).upper()
    meta, rank = None, comm.Get_rank()
    if rank == operands.root:
        try:
            operands = operands.described()
        except ValueError as exc:  # said on every rank below
            meta = str(exc)
    placed = operands.given.placement if operands.given is not None else None
    local = placed.device if comm.Get_size() == 1 and placed is not None and \
        placed.device is not None else node_rank(comm, topology)[0]
    be = collectively(comm, get_backend, backend, local)
    if rank == operands.root and meta is None:
        meta = check_arrays(*operands.given.arrays, trans_a, trans_b, be)
        meta = meta if isinstance(meta, str) else (*meta, placed)
    meta = comm.bcast(meta, root=operands.root)
    if isinstance(meta, str):
        raise ValueError(meta)
    m, n, k, dtype, placement = meta
    # (the nodes the grid will see: the copy threads share them)
    plan = make_plan((m, n, k), dtype, Machine.live(comm, be, topology), grid=request.grid,
                     trans_a=trans_a, trans_b=trans_b, host_held=True,
                     out_of_core=request.out_of_core, device_memory=request.device_memory,
                     panel_width=request.panel_width, lookahead=request.lookahead,
                     schedule=request.schedule, precision=request.precision,
                     broadcaster=request.broadcaster, placement=placement)
    if plan.placement.where == "host":  # (GPU arrays: stored as they come to host memory)
        given = operands.given  # the arrays described, on the root
        plan = _stored(plan, operands if given is None else
                       ArrayOperands(*given.host_arrays(be), operands.root), comm)
    return be, plan, operands


def run_planned(plan, pgrid, be, operands: ArrayOperands, alpha=1.0, stats=None,
                called: float | None = None):
    """Run `plan` on `operands` described on the root (:func:`plan_arrays`):
    one GEMM where they lie (:func:`run_on_device`, resident plans: no grid,
    `pgrid` None), or :func:`run_arrays` over the grid `pgrid` on host
    arrays (operands on a GPU copied to host memory first); collective.
    Kernels compiled on first use (fp64-int8's) are made ready first,
    their seconds in `stats`' ``extra["compile_seconds"]``.
    Returns the product on the root as the caller's kind of array
    (:meth:`summa.api.operands.Operands.give_back`), None elsewhere."""
    given = operands.given  # None off the root
    compiled = be.prepare(plan.precision, plan.dtype)  # its own figure, not the product's
    if plan.placement.resident:
        c = run_on_device(plan, be, given, alpha, stats)
    else:
        host = operands  # off the root: as passed (the pool's workers hold the arrays on every rank)
        if given is not None:
            host = ArrayOperands(*given.host_arrays(be), operands.root)
        c = run_arrays(plan, pgrid, be, host, alpha, stats, called)
    if stats is not None:
        stats.extra["compile_seconds"] = compiled
    return c if given is None else given.give_back(c, be)


def run_on_device(plan, be, given, alpha=1.0, stats=None):
    """The executor of a resident plan (``plan.placement.resident``):
    ``alpha op(a) @ op(b)`` as one GEMM (:meth:`summa.device.backend.Backend.gemm`:
    a transposed operand is read as cuBLAS's transposed op, op H of one stored
    by rows as its op C, no copy) on the GPU where `given` (:class:`summa.api.operands.Operands`) lie,
    a host operand of a mixed pair uploaded first, into `out` there or a new
    CuPy array. Queued on the current stream and not waited for, as
    ``cupy.matmul``, but where `stats` (a SummaStats) are asked for. Returns
    the product (CuPy)."""
    (m, n, k), dtype = plan.shape, np.dtype(plan.dtype)
    check_scalars(alpha, 0.0, dtype, plan.precision, be)
    began = time.perf_counter()
    with be.xp.cuda.Device(plan.placement.device):  # its cuBLAS handle, its memory
        a, b = (op_view(x.array if x.device is not None else be.asarray(x.array), t)
                for x, t in zip((given.a, given.b), plan.trans))
        c = given.out.array if given.out is not None else be.xp.empty((m, n), dtype)
        if k == 0:
            c.fill(0)
        else:
            be.gemm(alpha, a, b, c, beta=0.0, precision=plan.precision,
                    conj=tuple(conjugated(t, dtype) for t in plan.trans))
        if stats is not None:
            be.synchronize()
            seconds = time.perf_counter() - began
            stats.__dict__.update(seconds=seconds, compute=seconds, panels=1, panel_width=k,
                                  comm="none")
            stats.extra.update(plan=plan.as_dict(), resident=True)
    return c


def _stored(plan, operands: ArrayOperands, comm):
    """`plan` with the storage of `operands` (:func:`summa.host.storage.storage_of`,
    found on the root), their op H conjugated by the GEMMs: a plan made for
    arrays that lay otherwise runs these as they lie. Collective."""
    storage = None
    if comm.Get_rank() == operands.root:
        storage = tuple(storage_of(np.asarray(x), t)
                        for x, t in zip((operands.a, operands.b), plan.trans))
    storage = comm.bcast(storage, root=operands.root)
    conj = tuple(conjugated(t, plan.dtype) for t in plan.trans)
    if (tuple(plan.storage), tuple(plan.conj)) == (storage, conj):
        return plan
    return replace(plan, storage=storage, conj=conj)


def run_arrays(plan, pgrid, be, operands: ArrayOperands, alpha=1.0, stats=None,
               called: float | None = None):
    """Run `plan` (:func:`plan_arrays`) on NumPy `operands` over the grid
    `pgrid` it names: in memory (scattered onto the devices, gathered back),
    or host-resident (:func:`_host_blocks`, the out-of-core sweep);
    collective. `stats` (a SummaStats) receives this rank's timings and
    ``extra["plan"]``; `called`: when the call began (``perf_counter``),
    for its set-up time. Returns the product on the root (`out` where
    given), None elsewhere."""
    # (array-likes as NumPy sees them; arrays, node-shared ones too, as they are)
    operands = replace(operands, **{name: np.asarray(x) for name, x in (
        ("a", operands.a), ("b", operands.b)) if x is not None and not isinstance(x, np.ndarray)})
    a, b, out, root = operands.a, operands.b, operands.out, operands.root
    plan = _stored(plan, operands, pgrid.comm)
    if not plan.out_of_core:
        return _in_memory(plan, pgrid, be, operands, alpha, stats)
    A, B, C, own, c_node = _host_blocks(a, b, out, plan, pgrid, root, be)
    set_up = time.perf_counter() - (called or time.perf_counter())  # checks, plan, blocks
    # beta 0: out's old values do not matter either
    result = run_out_of_core(plan, SweepOperands(A, B, C, own), be, alpha=alpha, fresh_c=True)
    result.extra["setup_seconds"] = set_up
    # every rank's tiles (the sweep checked each as it came back): matmul warns by it
    result.extra["product_finite"] = pgrid.comm.allreduce(
        result.extra.get("product_finite") is not False, op=MPI.LAND)
    if stats is not None:
        stats.__dict__.update(result.__dict__)
    if pgrid.size == 1:
        return C.local
    if c_node is None:
        return C.gather(root=root, out=out)
    with watch("the other ranks to finish writing their blocks of the product"):
        pgrid.comm.Barrier()
    if pgrid.comm.Get_rank() != root:
        return None
    if out is not None and out is not c_node:
        parallel_copy(out, c_node)
        return out
    return c_node


def _in_memory(plan, pgrid, be, operands: ArrayOperands, alpha, stats):
    """The in-memory multiply of :func:`run_arrays`: each operand as the
    plan's storage says (:func:`summa.host.blocks.stored_operand`: on one rank
    where it lies, read transposed and conjugated by the GEMMs; on a grid
    scattered and settled on the devices), the product on one CPU rank
    written straight into `out` (or a new array: NumPy's GEMMs read A and B
    as they lie, so that is the only memory the call takes), elsewhere
    gathered. Collective."""
    (m, n, _), dtype, root = plan.shape, np.dtype(plan.dtype), operands.root
    one = pgrid.size == 1
    (A, conj_a), (B, conj_b) = (stored_operand(x, t, s, pgrid, be, root) for x, t, s in
                                zip((operands.a, operands.b), plan.trans, plan.storage))
    layout = Layout((m, n), pgrid.shape)
    if one and not be.is_gpu:
        c = np.empty((m, n), dtype) if operands.out is None else operands.out
    else:
        c = be.xp.empty(layout.local_shape(pgrid.row, pgrid.col), dtype)
    C = DistMatrix(pgrid, layout, c, be)
    result = summa(alpha, A, B, 0.0, C, panel_width=plan.panel_width, lookahead=plan.lookahead,
                   broadcaster=plan.broadcaster, precision=plan.precision,
                   schedule=plan.schedule, conj=(conj_a, conj_b))
    if stats is not None:  # a pass over C where it lies: matmul warns of NaN/Inf by it
        finite = pgrid.comm.allreduce(be.all_finite(c), op=MPI.LAND)
        stats.__dict__.update(result.__dict__)
        stats.extra.update(plan=plan.as_dict(), product_finite=finite)
    if one and not be.is_gpu:
        return c
    return C.gather(root=root, out=operands.out)


def _host_blocks(a, b, out, plan, pgrid, root: int, be):
    """``(A, B, C, own copies or None, C's node-shared whole or None)``: this
    rank's host blocks of a host-resident multiply. One rank: views of the
    caller's arrays, the result written in place. Several: read where the
    root holds them, node-shared, or scattered (:mod:`summa.host.blocks`);
    every GPU uploads its own panel parts (own copies) under
    ``broadcaster="host"``, or ``"auto"`` where the GPUs cannot read each
    other's memory. Collective."""
    (m, n, k), dtype = plan.shape, np.dtype(plan.dtype)
    (trans_a, trans_b), (stored_a, stored_b) = plan.trans, plan.storage
    if pgrid.size == 1:
        A, B = host_block(a, trans_a, pgrid), host_block(b, trans_b, pgrid)
        c = np.empty((m, n), dtype) if out is None else out
        return A, B, DistMatrix(pgrid, Layout((m, n), pgrid.shape), c, NumpyBackend()), \
            None, None
    shares = node_shares(pgrid, (m, n, k), dtype)
    A, a_node = root_block(a, trans_a, stored_a, (m, k), dtype, pgrid, root) or \
        operand_block(a, trans_a, stored_a, (m, k), dtype, pgrid, root, shares)
    B, b_node = root_block(b, trans_b, stored_b, (k, n), dtype, pgrid, root) or \
        operand_block(b, trans_b, stored_b, (k, n), dtype, pgrid, root, shares)
    C, c_node = root_result_block(out, (m, n), dtype, pgrid, root) or \
        result_block(out, (m, n), dtype, pgrid, shares)
    broadcaster, own = plan.broadcaster, None
    if broadcaster == "host" and (a_node is None or b_node is None):
        raise ValueError("broadcaster='host' needs node-shared operands: all ranks on "
                         f"one node with room in {host_arrays.shm_dir()}")
    if a_node is not None and b_node is not None and (
            broadcaster == "host" or (broadcaster == "auto" and not peer_access(pgrid, be))):
        # this rank's rows of A and columns of B, all of K
        own = (a_node[own_range(C.layout.rows, pgrid.row)],
               b_node[:, own_range(C.layout.cols, pgrid.col)])
    return A, B, C, own, c_node


def matmul(A, B, device=None, **kwargs):
    """The product ``alpha * op(A) @ op(B)`` of NumPy arrays (on GPUs
    through host memory, on CPUs with NumPy) or of DistMatrix operands.

    Arrays go to :func:`matmul_arrays`, DistMatrix operands to
    :func:`summa.gemm`, host-held DistMatrix operands with a GPU `device`
    to :func:`host_matmul`; each takes the keyword arguments below that
    apply to it.

    Parameters
    ----------
    A, B : array or DistMatrix
        Arrays held on rank `root` (None on the others; in a plain Python
        process, just the arrays), never modified: NumPy arrays, host arrays
        of other libraries (torch CPU tensors, anything with ``__array__``,
        the buffer protocol or DLPack), and arrays on a CUDA GPU (CuPy
        arrays, torch CUDA tensors, JAX arrays, anything with DLPack or
        ``__cuda_array_interface__``), read where they lie; or DistMatrix
        operands on one grid.
    device : Backend or str, optional
        Host-held DistMatrix operands only: the GPU they stream through in
        tiles (``"auto"``/``"cupy"``: the rank's GPU).
    alpha : scalar, default 1.0
    trans_a, trans_b : {"N", "T", "H"}, default "N"
        op of each operand; ``H`` is the conjugate transpose.
    out : numpy.ndarray, optional
        Arrays: where the product goes on `root` (its shape and dtype,
        contiguous rows, overlapping neither operand); returned.
    comm : MPI.Comm, optional
        Arrays: the ranks that multiply (default COMM_WORLD).
    root : int, default 0
        Arrays: the rank that holds them and gets the product.
    grid : str or tuple, optional
        Arrays: the process grid, e.g. ``"2x4"`` (default: bench's for the
        product's shape).
    backend : str, default "auto"
        Arrays: ``"auto"`` (GPUs where there are), ``"cupy"`` or ``"numpy"``.
    gpus, workers : int, optional
        Arrays in a plain Python process: the pool of worker ranks it runs
        on (default every visible GPU; without GPUs one worker per 8 cores).
    out_of_core : bool, optional
        Arrays: None (default) keeps them in host memory on GPUs; False
        copies them into GPU memory first; True: host-resident on CPUs too.
    device_memory : str, optional
        Cap on each GPU's memory, e.g. ``"16GiB"`` (default 90 % of free).
    panel_width : int or "auto", optional
        Panel width along K (default: by backend, dtype and mode).
    lookahead : int, default 1
    broadcaster : str, default "auto"
        ``"auto"``, ``"ipc"``, ``"nccl"``, ``"cuda-aware"``, ``"mpi"``, or
        for arrays ``"host"`` (every GPU uploads the panel parts it needs).
    precision : str, optional
        ``"tf32"`` (float32 on tensor cores) or ``"fp64-int8"`` (float64
        from INT8 products).
    moduli : int, optional
        With ``precision="fp64-int8"``: INT8 products per float64 one (3-30).
    schedule : str, default "panels"
        ``"panels"`` or ``"strips"`` (grids of one column).
    stats : SummaStats, optional
        Filled with this rank's timings.
    topology : summa.distribution.topology.Topology, optional
        Arrays: the nodes of `comm`'s ranks (tests: virtual nodes).
    options : summa.options.Options, optional
        The settings (default: the current ones; docs/options.md).
    C, beta, progress
        DistMatrix operands: as for :func:`summa.gemm`.

    Returns
    -------
    array, DistMatrix or None
        Arrays, on `root`: the product as the caller's kind where its
        library can wrap it (a CuPy array on the operands' GPU for CuPy
        operands, a torch tensor for torch's, a JAX array for JAX's), else
        NumPy (host arrays) or CuPy (GPU arrays); `out` where given; None on
        the other ranks. DistMatrix operands: a new DistMatrix.

    Warns
    -----
    RuntimeWarning
        Arrays, where the product has NaN/Inf (the run checks it as it goes):
        which operand holds how many NaN/Inf values, or that the product
        overflowed, as ``summa multiply`` warns of its files; the operands
        are counted only then.

    Examples
    --------
    >>> c = matmul(a, b)  # doctest: +SKIP
    >>> c = matmul(a if rank == 0 else None, b if rank == 0 else None)  # doctest: +SKIP
    >>> C = matmul(A_host, B_host, device="auto")  # doctest: +SKIP
    >>> c_gpu = matmul(cupy.asarray(a), cupy.asarray(b))  # one GEMM on that GPU  # doctest: +SKIP
    """
    if isinstance(A, DistMatrix) or isinstance(B, DistMatrix):
        if device is not None and isinstance(A, DistMatrix) and not A.backend.is_gpu:
            return host_matmul(A, B, device, **kwargs)
        return gemm(A, B, **kwargs)
    if device is not None:
        raise TypeError("device applies to host-held DistMatrix operands; for arrays give "
                        "backend= (GPU arrays are multiplied on the GPU they lie on)")
    return _warned(A, B, kwargs)


def _matmul_signature() -> inspect.Signature:
    """What :func:`matmul` takes, for ``help()`` and ``inspect``: its
    keywords pass on to :func:`matmul_arrays`, :func:`summa.gemm` or
    :func:`host_matmul`, which check them (each takes those that apply)."""
    keyword = inspect.Parameter.KEYWORD_ONLY
    defaults = {"alpha": 1.0, "trans_a": "N", "trans_b": "N", "out": None, "comm": None,
                "root": 0, "grid": None, "backend": "auto", "gpus": None, "workers": None,
                "out_of_core": None, "device_memory": None, "panel_width": None,
                "lookahead": 1, "broadcaster": "auto", "precision": None, "moduli": None,
                "schedule": "panels", "stats": None, "topology": None, "options": None,
                "C": None, "beta": 0.0, "progress": None}
    positional = [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                    **({"default": None} if name == "device" else {}))
                  for name in ("A", "B", "device")]
    return inspect.Signature(positional + [inspect.Parameter(name, keyword, default=value)
                                           for name, value in defaults.items()])


matmul.__signature__ = _matmul_signature()


def _warned(a, b, kwargs: dict):
    """:func:`matmul_arrays` of `a` and `b`, warning at the caller's caller's
    line where the product has NaN/Inf (the run says whether it has)."""
    stats = kwargs.get("stats") or SummaStats()
    c = matmul_arrays(a, b, **dict(kwargs, stats=stats))
    if c is not None and (stats.extra or {}).get("product_finite") is False:
        for note in _nonfinite_notes({"a": a, "b": b}, np.dtype(c.dtype)):
            warnings.warn(note, RuntimeWarning, stacklevel=3)
    return c


def _nonfinite_notes(operands: dict, dtype) -> list[str]:
    """What a product with NaN/Inf values warns of: how many each of the
    named `operands` holds (a pass over them, made only then), or that the
    product overflowed."""
    counts = {name: int((~np.isfinite(x)).sum()) for name, x in operands.items()}
    notes = [_nonfinite_note(name, bad) for name, bad in counts.items() if bad]
    return notes or [_overflow_note(dtype, f"{' and '.join(operands)} are")]


def _nonfinite_note(name: str, count: int) -> str:
    """The warning of `count` NaN/Inf values in the input `name`."""
    return f"{name} contains {count} NaN/Inf value(s); the product will contain NaN/Inf too"


def _overflow_note(dtype, finite: str) -> str:
    """The warning of a product with NaN/Inf values though its inputs
    (`finite`: "the inputs are") are finite."""
    return (f"the product has NaN/Inf values (or values near the end of the "
            f"{np.dtype(dtype).name} range) though {finite} finite: it overflowed")


@settings.entry_point
def host_matmul(A: DistMatrix, B: DistMatrix, device, alpha=1.0, trans_a="N", trans_b="N",
                panel_width=None, lookahead: int = 1, broadcaster: str = "auto",
                precision=None, device_memory=None, stats: SummaStats | None = None,
                moduli: int | None = None) -> DistMatrix:
    """``alpha op(A) @ op(B)`` of host-held DistMatrix operands on the GPUs
    (`device`), A, B and the new C staying in host memory; collective.

    Plans against the free device memory (or `device_memory`, e.g. "16GiB")
    and takes the fewest C tiles that fit, one where everything does; a
    transposed operand is redistributed on the host first. Raises the same
    ValueError on every rank for operands that cannot be multiplied, a device
    budget too small for any tile, or a host too small for the plan.
    `options` (a :class:`summa.options.Options`) are the settings (default:
    the current ones).
    """
    if not isinstance(B, DistMatrix) or B.backend.is_gpu:
        raise ValueError("host_matmul needs both operands host-held (NumPy backend)")
    moduli = check_moduli(moduli, precision)
    grid = A.grid
    if isinstance(device, str):
        device = collectively(grid.comm, get_backend, device, grid.local_rank)
    ops = [str(t).upper() for t in (trans_a, trans_b)]
    for name, t in zip(("trans_a", "trans_b"), ops):
        if t not in ("N", "T", "H"):
            raise ValueError(f"{name} must be N, T or H, got {t!r}")
    check_operands(A, B, None, *ops)
    opA, opB = (X if t == "N" else X.transpose(conj=t == "H" and X.dtype.kind == "c")
                for X, t in ((A, ops[0]), (B, ops[1])))
    m, k = opA.shape
    n = opB.shape[1]
    # (opA and opB come redistributed and conjugated: the plan's conj is False)
    plan = make_plan((m, n, k), opA.dtype, Machine.live(grid.comm, device), grid=grid.shape,
                     trans_a=ops[0], trans_b=ops[1], out_of_core=True,
                     device_memory=device_memory, panel_width=panel_width, lookahead=lookahead,
                     precision=precision, moduli=moduli, broadcaster=broadcaster)
    layout = Layout.from_distributions(opA.layout.rows, opB.layout.cols)
    C = DistMatrix(grid, layout, np.empty(layout.local_shape(grid.row, grid.col), opA.dtype),
                   NumpyBackend())
    with asked_moduli(moduli):  # the products take them
        result = run_out_of_core(plan, SweepOperands(opA, opB, C), device, alpha=alpha,
                                 fresh_c=True)
    if stats is not None:
        stats.__dict__.update(result.__dict__)
    return C
