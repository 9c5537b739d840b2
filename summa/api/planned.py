"""One product of arrays held on one rank, planned and run: the operands as
the caller passed them (:class:`ArrayOperands`), the pool of ranks they run
on (:func:`pooled_size`), their check and Plan (:func:`plan_arrays`), and
the executors of that Plan (:func:`run_planned`: one GEMM where they lie on
a GPU, :func:`run_on_device`, or over a grid of ranks from host memory,
:func:`run_arrays`). :func:`summa.api.multiply.matmul_arrays` plans and runs
each call; :class:`summa.Matmul` plans once and runs many times."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import numpy as np

from ..runtime.mpi import MPI
from ..runtime.agree import Failure, collectively, from_root
from ..execution.algorithm import run_in_memory
from ..device.account import Account
from ..device.backend import NumpyBackend, get_backend
from ..distribution.grid import node_rank
from ..host.blocks import (host_block, node_shares, operand_block, own_range, result_block,
                           root_block, root_result_block, stored_operand)
from ..host import shared as host_arrays
from .. import options as settings
from .. import pool
from .arrays import check_arrays, is_array
from .checks import check_scalars
from ..host.shared import parallel_copy
from ..distribution.layout import Layout
from .operands import describe, unconjugated
from .promotion import common_type, promoted
from ..distribution.matrix import DistMatrix
from ..device.traits import traits
from ..execution.outofcore import SweepOperands, run_out_of_core
from ..planning.planner import Machine, make_plan, restore
from ..planning.hostroom import check_host_room
from ..planning.least import check_least_budget
from ..planning.selection import peer_access
from ..host.storage import conjugated, op_view, storage_of
from ..runtime.watchdog import watch
from ..runtime.progress import active
from .jobprogress import multiply_phase, phase_predictions

__all__ = ["ArrayOperands", "PlanRequest", "plan_arrays", "run_planned", "run_on_device",
           "run_arrays", "pooled_size", "ndim_of", "precision_refusal"]


def pooled_size(operands: "ArrayOperands", comm, gpus=None, workers=None,
                backend="auto") -> tuple:
    """``(ranks, operands)``: the pool of worker ranks (:mod:`summa.pool`) a
    product of `operands` runs on, and `operands` described where that was
    asked. Only a plain Python process (`comm` None, a world of one rank, no
    launcher) has a pool: there `operands` are described (their
    ValueError raised) and the ranks are :func:`_pool_size`'s; elsewhere 1
    (the ranks of `comm`), and `operands` as they came. `gpus`, `workers`
    and `backend` as for :func:`summa.api.multiply.matmul_arrays`."""
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
    into (:func:`summa.api.multiply.matmul_arrays`).

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
        operands of two dtypes in their common one,
        :func:`summa.api.promotion.promoted`; raising their ValueError); call
        it on the root."""
        return self if self.given is not None else replace(
            self, given=promoted(describe(self.a, self.b, self.out)))

    def unconjugated(self, trans: tuple) -> tuple:
        """``(operands, (trans_a, trans_b))``: these, a lazy conjugate among
        `a` and `b` (torch's conjugate bit) read as its data lie and its
        conjugation moved into `trans`, the ops asked
        (:func:`summa.api.operands.unconjugated`); the ops as given,
        upper-case, where there is none (off the root: the root's are
        taken)."""
        (a, trans_a), (b, trans_b) = (unconjugated(x, str(t).upper())
                                      for x, t in zip((self.a, self.b), trans))
        return replace(self, a=a, b=b, given=None), (trans_a, trans_b)

    def taken(self, trans: tuple, vectors: tuple | None = None) -> tuple:
        """``(operands, trans, vectors)``: these as summa takes them, 1-D ones
        as matrices (:meth:`as_matrices`, `vectors` as it takes it) and a
        lazy conjugate's conjugation moved into the ops `trans`
        (:meth:`unconjugated`)."""
        operands, vectors = self.as_matrices(trans, vectors)
        operands, trans = operands.unconjugated(trans)
        return operands, trans, vectors

    def as_matrices(self, trans: tuple, vectors: tuple | None = None) -> tuple:
        """``(operands, vectors)``: a 1-D `a` or `b` (on the root) taken as
        NumPy's matmul takes it, op(a) a row (1 x k) and op(b) a column (k x
        1), as views (`out` too: a row, a column or 1 x 1); `vectors` says
        which were (:func:`vector_result` drops their dimensions from the
        product). The ops `trans` are upper-case. Given `vectors` (a Matmul's
        stored operands, already matrices), `out` is taken for them."""
        a, b, out = self.a, self.b, self.out
        found = tuple(x is not None and ndim_of(x) == 1 for x in (a, b))
        vectors = found if vectors is None else vectors
        if not any(vectors):
            return self, vectors
        row, column, one = (None, slice(None)), (slice(None), None), (None, None)
        if found[0]:
            a = _matrix(a, column if trans[0] != "N" else row)
        if found[1]:
            b = _matrix(b, column if trans[1] == "N" else row)
        if out is not None and ndim_of(out) == 2 - sum(vectors):  # else: refused by its shape
            out = _matrix(out, one if all(vectors) else column if vectors[1] else row)
        return replace(self, a=a, b=b, out=out, given=None), vectors

    def into_transposed_out(self, trans: tuple) -> tuple:
        """``(operands, trans)``: where `out` is a Fortran-ordered NumPy or
        CuPy array for the product of such operands `a` and `b` (on the
        root), ``op(b)^T @ op(a)^T`` into ``out.T`` (C-ordered: written in
        place), so `out` holds ``op(a) @ op(b)`` with no copy of it; else
        these and `trans` as they are (also for op H of complex operands:
        its transpose is a conjugate, no op)."""
        a, b, out = self.a, self.b, self.out
        if not all(is_array(x) and x.ndim == 2 for x in (a, b, out)) or \
                not (out.strides[0] == out.itemsize != out.strides[1]) or \
                (out.dtype.kind == "c" and "H" in trans) or \
                common_type(a.dtype, b.dtype) != out.dtype:
            return self, trans
        (m, _), (_, n) = (x.shape if t == "N" else x.shape[::-1] for x, t in zip((a, b), trans))
        if out.shape != (m, n):  # (the checks say so, of the product asked for)
            return self, trans
        flipped = {"N": "T", "T": "N", "H": "N"}  # (op H of a real array is op T)
        return (replace(self, a=b, b=a, out=out.T, given=None),
                (flipped[trans[1]], flipped[trans[0]]))


