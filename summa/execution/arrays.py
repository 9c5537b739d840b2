"""The executors of a product of arrays held on one rank, and the two
sequences that plan such a product, then run it.

:func:`execute` runs a Plan on the arrays as they lie
(:class:`summa.planning.arrays.HeldArrays`): one GEMM where they lie on a
GPU (:func:`run_on_device`), or over a grid of ranks from host memory
(:func:`run_arrays`: in memory, or the out-of-core sweep), drawing no more
memory than the plan counted (:class:`summa.device.account.Account`). It
decides nothing: the Plan it takes is final for these arrays.
:func:`run_held` makes that final Plan (the planner's
:func:`summa.planning.arrays.stored_plan`) and executes it;
:func:`multiply` plans one product and runs it (a pool's worker's
``summa.matmul``), :class:`ArrayProduct` plans once and runs many times
(:class:`summa.Matmul`'s, in a plain process and in a pool's workers). The
caller's own kinds of array, and what it gets back, are :mod:`summa.api`'s."""

from __future__ import annotations

import contextlib
import time
import warnings

import numpy as np

from ..runtime.mpi import MPI
from ..runtime.agree import from_root
from .algorithm import run_in_memory
from ..device.account import Account, DeviceMemoryError, give_back_cached
from ..planning.hostroom import check_host_room
from ..device.backend import NumpyBackend
from ..distribution.grid import ProcessGrid
from ..distribution.layout import Layout
from ..distribution.matrix import DistMatrix
from ..host.blocks import (host_block, node_shares, operand_block, own_range, result_block,
                           root_block, root_result_block, stored_operand)
from ..host import shared as host_arrays
from ..host.shared import parallel_copy
from ..host.storage import conjugated, op_view
from .jobprogress import library_reporting, multiply_phase, phase_predictions
from .outofcore import SweepOperands, run_out_of_core
from ..planning.arrays import HeldArrays, plan_held, settled_on_grid, stored_plan
from ..planning.request import PlanRequest
from .transpose import PanelsOfA
from ..planning.checks import check_arrays, check_scalars
from ..planning.memory import format_bytes
from ..planning.memorycheck import check_memory
from ..planning.selection import peer_access
from ..planning.sweepsetup import prepared_sweep
from ..runtime.progress import active
from ..runtime.watchdog import watch

#: What a DeviceMemoryError says where the product was being written into
#: the caller's `out` as it went.
_PARTLY_WRITTEN = "; out= may be partly written"

__all__ = ["execute", "run_held", "run_on_device", "run_arrays", "multiply", "ArrayProduct"]


def multiply(held: HeldArrays, comm, request: PlanRequest = PlanRequest(), alpha=1.0,
             stats=None, backend="auto", topology=None, called: float | None = None):
    """``alpha op(a) @ op(b)`` of the NumPy arrays `held` on the ranks of
    `comm`: planned (:func:`summa.planning.arrays.plan_held`), then run on a
    process grid of them (:func:`run_held`); collective. `request`,
    `backend` and `topology` as for :func:`summa.api.multiply.matmul_arrays`;
    `stats` and `called` as for :func:`run_arrays`. Returns the product on
    the root (`out` where given), None elsewhere."""
    be, plan = plan_held(held, comm, held.root, request, backend, topology)
    if plan.placement.resident:  # one GEMM where the operands lie: no grid to make
        return run_held(plan, None, be, held, alpha, stats, called)
    with library_reporting(comm, plan), ProcessGrid(comm, plan.grid, topology=topology) as pgrid:
        if pgrid.core_note and pgrid.rank == 0:
            warnings.warn(pgrid.core_note, RuntimeWarning, stacklevel=2)
        return run_held(plan, pgrid, be, held, alpha, stats, called)


