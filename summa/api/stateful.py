"""A multiply planned once and executed many times (:class:`Matmul`), as
nvmath-python's stateful ``Matmul`` and FFTW's plans do: the checks, the
Plan and the process grid (with the broadcasters it keeps) are made once;
each :meth:`Matmul.execute` only moves blocks and multiplies. In a plain
Python process that summa.matmul would run on its pool of workers, the
Matmul lives in them (:class:`summa.pool.PooledMatmul`)."""

from __future__ import annotations

import time
import warnings
from dataclasses import replace

import numpy as np

from ..runtime.mpi import MPI
from ..execution.algorithm import SummaStats
from ..execution.arrays import ArrayProduct
from ..runtime.agree import Failure, from_root
from ..planning.request import PlanRequest
from ..planning.checks import check_arrays, precision_refusal
from .planned import ArrayOperands, plan_arrays, pooled_size, run_planned, vector_result
from .operands import kept_device
from ..execution.jobprogress import library_reporting
from ..precision.ozaki_gpu import check_moduli
from ..planning.precision import asked_moduli
from .. import pool

__all__ = ["Matmul"]

#: Options Matmul takes beside its own arguments (as summa.matmul on arrays).
OPTIONS = ("alpha", "trans_a", "trans_b", "panel_width", "lookahead", "broadcaster",
           "precision", "moduli", "schedule")