def vector_result(c, vectors: tuple, out=None):
    """What the caller gets of the product `c` of the operands
    :meth:`ArrayOperands.taken` took: the `out` it passed where it passed
    one (written however summa took it: a view, its transpose); else `c`
    with the dimensions of 1-D operands dropped, as NumPy's matmul returns
    it: a 1-D `a` drops the row, a 1-D `b` the column (both: one element,
    a NumPy scalar or a 0-d GPU array); `c` as it is where neither was 1-D
    (off the root: None)."""
    if c is None:
        return None
    if out is not None:
        return out
    if not any(vectors):
        return c
    return c[0, 0] if all(vectors) else c[0] if vectors[0] else c[:, 0]


def ndim_of(x) -> int:
    """How many dimensions `x` has (any array-like), by its own word where it
    has one (no conversion: a torch tensor with its conjugate bit refuses
    it); -1 where it says none and NumPy cannot tell (:func:`describe`
    refuses it by name)."""
    ndim = getattr(x, "ndim", None)
    if isinstance(ndim, int):
        return ndim
    try:
        return len(x.shape) if hasattr(x, "shape") else np.ndim(x)
    except Exception:  # noqa: BLE001 -- not an array: refused where it is described
        return -1


def _matrix(x, index: tuple):
    """`x` (1-D, or 0-d) indexed by `index`, a row, a column (or one element)
    view of it: of its own kind where it indexes as NumPy does (NumPy, CuPy,
    torch, JAX), else of the NumPy array viewing it (a memoryview, an
    ``__array__`` object)."""
    try:
        return x[index]
    except (TypeError, IndexError):
        return np.asarray(x)[index]