class ArrayProduct:
    """A product of arrays planned once on the ranks of `comm` and run
    many times: its backend, Plan and process grid (with the communicators
    and broadcasters it keeps), until :meth:`free`.

    Parameters
    ----------
    plan : summa.planning.Plan
        The Plan :func:`summa.planning.arrays.plan_held` made.
    backend : Backend
        The rank's backend it was made with.
    comm : MPI.Comm
    root : int
        The rank that holds the arrays.
    asked : tuple
        ``(request, backend, topology)`` it was planned from
        (:func:`summa.planning.arrays.plan_held`'s): what planning again
        takes (:meth:`fitted`).

    Attributes
    ----------
    plan, backend, grid
        The Plan it runs (the one it was made with, or a later one of
        :meth:`fitted`), the backend, the ProcessGrid (None once freed).
    """

    def __init__(self, plan, backend, comm, root: int = 0,
                 asked: tuple = (PlanRequest(), "auto", None)):
        self.plan, self.backend, self._comm, self._root, self._asked = \
            plan, backend, comm, root, asked
        self.grid = ProcessGrid(comm, plan.grid, topology=asked[2])

    @classmethod
    def planned(cls, given, comm, root: int = 0, request: PlanRequest = PlanRequest(),
                backend="auto", topology=None) -> "ArrayProduct":
        """The ArrayProduct of the root's operands `given`, as
        :func:`summa.planning.arrays.plan_held` takes them; collective."""
        be, plan = plan_held(given, comm, root, request, backend, topology)
        return cls(plan, be, comm, root, (request, backend, topology))

    def fitted(self, given) -> str | None:
        """Plan again for the root's described operands `given` where the
        GPUs' free memory no longer holds the plan (other work took memory
        since it was made; memory freed since lets it stay): the memory free
        is read at each execution, never assumed from the construction's.
        Where nothing fits, planning's own one-line ValueError. Collective.
        Returns what changed, for a RuntimeWarning, on the root; else None."""
        if not self.backend.is_gpu:
            return None
        try:
            check_memory(self.plan.memory, self.backend, self._comm)
            return None
        except ValueError as exc:
            short = str(exc)
        plan = self.replanned(given)
        if self._comm.Get_rank() != self._root:
            return None
        return (f"summa.Matmul planned again: {short.split('; use')[0]}; now "
                f"{'out of core' if plan.out_of_core else 'in memory'}, "
                f"{format_bytes(plan.memory.device_bytes)} a GPU")

    def replanned(self, given):
        """Plan again for the root's described operands `given`, as
        :meth:`fitted` does, with the memory free now, the grid made anew
        where its shape changed (a run that found less than its plan counted:
        :func:`run_held`'s `again`). Collective. Returns the new Plan."""
        request, backend, topology = self._asked
        _, plan = plan_held(given, self._comm, self._root, request, backend, topology)
        if tuple(plan.grid) != tuple(self.plan.grid):
            self.grid.free()
            self.grid = ProcessGrid(self._comm, plan.grid, topology=topology)
        self.plan = plan
        return plan

    def check(self, held: HeldArrays) -> None:
        """Refuse the root's NumPy arrays `held` where the plan does not fit
        them (:func:`summa.planning.checks.check_arrays` of its ops, then
        its shape and dtype): the same ValueError on every rank (a pool's
        worker, whose owner checked them too); collective."""
        refusal = self._mismatch(held) if self._comm.Get_rank() == self._root else None
        refusal = from_root(self._comm, self._root, refusal)
        if refusal:
            raise ValueError(refusal)

    def _mismatch(self, held: HeldArrays) -> str | None:
        """Why the plan does not fit `held` (None: it does); local."""
        plan = self.plan
        meta = check_arrays(*held.arrays, *plan.trans, self.backend)
        if isinstance(meta, str):
            return meta
        if (tuple(meta[:3]), np.dtype(meta[3]).name) != (tuple(plan.shape), plan.dtype):
            return (f"the operands make a {meta[0]}x{meta[1]}x{meta[2]} "
                    f"{np.dtype(meta[3]).name} product, but this Matmul planned "
                    f"{'x'.join(map(str, plan.shape))} {plan.dtype}")
        return None

    def run(self, held: HeldArrays, alpha=1.0, stats=None, called: float | None = None):
        """The product of `held` by this Plan, its grid kept
        (:func:`run_held`); collective."""
        return run_held(self.plan, self.grid, self.backend, held, alpha, stats, called)

    def free(self) -> None:
        """Release the grid, its communicators and broadcasters (safe twice)."""
        if self.grid is not None:
            self.grid.free()
            self.grid = None


