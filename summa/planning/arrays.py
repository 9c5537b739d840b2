"""The Plan of a product of arrays held on one rank, made before it runs.

What a call asks (:class:`summa.planning.request.PlanRequest`, re-exported
here), the arrays as the executors take
them (:class:`HeldArrays`), their check and first Plan (:func:`plan_held`:
the backend, the checks of :mod:`summa.planning.checks`, then
:func:`summa.planning.make_plan`), and the final Plan for the arrays as
they lie (:func:`stored_plan`: a Plan made for arrays of another layout
has its memory planned again for these). Asked alike by ``summa.matmul``
and :class:`summa.Matmul` (:mod:`summa.api.planned`, over the operands it
described) and by the pool's workers (:mod:`summa.pool.worker`, over the
shared arrays they attached): the executors
(:mod:`summa.execution.arrays`) then run the Plan and decide nothing."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..device.backend import get_backend
from ..device.traits import traits
from ..distribution.grid import node_rank
from ..distribution.layout import Layout
from ..host.storage import conjugated, storage_of
from ..runtime.agree import Failure, collectively, from_root
from .checks import check_arrays, precision_refusal
from .distributed import settled_plan
from .plan import Machine, Placement
from .planner import make_plan, restore
from .request import PlanRequest

__all__ = ["PlanRequest", "HeldArrays", "plan_held", "stored_plan", "settled_on_grid",
           "array_storage"]


@dataclass(frozen=True)
class HeldArrays:
    """The arrays of one product as its executor takes them, held on rank
    `root` (None elsewhere; the pool's workers hold them on every rank).

    For a plan over a grid, NumPy arrays in host memory (`out`: where the
    product is written in place, else None); for a resident plan (one GEMM
    where they lie), CuPy arrays on its GPU, a host one of a mixed pair
    among them. As the planner reads them (:func:`plan_held`) they are
    described as host arrays whose `out` is written where it lies
    (:class:`summa.api.operands.Operands` describes the caller's own)."""

    a: object
    b: object
    out: object = None
    root: int = 0

    @property
    def arrays(self) -> tuple:
        return self.a, self.b, self.out

    @property
    def placement(self) -> Placement:
        return Placement()

    out_in_place = True
    result_dtype = None

    def host_arrays(self, backend=None, as_they_lie: bool = False) -> tuple:
        return self.a, self.b, self.out


def plan_held(given, comm, root: int = 0, request: PlanRequest = PlanRequest(),
              backend="auto", topology=None) -> tuple:
    """Check the root's operands and plan their product
    (:func:`summa.planning.make_plan`, host-held, or where they lie on a
    GPU, :class:`summa.planning.plan.Placement`); collective. On one
    rank the backend binds the GPU the operands lie on.

    Parameters
    ----------
    given : object
        On rank `root`: the operands described, as
        :class:`summa.api.operands.Operands` describes them (``arrays``,
        ``placement``, ``out_in_place``, ``result_dtype`` and
        ``host_arrays(backend)``; :class:`HeldArrays` for NumPy arrays), or
        the :class:`summa.runtime.agree.Failure` of describing them, raised
        on every rank; ignored elsewhere.
    request : PlanRequest
    backend, topology
        As for :func:`summa.api.multiply.matmul_arrays`.

    Returns
    -------
    (Backend, Plan)
        The rank's backend and the Plan, the same on every rank: for the
        arrays as they lie where they are host-held (:func:`stored_plan`).
    """
    trans_a, trans_b = str(request.trans_a).upper(), str(request.trans_b).upper()
    rank = comm.Get_rank()
    meta = given if rank == root and isinstance(given, Failure) else None
    meta = from_root(comm, root, meta)  # bad input refused before the backend starts
    placed = given.placement if rank == root and meta is None else None
    local = placed.device if comm.Get_size() == 1 and placed is not None and \
        placed.device is not None else node_rank(comm, topology)[0]
    be = collectively(comm, get_backend, backend, local)
    if rank == root and meta is None:
        meta = check_arrays(*given.arrays, trans_a, trans_b, be, given.out_in_place,
                            given.result_dtype)
        if not isinstance(meta, str):
            meta = precision_refusal(given, request.precision) or \
                (*meta, placed, (trans_a, trans_b), _kept_integers(given))
    meta = from_root(comm, root, meta)
    if isinstance(meta, str):
        raise ValueError(meta)
    # the root's ops: a lazy conjugate it holds moved its conjugation there
    m, n, k, dtype, placement, trans, integers = meta

    def in_host() -> HeldArrays:  # on the root, the arrays as host arrays (as they lie:
        # only their layout is read here, integers are not converted for it)
        return HeldArrays(*given.host_arrays(be, as_they_lie=True), root) \
            if rank == root else HeldArrays(None, None, None, root)
    # host arrays are cut as they lie; GPU arrays fetched lie as they come to host memory
    held = placement is None or placement.where == "host"
    storage = array_storage(in_host(), trans, comm) if held else None
    # what first use compiles or allocates (fp64-int8's kernels, cuBLASLt's
    # workspace) is made before the free memory is read: the plan sees the rest
    be.prepare(request.precision, dtype)
    # (the nodes the grid will see: the copy threads share them)
    plan = make_plan((m, n, k), dtype, Machine.live(comm, be, topology),
                     replace(request, trans_a=trans[0], trans_b=trans[1]), host_held=True,
                     placement=placement, storage=storage or ("rows", "rows"))
    if plan.placement.where == "host":  # (GPU arrays that do not fit there: as fetched)
        plan = _for_storage(plan, storage or array_storage(in_host(), plan.trans, comm))
    return be, with_integers(plan, integers)


def _kept_integers(given) -> tuple | None:
    """``(a's, b's, the product's)`` dtype names of integer operands `given`
    keeps in host memory as they lie
    (:attr:`summa.api.operands.Operands.kept_integers`), else None."""
    if not getattr(given, "kept_integers", False):
        return None
    return (given.a.array.dtype.name, given.b.array.dtype.name,
            np.dtype(given.result_dtype).name)


def with_integers(plan, integers: tuple | None):
    """`plan` recording the integer operands `integers` (:func:`_kept_integers`)
    as converted inside the host copies (:attr:`summa.planning.plan.Plan.host_integers`)
    where it stages them: out of core on one GPU rank, the operands in host
    memory (the sweep's uploads and write-backs go through the page-locked
    chunks, :class:`summa.device.staging.Stager`). Elsewhere `plan` as it
    is: the operands are converted whole first (their host copies are
    NumPy's own, or scattered to other ranks in float64)."""
    stages = plan.out_of_core and traits(plan.backend).gpu and plan.ranks == 1 and \
        plan.placement.where == "host"
    return replace(plan, host_integers=tuple(integers)) if integers and stages else plan


def stored_plan(plan, held: HeldArrays, comm, backend):
    """The Plan the executors run on the host arrays `held`: `plan` where it
    was made for arrays lying as these do, else its memory planned again
    for them on the ranks of `comm` with their `backend`
    (:func:`summa.planning.planner.restore`; a :class:`summa.Matmul`
    planned for arrays of one layout and given another's). Collective: the
    root reads how they lie (:func:`array_storage`)."""
    return _for_storage(plan, array_storage(held, plan.trans, comm), comm, backend)


def settled_on_grid(plan, grid, backend, panels_of_a=None) -> tuple:
    """``(plan, measured)``: an in-memory `plan` of host-held arrays on
    the process grid `grid` with what its operands' blocks decide settled
    before anything moves (:func:`summa.planning.distributed.settled_plan`):
    an ``"auto"`` panel width measured (`measured`: in this call; A's
    panels formed by `panels_of_a`) and whether ``auto`` copies directly.
    The blocks are those the in-memory executor scatters
    (:func:`summa.host.blocks.stored_operand`: op(A), op(B) and C by the
    grid's default layout, in the plan's dtype), read by their shapes
    alone. `plan` itself, nothing measured, where it runs out of core or
    one GEMM where the operands lie (no grid). Collective over `grid`
    where it measures or decides: the same point on every rank."""
    if plan.out_of_core or plan.placement.resident:
        return plan, False
    (m, n, k), dtype = plan.shape, np.dtype(plan.dtype)
    A, B, C = (_Laid(Layout(shape, grid.shape), dtype, grid, backend)
               for shape in ((m, k), (k, n), (m, n)))
    return settled_plan(plan, A, B, C, panels_of_a)


@dataclass(frozen=True)
class _Block:
    """A block's shape and dtype, no data: what the planner reads of it."""

    shape: tuple
    dtype: np.dtype

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape)) * self.dtype.itemsize