@dataclass(frozen=True)
class PlanRequest:
    """What a call asked of the plan of an array product: the arguments of
    the same names of :func:`summa.api.multiply.matmul_arrays` (and :class:`summa.Matmul`) that
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
    :func:`summa.api.multiply.matmul_arrays`.

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
            _check_budget(operands.given, request)
        except Exception as exc:  # noqa: BLE001 -- raised on every rank below
            meta = Failure.of(exc)
    meta = from_root(comm, operands.root, meta)  # bad input refused before the backend starts
    placed = operands.given.placement if operands.given is not None else None
    local = placed.device if comm.Get_size() == 1 and placed is not None and \
        placed.device is not None else node_rank(comm, topology)[0]
    be = collectively(comm, get_backend, backend, local)
    if rank == operands.root and meta is None:
        meta = check_arrays(*operands.given.arrays, trans_a, trans_b, be,
                            operands.given.out_in_place, operands.given.result_dtype)
        if not isinstance(meta, str):
            meta = precision_refusal(operands.given, request.precision) or \
                (*meta, placed, (trans_a, trans_b))
    meta = from_root(comm, operands.root, meta)
    if isinstance(meta, str):
        raise ValueError(meta)
    # the root's ops: a lazy conjugate it holds moved its conjugation there
    m, n, k, dtype, placement, (trans_a, trans_b) = meta

    def in_host() -> ArrayOperands:  # the arrays described, as host arrays on the root
        given = operands.given
        return operands if given is None else ArrayOperands(*given.host_arrays(be),
                                                             operands.root)
    # host arrays are cut as they lie; GPU arrays fetched lie as they come to host memory
    held = placement is None or placement.where == "host"
    storage = _storage(in_host(), (trans_a, trans_b), comm) if held else None
    # what first use compiles or allocates (fp64-int8's kernels, cuBLASLt's
    # workspace) is made before the free memory is read: the plan sees the rest
    be.prepare(request.precision, dtype)
    # (the nodes the grid will see: the copy threads share them)
    plan = make_plan((m, n, k), dtype, Machine.live(comm, be, topology), grid=request.grid,
                     trans_a=trans_a, trans_b=trans_b, host_held=True,
                     out_of_core=request.out_of_core, device_memory=request.device_memory,
                     panel_width=request.panel_width, lookahead=request.lookahead,
                     schedule=request.schedule, precision=request.precision,
                     broadcaster=request.broadcaster, placement=placement,
                     storage=storage or ("rows", "rows"))
    if plan.placement.where == "host":  # (GPU arrays that do not fit there: as fetched)
        plan = _stored(plan, storage or _storage(in_host(), plan.trans, comm))
    return be, plan, operands


def precision_refusal(given, precision) -> str | None:
    """Why `precision` cannot be asked of the described operands `given`
    (integers, multiplied exactly in float64), or None."""
    if given.result_dtype is None or precision in (None, "default"):
        return None
    return (f"precision={precision!r} does not apply to integer operands: summa "
            "multiplies them exactly in float64")


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
    be.prepare(plan.precision, plan.dtype)  # (where it was not planned here: a Matmul's)
    compiled = be.compile_seconds()  # its own figure, not the product's
    host = operands  # off the root: as passed (the pool's workers hold the arrays on every rank)
    if given is not None and not plan.placement.resident:
        host = ArrayOperands(*given.host_arrays(be), operands.root)
    if not plan.placement.resident:  # the plan of the arrays as they lie: its memory is drawn
        host = _as_arrays(host)
        plan = _stored(plan, _storage(host, plan.trans, pgrid.comm), pgrid.comm, be)
    if pgrid is not None:  # a product the machine's free memory cannot take: refused first
        check_host_room(_own_host_bytes(plan, pgrid, given, operands.root), pgrid.comm)
    with Account.of(plan, be, result=_root_copies(plan, pgrid, operands.root)).drawing(
            None if pgrid is None else pgrid.comm) as account:
        if plan.placement.resident:
            c = run_on_device(plan, be, given, alpha, stats)
        else:
            c = run_arrays(plan, pgrid, be, host, alpha, stats, called)
    if stats is not None:
        stats.extra["compile_seconds"] = compiled
        stats.extra.update(account.report())
    return c if given is None else given.give_back(c, be)


def _check_budget(given, request: PlanRequest) -> None:
    """Refuse a `request`'s device budget no out-of-core plan of the
    operands `given` can take (:func:`summa.planning.least.check_least_budget`;
    a floor by their least dimension and item), before the backend starts."""
    arrays = [x.array for x in (given.a, given.b)]
    k = min(min(x.shape, default=0) for x in arrays)
    check_least_budget((k, k, k), min(x.dtype.itemsize for x in arrays), request.device_memory,
                       request.panel_width, request.out_of_core, request.schedule)


def _own_host_bytes(plan, pgrid, given, root: int) -> int:
    """Host bytes this rank takes for itself beside the caller's arrays:
    its staging buffers, and on the root the product where it is made
    anew (no `out` written in place) or gathered with the scatter's copies
    (:func:`_root_copies`). Blocks the other ranks receive are left out:
    the pool's workers may read the caller's arrays in place."""
    own = int(plan.memory.staging_bytes or 0)
    if given is None:
        return own
    (m, n, _), item = plan.shape, np.dtype(plan.dtype).itemsize
    made = 0 if given.out is not None and given.out_in_place else m * n * item
    return own + max(_root_copies(plan, pgrid, root), made)


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
        # (an out it cannot write into where it lies is filled after: Operands.give_back)
        c = given.out.array if given.out is not None and given.out_in_place else \
            be.xp.empty((m, n), dtype)
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


def _stored(plan, storage: tuple, comm=None, be=None):
    """`plan` for operands lying as `storage` says (:func:`_storage`), their
    op H conjugated by the GEMMs. A plan made for arrays that lay otherwise
    has its memory planned again for these on the ranks of `comm` with
    their backend `be` (:func:`summa.planning.planner.restore`; collective,
    as the storage is the same on every rank), else runs them as they lie."""
    conj = tuple(conjugated(t, plan.dtype) for t in plan.trans)
    if (tuple(plan.storage), tuple(plan.conj)) == (storage, conj):
        return plan
    machine = Machine.live(comm, be) if comm is not None and storage != tuple(plan.storage) \
        else None
    return replace(restore(plan, storage, machine), conj=conj)


def _storage(operands: ArrayOperands, trans: tuple, comm) -> tuple:
    """How op(A) and op(B) of the root's `operands` lie
    (:func:`summa.host.storage.storage_of`), on every rank; collective."""
    storage = None
    if comm.Get_rank() == operands.root:
        storage = tuple(storage_of(np.asarray(x), t)
                        for x, t in zip((operands.a, operands.b), trans))
    return comm.bcast(storage, root=operands.root)


def run_arrays(plan, pgrid, be, operands: ArrayOperands, alpha=1.0, stats=None,
               called: float | None = None):
    """Run `plan` (:func:`plan_arrays`) on NumPy `operands` over the grid
    `pgrid` it names: in memory (scattered onto the devices, gathered back),
    or host-resident (:func:`_host_blocks`, the out-of-core sweep);
    collective. `stats` (a SummaStats) receives this rank's timings and
    ``extra["plan"]``; `called`: when the call began (``perf_counter``),
    for its set-up time. Returns the product on the root (`out` where
    given), None elsewhere."""
    operands = _as_arrays(operands)
    a, b, out, root = operands.a, operands.b, operands.out, operands.root
    plan = _stored(plan, _storage(operands, plan.trans, pgrid.comm), pgrid.comm, be)
    if not plan.out_of_core:
        return _in_memory(plan, pgrid, be, operands, alpha, stats)
    A, B, C, own, c_node = _host_blocks(a, b, out, plan, pgrid, root, be)
    set_up = time.perf_counter() - (called or time.perf_counter())  # checks, plan, blocks
    # beta 0: out's old values do not matter either
    job = _multiply_phase(plan, pgrid)
    result = run_out_of_core(plan, SweepOperands(A, B, C, own), be, alpha=alpha, fresh_c=True,
                             progress=job and job.step)
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


def _as_arrays(operands: ArrayOperands) -> ArrayOperands:
    """`operands` with array-likes as NumPy sees them (arrays, node-shared
    ones too, as they are)."""
    return replace(operands, **{name: np.asarray(x) for name, x in (
        ("a", operands.a), ("b", operands.b)) if x is not None and not isinstance(x, np.ndarray)})


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
    # panels copied as the plan counted them, whatever these arrays' layout
    # (a Matmul planned for others): no scratch beyond its memory
    job = _multiply_phase(plan, pgrid)
    result = run_in_memory(plan, A, B, C, alpha=alpha, conj=(conj_a, conj_b),
                           progress=job and job.step)
    if stats is not None:  # a pass over C where it lies: matmul warns of NaN/Inf by it
        finite = pgrid.comm.allreduce(be.all_finite(c), op=MPI.LAND)
        stats.__dict__.update(result.__dict__)
        stats.extra.update(plan=plan.as_dict(), product_finite=finite)
    if one and not be.is_gpu:
        return c
    return C.gather(root=root, out=operands.out)


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