def run_held(plan, pgrid, be, held: HeldArrays, alpha=1.0, stats=None,
             called: float | None = None, again=None):
    """`plan` made final for the arrays `held` as they lie, then run:
    kernels compiled on first use (fp64-int8's) made ready, a host plan's
    memory planned again where the arrays lie otherwise than it was made
    for (:func:`summa.planning.arrays.stored_plan`: the planner, before
    anything runs) and, in memory on a grid, settled on its blocks (an
    ``"auto"`` width measured, ``auto``'s direct copies decided:
    :func:`summa.planning.arrays.settled_on_grid`), then :func:`execute`;
    collective.

    A run on one rank that a draw the GPU had no room for ends
    (:class:`summa.device.account.DeviceMemoryError`: other work took memory
    after planning) is planned again once and run again, with a
    RuntimeWarning: what it held given back first
    (:func:`summa.device.account.give_back_cached`), then ``again()``, the
    caller's planner (its Plan made with the memory free now, and the
    arrays that Plan takes: ``(plan, held)``). The product is written with
    beta 0, so a second run overwrites whatever the first left in `out`.
    Without `again`, on several ranks, or failing twice: the
    DeviceMemoryError, saying where `out` may be partly written."""
    be.prepare(plan.precision, plan.dtype)  # (where it was not planned here: a Matmul's)
    if not plan.placement.resident:
        plan = stored_plan(plan, held, pgrid.comm, be)
    settled = None
    if pgrid is not None:  # a product the machine's free memory cannot take: refused first
        check_host_room(_own_host_bytes(plan, pgrid, held), pgrid.comm)
        settled = settled_on_grid(plan, pgrid, be, PanelsOfA)  # (every rank, before any move)
    try:
        return execute(plan, pgrid, be, held, alpha, stats, called, settled)
    except DeviceMemoryError as exc:
        if again is None or (pgrid is not None and pgrid.comm.Get_size() > 1):
            raise
        # its message alone, not its traceback and CuPy's error behind it:
        # their frames let go, the arrays the failed run held go back to the pool
        failed = DeviceMemoryError(str(exc))
    return _run_again(failed, pgrid, be, again, alpha, stats, called)


def _run_again(failed: DeviceMemoryError, pgrid, be, again, alpha, stats, called):
    """:func:`run_held`'s second run on one rank, after `failed`: the
    memory the first held given back, the product planned again
    (``again()``) and run once more, without a third; a RuntimeWarning
    says so. Where nothing fits the memory free now, `failed` with the
    planner's reason."""
    give_back_cached(be)
    free = be.memory_free()
    now = f" with {format_bytes(free)} free" if free is not None else ""
    try:
        plan, held = again()
    except ValueError as exc:  # (planning's one line: nothing fits now)
        said = str(failed).removesuffix(_PARTLY_WRITTEN)
        raise DeviceMemoryError(f"{said}; planned again{now}: {exc}"
                                f"{_PARTLY_WRITTEN if said != str(failed) else ''}") from None
    gpu = f", {format_bytes(plan.memory.device_bytes)} a GPU" if be.is_gpu else ""
    warnings.warn(
        f"summa: {str(failed).split('; another process')[0]}; planned again{now} "
        f"({'out of core' if plan.out_of_core else 'in memory'}{gpu}) and run once more",
        RuntimeWarning, stacklevel=4)
    if plan.placement.resident:
        return run_held(plan, None, be, held, alpha, stats, called)
    if pgrid is not None:
        return run_held(plan, pgrid, be, held, alpha, stats, called)
    with ProcessGrid(MPI.COMM_SELF, plan.grid) as grid:  # (it ran where the operands lay)
        return run_held(plan, grid, be, held, alpha, stats, called)


def execute(plan, pgrid, be, held: HeldArrays, alpha=1.0, stats=None,
            called: float | None = None, settled: tuple | None = None):
    """The executor of a Plan of arrays: one GEMM where they lie
    (:func:`run_on_device`, resident plans: no grid, `pgrid` None), or
    :func:`run_arrays` over the grid `pgrid` on host arrays; collective.
    `plan` is final for `held` as they lie (:func:`run_held`): nothing is
    decided here. The memory drawn is held to the plan's (an
    :class:`summa.device.account.Account`, its report in `stats`' ``extra``,
    with ``compile_seconds``, the seconds kernels compiled on first use
    took since they were last reported). `settled`: ``(plan, measured)``,
    `plan` settled on the grid's blocks for the in-memory run
    (:func:`summa.planning.arrays.settled_on_grid`); None: `plan` is.
    Returns the product on the root
    (CuPy on the GPU for a resident plan, else NumPy: `out` where given),
    None elsewhere."""
    compiled = be.compile_seconds()  # its own figure, not the product's
    with Account.of(plan, be, result=_root_copies(plan, pgrid, held.root)).drawing(
            None if pgrid is None else pgrid.comm) as account, _said_of_out(plan, pgrid, be, held):
        if plan.placement.resident:
            c = run_on_device(plan, be, held, alpha, stats)
        else:
            c = run_arrays(plan, pgrid, be, held, alpha, stats, called, settled)
    if stats is not None:
        stats.extra["compile_seconds"] = compiled
        stats.extra.update(account.report())
        # (out of core and one GEMM where the operands lie: no width measured)
        stats.extra.setdefault("panel_width_measured", False)
    return c