class Matmul:
    """``alpha * op(a) @ op(b)`` of arrays held on rank `root`, planned
    once and executed many times; collective over `comm`.

    Construction checks the operands and plans the product
    (:func:`summa.planning.make_plan`: grid, in memory or host-resident,
    panel width, device budget and tiles, precision) and makes the process
    grid. :meth:`execute` multiplies the operands given then (or new ones
    of the same shape and dtype) by that Plan: later calls reuse the grid,
    its communicators and broadcasters (NCCL, CUDA IPC: made on the first
    call), the ranks' page-locked staging rings and the device memory
    pool; the blocks are placed again each call, since the arrays' values
    may have changed. :meth:`free` (or leaving a ``with`` block) releases
    the grid and what it holds.

    Where :func:`summa.matmul` would run on the pool of worker ranks
    (:mod:`summa.pool`: a plain Python process, no `comm`, host operands, a
    pool of more than one from `gpus`/`workers`, ``SUMMA_GPUS``/
    ``SUMMA_WORKERS`` or the GPUs seen), so does this: the workers make the
    Matmul (the Plan, the grid and all it holds) and keep it between
    executions; :attr:`plan` is the Plan they made and run. Each execution
    ships the operands to them as summa.matmul does and returns the
    product as it does. :meth:`free` frees it in the workers; one dropped
    unfreed is freed there before their next command, and all are when the
    pool stops or this process ends. A pool that stopped since (a worker
    failed) has the Matmul made again, with the operands given here, on
    its next execution (where the new pool plans it otherwise, on GPUs with
    other free memory, it runs the new plan, with a RuntimeWarning).
    Elsewhere it runs on the ranks of `comm` (default COMM_WORLD, or this
    process alone). Operands on a GPU
    on one rank plan one GEMM there (:func:`summa.api.multiply.matmul_arrays`);
    the operands of each execution must then lie on that GPU too.

    Parameters
    ----------
    a, b : array
        On `root`, None elsewhere: any kind :func:`summa.matmul` takes.
    comm, root, grid, backend, out_of_core, device_memory, gpus, workers, topology, **options
        As for :func:`summa.api.multiply.matmul_arrays` (options: ``alpha``,
        ``trans_a``, ``trans_b``, ``panel_width``, ``lookahead``,
        ``broadcaster``, ``precision``, ``moduli``, ``schedule``).

    Attributes
    ----------
    plan : summa.planning.Plan
        Every decision the executions follow; ``print(m.plan)`` shows it.
    stats : SummaStats or None
        This rank's timings of the last :meth:`execute` (on the pool: rank
        0's record, as summa.matmul's ``stats``).

    Raises
    ------
    ValueError
        Operands that cannot be multiplied, as :func:`summa.matmul` says
        (on the pool: before the workers are asked), or a plan that cannot
        be made (on the pool: the workers', the pool then stopped); the
        same on every rank.
    summa.pool.WorkerError
        On the pool: a worker that failed (:meth:`execute` too).

    Examples
    --------
    >>> with summa.Matmul(a, b, device_memory="16GiB") as m:  # doctest: +SKIP
    ...     print(m.plan)
    ...     c = m.execute()
    ...     c2 = m.execute(a2, b2)  # same shapes: the same plan and grid
    """

    def __init__(self, a, b, comm: MPI.Comm | None = None, root: int = 0, grid=None,
                 backend="auto", out_of_core=None, device_memory=None, gpus=None,
                 workers=None, topology=None, **options):
        unknown = sorted(set(options) - set(OPTIONS))
        if unknown:
            raise TypeError(f"Matmul got unexpected keyword argument(s) {', '.join(unknown)}")
        self._comm = MPI.COMM_WORLD if comm is None else comm
        self._product = self._pooled = None  # (an ArrayProduct here, or the pool's)
        self._root = root
        self.stats = None
        self._moduli = check_moduli(options.get("moduli"), options.get("precision"))
        # the ops asked, before a lazy conjugate's conjugation joins them
        self._asked = tuple(str(options.pop(f"trans_{x}", "N")).upper() for x in "ab")
        # (1-D operands as NumPy's matmul takes them: their products drop a dimension)
        operands, (options["trans_a"], options["trans_b"]), self._vectors = \
            ArrayOperands(a, b, None, root).taken(self._asked)
        size, operands = pooled_size(operands, comm, gpus, workers, backend)
        request = dict(grid=grid, out_of_core=out_of_core, device_memory=device_memory)
        if size > 1:
            self._open_pooled(operands, size, dict(options, backend=backend, **request))
            return
        options.pop("moduli", None)
        self._alpha = options.pop("alpha", 1.0)
        request = PlanRequest(**request, **options)
        with asked_moduli(self._moduli), kept_device():  # the plan counts their scratch
            self._backend, self.plan, self._operands = plan_arrays(
                operands, self._comm, request, backend, topology)
        # the Plan and its grid, kept; what planning again takes, where the
        # GPUs' free memory changes (execute)
        self._product = ArrayProduct(self.plan, self._backend, self._comm, root,
                                     (request, backend, topology))
        grid = self._product.grid
        if grid.core_note and grid.rank == 0:
            warnings.warn(grid.core_note, RuntimeWarning, stacklevel=2)

    def _open_pooled(self, operands: ArrayOperands, size: int, options: dict) -> None:
        """Have the pool's `size` workers make this Matmul of the described
        `operands` with `options` (:class:`summa.pool.PooledMatmul`)."""
        host_a, host_b, _ = operands.given.host_arrays()
        self._operands = operands
        self._backend = pool.dtype_checker(options["backend"])  # the owner's checks of dtypes
        self._pooled = pool.PooledMatmul(host_a, host_b, size, **options)
        self.plan = self._pooled.plan

    @property
    def _freed(self) -> bool:
        """Was this Matmul freed (no grid here, none kept in the pool)?"""
        return self._product is None and self._pooled is None

    def execute(self, a=None, b=None, out=None):
        """The product of the operands given at construction, or of `a` and
        `b` (both, on the root: of the planned shapes and dtype), into `out`
        where given (on the root); collective. Returns it on the root, None
        elsewhere (on the pool: as summa.matmul returns it)."""
        if self._freed:
            raise RuntimeError("this Matmul was freed")
        called = time.perf_counter()
        if a is None and b is None:
            if self._operands is None:
                raise ValueError("this Matmul let go of its operands (drop_operands): "
                                 "pass a and b")
            operands, trans, vectors = replace(self._operands, out=out, given=None).taken(
                self.plan.trans, self._vectors)
        else:  # (one of a and b alone: refused there, on every rank)
            operands, trans, vectors = ArrayOperands(a, b, out, self._root).taken(self._asked)
        operands = self._checked(operands, tuple(trans))
        stats = SummaStats()
        if self._pooled is not None:
            c = self._execute_pooled(operands, stats)
        else:
            with asked_moduli(self._moduli), kept_device(), library_reporting(self._comm, self.plan):
                self._fitted(operands)
                c = run_planned(self.plan, self._product.grid, self._backend, operands,
                                self._alpha, stats, called, lambda: self._replanned(operands))
            self.stats = stats
        return vector_result(c, vectors, out)

    def _execute_pooled(self, operands: ArrayOperands, stats: SummaStats):
        """:meth:`execute` of checked `operands` by the pool's workers."""
        host_a, host_b, host_out = operands.given.host_arrays()
        c = self._pooled.execute(host_a, host_b, host_out, stats)
        # (made again where the pool started anew: the Plan the workers run)
        self.plan, self.stats = self._pooled.plan, stats
        return operands.given.give_back(c)

    def _fitted(self, operands: ArrayOperands) -> None:
        """Plan again, with a RuntimeWarning, where the GPUs' free memory no
        longer holds the plan (:meth:`summa.execution.arrays.ArrayProduct.fitted`:
        the memory free is read at each execution); where nothing fits,
        planning's own one-line ValueError. Collective."""
        note = self._product.fitted(operands.given)
        self.plan = self._product.plan
        if note is not None:
            warnings.warn(note, RuntimeWarning, stacklevel=3)

    def _replanned(self, operands: ArrayOperands):
        """The Plan made again for `operands` with the memory free now, kept
        for the executions that follow (a run that found the GPU short of
        room: :meth:`summa.execution.arrays.ArrayProduct.replanned`).
        Collective."""
        self.plan = self._product.replanned(operands.given)
        return self.plan

    def _checked(self, operands: ArrayOperands, trans: tuple) -> ArrayOperands:
        """`operands` described on the root; refused, on every rank, where the
        plan does not fit them, their ops `trans` (a lazy conjugate's
        conjugation among them) or their `out` (or where it is one GEMM on
        a GPU, they lie elsewhere)."""
        comm, meta = self._comm, None
        if comm.Get_rank() == self._root:
            try:
                # integers kept as they lie where the plan converts them as it stages them
                operands = operands.described(keep_integers=bool(self.plan.host_integers))
                meta = self._fits(operands.given, trans)
            except Exception as exc:  # noqa: BLE001 -- raised on every rank below
                meta = Failure.of(exc)
        meta = from_root(comm, self._root, meta)
        if isinstance(meta, str):
            raise ValueError(meta)
        return operands

    def _fits(self, given, trans: tuple) -> str | None:
        """Why the plan does not fit the described operands `given`, their
        ops `trans`, (None: it does)."""
        plan = self.plan
        meta = check_arrays(*given.arrays, *plan.trans, self._backend, given.out_in_place,
                            given.result_dtype)
        if isinstance(meta, str):
            return meta
        refusal = precision_refusal(given, plan.precision)
        if refusal:
            return f"{refusal}; this Matmul was planned with it: make one for these operands"
        if trans != tuple(plan.trans):
            return ("a lazily conjugated operand (a torch tensor with its conjugate bit set) "
                    "stands where this Matmul planned a plain one, or the reverse: the ops "
                    f"differ ({'/'.join(trans)} against {'/'.join(plan.trans)}); make a "
                    "Matmul for these operands")
        if (tuple(meta[:3]), np.dtype(meta[3]).name) != (tuple(plan.shape), plan.dtype):
            return (f"the operands make a {meta[0]}x{meta[1]}x{meta[2]} "
                    f"{np.dtype(meta[3]).name} product, but this Matmul planned "
                    f"{'x'.join(map(str, plan.shape))} {plan.dtype}")
        placed, planned = given.placement, plan.placement
        if planned.resident and (placed.where, placed.device) != (planned.where,
                                                                   planned.device):
            return (f"this Matmul planned one GEMM on GPU {planned.device} for operands "
                    f"lying {_where(planned)}; these lie {_where(placed)}")
        return None

    def drop_operands(self) -> None:
        """Let go of the operands given at construction: :meth:`execute`
        then needs `a` and `b`. The pool's workers do (their owner ships the
        operands with each execution)."""
        self._operands = None

    def free(self) -> None:
        """Release the grid, its communicators and broadcasters (safe
        twice); on the pool, in the workers, waiting for them."""
        if self._pooled is not None:
            pooled, self._pooled = self._pooled, None
            pooled.free()
        if self._product is not None:
            product, self._product = self._product, None
            product.free()

    def __enter__(self) -> "Matmul":
        return self

    def __exit__(self, *exc) -> None:
        self.free()

    def __repr__(self) -> str:
        m, n, k = self.plan.shape
        return (f"Matmul({m}x{n}x{k} {self.plan.dtype}, grid {self.plan.grid[0]}x"
                f"{self.plan.grid[1]}, {'out of core' if self.plan.out_of_core else 'in memory'}"
                f"{', freed' if self._freed else ''})")


def _where(placement) -> str:
    """Where a :class:`summa.planning.plan.Placement`'s operands lie, in words."""
    if placement.where == "host":
        return "in host memory"
    if placement.where == "mixed":
        return f"one on GPU {placement.device}, one in host memory"
    return f"on GPU {placement.device}"