class _Laid:
    """An operand as the in-memory executor will lay it on `grid` (its
    `layout`, this rank's block of `dtype` on `backend`), described for the
    planner before it is scattered: what a DistMatrix tells of itself but
    its values."""

    def __init__(self, layout: Layout, dtype, grid, backend):
        self.layout, self.grid, self.backend = layout, grid, backend
        self.local = _Block(layout.local_shape(grid.row, grid.col), np.dtype(dtype))

    @property
    def shape(self) -> tuple:
        return self.layout.shape

    @property
    def dtype(self) -> np.dtype:
        return self.local.dtype


def _for_storage(plan, storage: tuple, comm=None, be=None):
    """`plan` for operands lying as `storage` says (:func:`array_storage`),
    their op H conjugated by the GEMMs. A plan made for arrays that lay
    otherwise has its memory planned again for these on the ranks of `comm`
    with their backend `be` (:func:`summa.planning.planner.restore`;
    collective, as the storage is the same on every rank), else runs them
    as they lie."""
    conj = tuple(conjugated(t, plan.dtype) for t in plan.trans)
    if (tuple(plan.storage), tuple(plan.conj)) == (storage, conj):
        return plan
    machine = Machine.live(comm, be) if comm is not None and storage != tuple(plan.storage) \
        else None
    return replace(restore(plan, storage, machine), conj=conj)


def array_storage(held: HeldArrays, trans: tuple, comm) -> tuple:
    """How op(A) and op(B) of the root's `held` arrays lie
    (:func:`summa.host.storage.storage_of`), on every rank; collective."""
    storage = None
    if comm.Get_rank() == held.root:
        storage = tuple(storage_of(np.asarray(x), t) for x, t in zip((held.a, held.b), trans))
    return comm.bcast(storage, root=held.root)