@contextlib.contextmanager
def _said_of_out(plan, pgrid, be, held: HeldArrays):
    """Run the block; a DeviceMemoryError in it where the product is being
    written into the caller's `out` as it goes (one GEMM into it on its
    GPU, one CPU rank in memory, out of core: the sweep writes C's tiles
    where they lie) says that `out` may be partly written, one line, the
    same class (on several ranks, the line the job ends with)."""
    try:
        yield
    except DeviceMemoryError as exc:
        if held.out is None or not _writes_in_place(plan, pgrid, be):
            raise
        raise DeviceMemoryError(f"{exc}{_PARTLY_WRITTEN}") from None


def _writes_in_place(plan, pgrid, be) -> bool:
    """Does the executor of `plan` on `pgrid` write the product into the
    caller's `out` as it goes (not gathered into it once done)?"""
    return plan.placement.resident or plan.out_of_core or (pgrid.size == 1 and not be.is_gpu)


def _own_host_bytes(plan, pgrid, held: HeldArrays) -> int:
    """Host bytes this rank takes for itself beside the caller's arrays:
    its staging buffers, and on the root the product where it is made
    anew (no `out` written in place) or gathered with the scatter's copies
    (:func:`_root_copies`). Blocks the other ranks receive are left out:
    the pool's workers may read the caller's arrays in place."""
    own = int(plan.memory.staging_bytes or 0)
    if pgrid.comm.Get_rank() != held.root:
        return own
    (m, n, _), item = plan.shape, np.dtype(plan.dtype).itemsize
    made = 0 if held.out is not None else m * n * item
    return own + max(_root_copies(plan, pgrid, held.root), made)


