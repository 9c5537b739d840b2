"""One product of arrays held on one rank, as the caller passed them:
the operands (:class:`ArrayOperands`: 1-D operands, lazy conjugates and a
Fortran-ordered `out` taken as summa takes them), the pool of ranks they
run on (:func:`pooled_size`), their description and Plan
(:func:`plan_arrays`: :mod:`summa.api.operands` describes them, the planner
of arrays, :func:`summa.planning.arrays.plan_held`, checks and plans), and
their run (:func:`run_planned`: the arrays the executors of
:mod:`summa.execution.arrays` take, the product given back as the
caller's kind). :func:`summa.api.multiply.matmul_arrays` plans and runs
each call; :class:`summa.Matmul` plans once and runs many times."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..runtime.mpi import MPI
from ..runtime.agree import Failure
from .. import options as settings
from .. import pool
from ..planning.arrays import HeldArrays, plan_held
from ..planning.request import PlanRequest
from ..planning.checks import is_array
from .arrayview import unconjugated
from .operands import describe
from .promotion import common_type, promoted
from ..device.traits import traits
from ..execution.arrays import run_held
from ..planning.least import check_least_budget

__all__ = ["ArrayOperands", "plan_arrays", "run_planned", "held_arrays", "pooled_size",
           "ndim_of", "vector_result"]


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
    operands = operands.described(keep_integers=True)  # (one process: raised here)
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

    def described(self, keep_integers: bool = False) -> "ArrayOperands":
        """These operands with :attr:`given` (:func:`summa.api.operands.describe`,
        operands of two dtypes in their common one,
        :func:`summa.api.promotion.promoted`, integers in host memory kept as
        they lie where `keep_integers`; raising their ValueError); call it on
        the root."""
        return self if self.given is not None else replace(
            self, given=promoted(describe(self.a, self.b, self.out), keep_integers))

    def unconjugated(self, trans: tuple) -> tuple:
        """``(operands, (trans_a, trans_b))``: these, a lazy conjugate among
        `a` and `b` (torch's conjugate bit) read as its data lie and its
        conjugation moved into `trans`, the ops asked
        (:func:`summa.api.arrayview.unconjugated`); the ops as given,
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


def plan_arrays(operands: ArrayOperands, comm, request: PlanRequest = PlanRequest(),
                backend="auto", topology=None):
    """Describe the root's `operands` (:meth:`ArrayOperands.described`), then
    check and plan their product (:func:`summa.planning.arrays.plan_held`:
    host-held, or where they lie on a GPU); collective. On one rank the
    backend binds the GPU the operands lie on. `request`
    (:class:`summa.planning.arrays.PlanRequest`), `backend` and `topology`
    as for :func:`summa.api.multiply.matmul_arrays`.

    Returns
    -------
    (Backend, Plan, ArrayOperands)
        The rank's backend, the Plan (the same on every rank), and
        `operands` described on the root.
    """
    given = None
    if comm.Get_rank() == operands.root:
        try:
            # integers kept as they lie where only this rank would convert them
            operands = operands.described(keep_integers=comm.Get_size() == 1)
            _check_budget(operands.given, request)
            given = operands.given
        except Exception as exc:  # noqa: BLE001 -- raised on every rank by the planner
            given = Failure.of(exc)
    be, plan = plan_held(given, comm, operands.root, request, backend, topology)
    return be, plan, operands


def held_arrays(operands: ArrayOperands, plan, be) -> HeldArrays:
    """The arrays the executors of `plan` take of `operands` described on
    the root (:func:`plan_arrays`): for a resident plan the arrays where
    they lie (`out` where the product is written into it there); else host
    arrays, operands on a GPU copied to host memory first
    (:meth:`summa.api.operands.Operands.host_arrays`), integers as they lie
    where the plan converts them as it stages them (``plan.host_integers``:
    `out` a new array of their product's type); off the root, as
    passed (the pool's workers hold the arrays on every rank)."""
    given, root = operands.given, operands.root
    if given is None:
        return HeldArrays(operands.a, operands.b, operands.out, root)
    if plan.placement.resident:
        out = given.out.array if given.out is not None and given.out_in_place else None
        return HeldArrays(given.a.array, given.b.array, out, root)
    if given.kept_integers and plan.host_integers:  # converted as they are staged,
        a, b, _ = given.host_arrays(be, as_they_lie=True)  # C as its chunks drain
        return HeldArrays(a, b, np.empty(tuple(plan.shape[:2]), given.result_dtype), root)
    return HeldArrays(*given.host_arrays(be), root)


def run_planned(plan, pgrid, be, operands: ArrayOperands, alpha=1.0, stats=None,
                called: float | None = None, again=None):
    """Run `plan` on `operands` described on the root (:func:`plan_arrays`):
    the arrays the executors take (:func:`held_arrays`), the plan made
    final for them and run (:func:`summa.execution.arrays.run_held`: one
    GEMM where they lie, resident plans, `pgrid` None; else over the grid
    `pgrid` from host memory); collective. `again`: the caller's planner of
    these operands (``again() -> Plan``, with the memory free then), where a
    run on one rank that found the GPU short of room may be planned again
    and run once more. Returns the product on the root as the caller's kind
    of array (:meth:`summa.api.operands.Operands.give_back`), None
    elsewhere."""
    def replanned():  # (the arrays the new Plan takes: where they lie, or in host memory)
        new = again()
        return new, held_arrays(operands, new, be)
    c = run_held(plan, pgrid, be, held_arrays(operands, plan, be), alpha, stats, called,
                 replanned if again is not None else None)
    return c if operands.given is None else operands.given.give_back(c, be)


def _check_budget(given, request: PlanRequest) -> None:
    """Refuse a `request`'s device budget no out-of-core plan of the
    operands `given` can take (:func:`summa.planning.least.check_least_budget`;
    a floor by their least dimension and item), before the backend starts."""
    arrays = [x.array for x in (given.a, given.b)]
    k = min(min(x.shape, default=0) for x in arrays)
    item = 8 if given.kept_integers else min(x.dtype.itemsize for x in arrays)  # (float64)
    check_least_budget((k, k, k), item, request)