def _root_copies(plan, pgrid, root: int) -> int:
    """Host bytes a grid's root takes beside its plan's share, as the one
    rank that holds the caller's arrays: the whole C and the piece each
    rank's block of it arrives in (:meth:`summa.distribution.matrix.DistMatrix.gather`),
    and at most a copy of op(A) and of op(B) where it scatters them (their
    blocks cut out one at a time, a transposed or converted operand made
    whole first: the randomized sweep found both, 1.2 and 3.6 MiB past the
    plan's share); none elsewhere, where the plan's share is exact."""
    if pgrid is None or pgrid.size == 1 or pgrid.comm.Get_rank() != root:
        return 0
    (m, n, k), (pr, pc) = plan.shape, plan.grid
    return (m * n + -(-m // pr) * -(-n // pc) + m * k + k * n) * np.dtype(plan.dtype).itemsize


def run_on_device(plan, be, held: HeldArrays, alpha=1.0, stats=None):
    """The executor of a resident plan (``plan.placement.resident``):
    ``alpha op(a) @ op(b)`` as one GEMM (:meth:`summa.device.backend.Backend.gemm`:
    a transposed operand is read as cuBLAS's transposed op, op H of one stored
    by rows as its op C, no copy) on the GPU where `held`'s arrays lie (CuPy),
    a host operand of a mixed pair (NumPy) uploaded first, into `held.out`
    there (written where it lies) or a new CuPy array. Queued on the current
    stream and not waited for, as ``cupy.matmul``, but where `stats` (a
    SummaStats) are asked for. Returns the product (CuPy)."""
    (m, n, k), dtype = plan.shape, np.dtype(plan.dtype)
    check_scalars(alpha, 0.0, dtype, plan.precision, be)
    began = time.perf_counter()
    with be.xp.cuda.Device(plan.placement.device):  # its cuBLAS handle, its memory
        a, b = (op_view(be.asarray(x) if isinstance(x, np.ndarray) else x, t)
                for x, t in zip((held.a, held.b), plan.trans))
        c = held.out if held.out is not None else be.xp.empty((m, n), dtype)
        if k == 0:
            c.fill(0)
        else:
            be.gemm(alpha, a, b, c, beta=0.0, precision=plan.precision,
                    conj=tuple(conjugated(t, dtype) for t in plan.trans), scheme=plan.scheme)
        if stats is not None:
            be.synchronize()
            seconds = time.perf_counter() - began
            stats.__dict__.update(seconds=seconds, compute=seconds, panels=1, panel_width=k,
                                  comm="none")
            stats.extra.update(plan=plan.as_dict(), resident=True)
    return c


def run_arrays(plan, pgrid, be, held: HeldArrays, alpha=1.0, stats=None,
               called: float | None = None, settled: tuple | None = None):
    """Run `plan` on the NumPy arrays `held` over the grid `pgrid` it names,
    `plan` made for them as they lie
    (:func:`summa.planning.arrays.stored_plan`): in memory (scattered onto
    the devices, gathered back), or host-resident (:func:`_host_blocks`,
    the out-of-core sweep); collective. `stats` (a SummaStats) receives this
    rank's timings and ``extra["plan"]``; `called`: when the call began
    (``perf_counter``), for its set-up time; `settled` as for
    :func:`execute`. Returns the product on the root (`out` where given),
    None elsewhere."""
    held = _as_arrays(held)
    a, b, out, root = held.a, held.b, held.out, held.root
    if not plan.out_of_core:
        return _in_memory(plan, pgrid, be, held, alpha, stats, settled or (plan, False))
    A, B, C, own, c_node = _host_blocks(a, b, out, plan, pgrid, root, be)
    set_up = time.perf_counter() - (called or time.perf_counter())  # checks, plan, blocks
    # the sweep's broadcasters (none with own copies) and the plan made final
    # for them, before it runs (the planner's: their staging counted)
    sweep = SweepOperands(A, B, C, own)
    plan, broadcasters = prepared_sweep(plan, sweep, be)
    # beta 0: out's old values do not matter either
    job = _multiply_phase(plan, pgrid)
    result = run_out_of_core(plan, sweep, be, alpha=alpha, fresh_c=True,
                             progress=job and job.step, broadcasters=broadcasters)
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


def _as_arrays(held: HeldArrays) -> HeldArrays:
    """`held` with array-likes as NumPy sees them (arrays, node-shared
    ones too, as they are)."""
    a, b = (x if x is None or isinstance(x, np.ndarray) else np.asarray(x)
            for x in (held.a, held.b))
    return held if a is held.a and b is held.b else HeldArrays(a, b, held.out, held.root)


def _in_memory(plan, pgrid, be, held: HeldArrays, alpha, stats, settled: tuple):
    """The in-memory multiply of :func:`run_arrays`: each operand as the
    plan's storage says (:func:`summa.host.blocks.stored_operand`: on one rank
    where it lies, read transposed and conjugated by the GEMMs; on a grid
    scattered and settled on the devices), the product on one CPU rank
    written straight into `out` (or a new array: NumPy's GEMMs read A and B
    as they lie, so that is the only memory the call takes), elsewhere
    gathered; run as `settled` ``(plan, measured)`` says, `plan` recorded.
    Collective."""
    (m, n, _), dtype, root = plan.shape, np.dtype(plan.dtype), held.root
    one = pgrid.size == 1
    (A, conj_a), (B, conj_b) = (stored_operand(x, t, s, pgrid, be, root) for x, t, s in
                                zip((held.a, held.b), plan.trans, plan.storage))
    layout = Layout((m, n), pgrid.shape)
    if one and not be.is_gpu:
        c = np.empty((m, n), dtype) if held.out is None else held.out
    else:
        c = be.xp.empty(layout.local_shape(pgrid.row, pgrid.col), dtype)
    C = DistMatrix(pgrid, layout, c, be)
    # panels copied as the plan counted them, whatever these arrays' layout
    # (a Matmul planned for others): no scratch beyond its memory
    job = _multiply_phase(plan, pgrid)
    # (an "auto" width and auto's direct copies: settled by the planner first)
    ran, measured = settled
    result = run_in_memory(ran, A, B, C, alpha=alpha, conj=(conj_a, conj_b),
                           progress=job and job.step)
    result.extra["panel_width_measured"] = measured
    if stats is not None:  # a pass over C where it lies: matmul warns of NaN/Inf by it
        finite = pgrid.comm.allreduce(be.all_finite(c), op=MPI.LAND)
        stats.__dict__.update(result.__dict__)
        stats.extra.update(plan=plan.as_dict(), product_finite=finite)
    if one and not be.is_gpu:
        return c
    return C.gather(root=root, out=held.out)


def _multiply_phase(plan, pgrid):
    """The JobProgress a caller set around this multiply (a pool's worker:
    :func:`summa.runtime.progress.reporting`), its multiply phase started;
    None where there is none."""
    job = active()
    if job is not None:
        multiply_phase(job, plan, pgrid, phase_predictions(plan) if pgrid.rank == 0 else None)
    return job


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
