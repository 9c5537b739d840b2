"""One planner: every decision a multiply makes before it moves data, made
once by :func:`make_plan` and kept in a frozen, printable :class:`Plan`.

The grid, in memory or out of core, the panel width, the device budget and
its C tiles, precision and moduli are decided here and nowhere else on the
paths that take a Plan: the out-of-core sweep (:func:`summa.execution.outofcore.run_out_of_core`)
runs the Plan's :class:`summa.planning.memory.MemoryPlan` as it is, and ``summa plan``
prints the Plan a run on that machine would take. Where the machine is this
one (:meth:`Machine.live`) the plan asks the devices for their free memory and
checks the nodes' host memory (collective); where it is described by figures
(``summa plan`` planning for another machine) nothing is asked.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

import numpy as np
from mpi4py import MPI

from ..precision import ozaki_gpu
from ..distribution.grid import check_grid_ranks, grid_for, parse_grid
from .memory import (FP64_INT8_TAIL_SMALLEST, HEAD_FIRST, TAIL_SMALLEST, Execution, MemoryPlan,
                     check_host_memory, check_memory, memory_plan, parse_bytes, resident_plan)
from ..host.storage import transposed
from ..execution.strips import check_schedule
from .tuning import default_panel_width
from ..device import staging
from ..device.traits import traits
from ..distribution.topology import topology_of
from .. import options

__all__ = ["Machine", "Placement", "Plan", "make_plan", "restage", "host_traffic"]

#: Share of the free device memory an out-of-core plan takes where no
#: budget is given (the rest: the memory pool's rounding, library workspaces).
FREE_SHARE = 0.9
#: Out-of-core "device" budget of the NumPy backend (tests: tiles still cut).
NUMPY_BUDGET = 1 << 30


@dataclass(frozen=True)
class Machine:
    """What :func:`make_plan` knows of where the multiply runs.

    Attributes
    ----------
    backend : str
        ``"cupy"`` (GPUs) or ``"numpy"``.
    ranks : int
        Ranks that will multiply.
    free_device : int, optional
        Bytes free on each rank's device, where known without asking (a
        machine planned from afar); None: unknown, nothing checked against it.
    ranks_on_node : int, optional
        Ranks on this rank's node, which share its cores (the host copy
        threads divide them: :func:`summa.device.staging.copy_threads`);
        None: all `ranks` on one node, as a machine planned from afar is
        taken to be (``summa plan`` plans its broadcasts so too).
    comm, device : MPI.Comm and Backend, optional
        This machine (:meth:`live`): its ranks and their device, asked for
        their free memory and checked against the nodes' host memory.
    """

    backend: str = "numpy"
    ranks: int = 1
    free_device: int | None = None
    ranks_on_node: int | None = None
    comm: object = field(default=None, compare=False, repr=False)
    device: object = field(default=None, compare=False, repr=False)

    @classmethod
    def live(cls, comm, device, topology=None) -> "Machine":
        """The ranks of `comm` with their `device` (a Backend), their nodes
        as `topology` says (:class:`summa.distribution.topology.Topology`;
        default the one of `comm`, detected on a communicator's first use:
        collective then), as the process grid of the run will see them."""
        nodes = topology or topology_of(comm)
        return cls(device.name, comm.Get_size(), ranks_on_node=nodes.local_size, comm=comm,
                   device=device)

    @property
    def node_ranks(self) -> int:
        """Ranks sharing this rank's node (:attr:`ranks_on_node`, else all)."""
        return self.ranks_on_node or self.ranks


@dataclass(frozen=True)
class Placement:
    """Where the operands of a product lie when it is called, as the
    planner weighs them (:attr:`summa.api.operands.Operands.placement`), and in
    a Plan, whether the multiply reads them there.

    Attributes
    ----------
    where : str
        ``"host"`` (host memory), ``"device"`` (both on one GPU) or
        ``"mixed"`` (one on a GPU, the other in host memory).
    device : int or None
        The CUDA device the operands on a GPU lie on.
    held : int
        Bytes of the operands on the GPU: they count against a
        ``device_memory`` cap.
    copies : int
        Device bytes the GEMM needs for operands beside them: a host
        operand uploaded (mixed), one whose layout cuBLAS cannot read as it
        is (neither rows nor columns contiguous) copied.
    into_out : bool
        The product goes into the caller's array there (``out=``): no new C.
    fetched : bool
        In a Plan: the operands on the GPU are copied to host memory and the
        host plan runs (:attr:`Plan.note` says why); False where the multiply
        is one GEMM where they lie (:attr:`resident`).
    """

    where: str = "host"
    device: int | None = None
    held: int = 0
    copies: int = 0
    into_out: bool = False
    fetched: bool = False

    @property
    def resident(self) -> bool:
        """Is the multiply one GEMM on the GPU where the operands lie?"""
        return self.where != "host" and not self.fetched

    def __str__(self) -> str:
        if self.where == "host":
            return "operands in host memory"
        which = "operands" if self.where == "device" else "one operand (the other uploaded)"
        how = "copied to host memory first" if self.fetched else "multiplied there in one GEMM"
        return f"{which} on GPU {self.device}, {how}"


@dataclass(frozen=True)
class Plan:
    """Every decision of one multiply ``C = op(A) @ op(B)``, made before any
    data moves (:func:`make_plan`).

    Attributes
    ----------
    shape : tuple
        ``(m, n, k)`` of the product.
    dtype : str
        The compute dtype.
    backend : str
        Where the GEMMs run: ``"cupy"`` or ``"numpy"``.
    ranks : int
    grid : tuple
        ``(Pr, Pc)``.
    trans : tuple
        ``(op of A, op of B)``: ``"N"``, ``"T"`` or ``"H"``.
    schedule : str
        ``"panels"`` or ``"strips"``.
    out_of_core : bool
        A, B and C stay in host memory and C goes through the device in
        tiles (:mod:`summa.execution.outofcore`); else all on the device.
    panel_width : int or str
        The width every panel takes; ``"auto"``: measured when the in-memory
        multiply starts (:func:`summa.planning.tuning.auto_panel_width`).
    lookahead : int
    precision : str or None
    moduli : int or None
        fp64-int8: INT8 products per float64 panel product.
    device_budget : int or None
        Out of core: device bytes per rank the tiles were cut to.
    memory : MemoryPlan
        Peak bytes per rank, and out of core the tiles, panel slots and
        staging the sweep runs as they are.
    broadcaster : str
        The broadcaster asked for (``auto`` resolves when the grid is made).
    host_copies : str or None
        Out of core on GPUs: how host blocks that are not page-locked reach
        the device, ``"stage"`` or ``"lock"`` (as asked, else
        ``SUMMA_HOST_COPIES``: :func:`summa.execution.outofcore.summa_out_of_core`);
        None where nothing crosses a host link in tiles (CPUs, in memory).
    copy_threads : int or None
        Out of core on GPUs: host threads per rank that fill and drain the
        page-locked chunks of the host copies
        (:func:`summa.device.staging.copy_threads` of the ranks on a node,
        ``SUMMA_COPY_THREADS`` where set), whose ring
        ``memory.staging_bytes`` counts; of this rank, so the same on every
        rank where the nodes are alike. None where `host_copies` is.
    panel_sums : int or None
        fp64-int8 in memory on a grid: device bytes of the panel sums where
        this product may sum its panels' INT8 products (used where the
        device has them free when it starts); None where it cannot.
    placement : Placement
        Where the operands lie, and whether the multiply is one GEMM there
        (``placement.resident``: one rank, the operands on its GPU, no grid,
        no copy through host memory).
    storage : tuple
        ``(op(A)'s, op(B)'s)`` way of lying in host memory
        (:data:`summa.host.storage.STORAGES`): ``"rows"``, ``"cols"`` (read as
        its transpose's rows, taken by the GEMM as its transposed operand),
        or ``"strided rows"``/``"strided cols"`` (gathered by the host copy
        threads); the executors follow it and copy no operand whole.
    conj : tuple
        ``(A's, B's)``: do the GEMMs conjugate that operand
        (:meth:`summa.device.backend.Backend.gemm`: op H of a complex array handed
        over as it lies)? False where it comes conjugated (read so from a
        file, redistributed so) or op H does not conjugate (real dtypes).
    note : str or None
        Why the mode was chosen for the caller (in memory did not fit; GPU
        operands copied to host memory).
    predicted : dict or None
        The model's time (``make_plan(profile=...)``): ``seconds``,
        ``tflops``, ``profile`` (its path), ``shipped``, and for fp64-int8
        ``native_seconds`` and ``native_tflops``; or ``error``. Not compared.
    """

    shape: tuple
    dtype: str
    backend: str
    ranks: int
    grid: tuple
    trans: tuple
    schedule: str
    out_of_core: bool
    panel_width: object
    lookahead: int
    precision: str | None
    moduli: int | None
    device_budget: int | None
    memory: MemoryPlan
    broadcaster: str = "auto"
    host_copies: str | None = None
    copy_threads: int | None = None
    panel_sums: int | None = None
    placement: Placement = Placement()
    storage: tuple = ("rows", "rows")
    conj: tuple = (False, False)
    note: str | None = field(default=None, compare=False)
    predicted: dict | None = field(default=None, compare=False)

    def as_dict(self) -> dict:
        """The plan as JSON's values (tuples as lists): equal to what JSON
        gives back, so a recorded plan compares with a printed one."""
        return _plain(asdict(self))

    def __str__(self) -> str:
        return "\n".join(_lines(self))


def _plain(value):
    """`value` with its tuples made lists, all the way down."""
    if isinstance(value, dict):
        return {key: _plain(v) for key, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def make_plan(shape, dtype, machine: Machine, *, grid=None, trans_a: str = "N",
              trans_b: str = "N", host_held: bool = False, out_of_core=None,
              device_memory=None, panel_width=None, lookahead: int = 1,
              schedule: str = "panels", precision=None, moduli=None,
              broadcaster: str = "auto", staged: tuple = (False, False),
              host_copies=None, predict: bool = False, profile=None,
              placement: Placement | None = None) -> Plan:
    """Plan ``C = op(A) @ op(B)`` of `shape` ``(m, n, k)`` on `machine`.

    Collective over ``machine.comm`` where the machine is live
    (:meth:`Machine.live`); no communication otherwise.

    Parameters
    ----------
    grid : tuple or str, optional
        ``(Pr, Pc)``; default :func:`summa.distribution.grid.grid_for` for the shape.
    host_held : bool
        The operands lie in host memory (NumPy arrays): with `out_of_core`
        None they stay there on GPUs, or wherever `device_memory` caps the
        device (panels only); in memory they ignore `device_memory`.
    out_of_core : bool or None
        True: out of core; False: in memory (no fallback); None: out of core
        where `device_memory` is given, or on GPUs where the in-memory plan
        does not fit.
    device_memory : str or int, optional
        Device bytes per rank out of core ("16GiB"); default 90 % of the
        free memory (live GPUs, or ``machine.free_device``), 1 GiB on NumPy.
    panel_width : int, "auto" or None
        None: :func:`summa.planning.tuning.default_panel_width` for the mode.
    staged : tuple
        ``(row, column)``: whether that direction's broadcasts stage panels
        through buffers of their own (copy engines, ``ipc``); see
        :func:`restage` for the run, where the broadcasters are made later.
    host_copies : {"stage", "lock"}, optional
        Out of core on GPUs, how host blocks reach the devices
        (:attr:`Plan.host_copies`); default ``SUMMA_HOST_COPIES``. The plan
        also takes the threads that copy them (:attr:`Plan.copy_threads`),
        by the ranks on a node (:attr:`Machine.ranks_on_node`) and
        ``SUMMA_COPY_THREADS``.
    predict, profile : bool, str
        Fill :attr:`Plan.predicted` by the model profile at `profile`
        (default the one shipped with summa): the time, its split
        (:class:`summa.planning.model.TimeSplit`) and bound; for fp64-int8 also
        the time of float64's own plan of the same inputs.
    placement : Placement, optional
        Where the operands lie (default: host memory, as `host_held` says);
        on a GPU: one GEMM there where it fits (:func:`_resident`), else
        planned as host-held operands, the note saying why.

    Raises
    ------
    ValueError
        The same on every rank: a bad schedule, grid, moduli or
        host_copies, a plan that does not fit (in memory where out of core
        cannot be taken), a budget too small for any tile, a host too small
        for the plan.
    """
    (m, n, k), dtype, lookahead = (int(x) for x in shape), np.dtype(dtype), int(lookahead)
    moduli = ozaki_gpu.check_moduli(moduli, precision)
    copies = _host_copies(machine, host_copies)  # kept where the plan runs out of core
    grid = _grid(grid, machine, m, n, dtype, schedule)
    placement, fetched = placement or Placement(), None
    if placement.where != "host":
        check_schedule(schedule, grid)
        memory, fetched = _resident(machine, (m, n, k), dtype, (trans_a, trans_b), placement,
                                    (out_of_core, device_memory, precision))
        if memory is not None:
            return Plan((m, n, k), dtype.name, machine.backend, machine.ranks, grid,
                        (str(trans_a).upper(), str(trans_b).upper()), schedule, False,
                        max(k, 1), lookahead, precision, ozaki_gpu.moduli_for(max(k, 1), moduli)
                        if precision == "fp64-int8" else None, None, memory, broadcaster,
                        placement=placement)
        placement, host_held = replace(placement, fetched=True), True
    if host_held and out_of_core is None:
        out_of_core = schedule == "panels" and (traits(machine.backend).gpu
                                                or device_memory is not None)
    if host_held and out_of_core is False:
        device_memory = None  # arrays copied onto the devices take them whole
    check_schedule(schedule, grid, out_of_core=bool(out_of_core) or bool(device_memory))
    with ozaki_gpu.asked_moduli(moduli):  # the plans count their scratch
        memory, budget, note = _memory(machine, (m, n, k), dtype, grid, panel_width, lookahead,
                                       _MemoryAsk(out_of_core, device_memory, schedule,
                                                  precision, staged, copies[1]))
        ooc = budget is not None
        copies = copies if ooc else (None, None)
        width = _width(panel_width, machine.backend, dtype, precision, ooc, grid, schedule)
        if ooc and memory.chunk < min(width, k):  # a narrower one moves fewer bytes
            width = memory.chunk
        count = ozaki_gpu.moduli_for(width) if precision == "fp64-int8" and \
            isinstance(width, int) else None
    plan = Plan((m, n, k), dtype.name, machine.backend, machine.ranks, grid,
                (str(trans_a).upper(), str(trans_b).upper()), schedule, ooc, width, lookahead,
                precision, count, budget, memory, broadcaster, host_copies=copies[0],
                copy_threads=copies[1],
                panel_sums=_panel_sums(memory, dtype, grid, (m, n, k), width, precision,
                                       schedule),
                placement=placement, note="; ".join(x for x in (fetched, note) if x) or None)
    if not predict:
        return plan
    native = None
    if precision == "fp64-int8":  # is it worth it here? float64's own plan of the same inputs
        try:
            native = make_plan((m, n, k), dtype, machine, grid=grid, trans_a=trans_a,
                               trans_b=trans_b, host_held=host_held, out_of_core=out_of_core,
                               device_memory=device_memory, panel_width=panel_width,
                               lookahead=lookahead, schedule=schedule, broadcaster=broadcaster,
                               staged=staged, host_copies=host_copies, predict=True,
                               profile=profile)
        except ValueError:  # no float64 plan to set beside it
            pass
    return replace(plan, predicted=_predict(plan, profile, native))


def _resident(machine: Machine, shape, dtype, trans, placement: Placement, asked) -> tuple:
    """``(MemoryPlan, None)`` of one GEMM where the operands lie on a GPU
    (:func:`summa.planning.memory.resident_plan`), or ``(None, why they are copied to
    host memory instead)``; `asked` is ``(out_of_core, device_memory,
    precision)``. Asks nothing of other ranks (one rank)."""
    out_of_core, device_memory, precision = asked
    m, n, k = shape
    fetched = f"the operands on GPU {placement.device} are copied to host memory: "
    if machine.ranks > 1:
        return None, fetched + f"the multiply runs on {machine.ranks} ranks"
    if not traits(machine.backend).gpu:
        return None, fetched + f"the {machine.backend} backend multiplies in host memory"
    if out_of_core:
        return None, fetched + "out_of_core=True streams host-held operands"
    conjugated = sum(size for t, size in zip(trans, (m * k, k * n))
                     if str(t).upper() == "H" and dtype.kind == "c") * dtype.itemsize
    memory = resident_plan(m, n, k, dtype, precision, placement.copies + conjugated,
                           new_c=not placement.into_out)
    if device_memory:
        budget, need = parse_bytes(device_memory), memory.device_bytes + placement.held
        if need > budget:
            return None, fetched + (f"they and the product need {need / 2**30:.2f} GiB, more "
                                    f"than device_memory ({budget / 2**30:.2f} GiB)")
    free = machine.device.memory_free() if machine.device is not None else machine.free_device
    if free is not None and memory.device_bytes > free:
        return None, fetched + (f"the product needs {memory.device_bytes / 2**30:.2f} GiB "
                                f"there, {free / 2**30:.2f} GiB free")
    return memory, None


def _host_copies(machine: Machine, asked) -> tuple:
    """``(host copies, copy threads)`` of an out-of-core plan on `machine`:
    how host blocks that are not page-locked reach its GPUs (`asked`, else
    ``SUMMA_HOST_COPIES``) and the host threads per rank that copy them, by
    the cores of this process shared with the ranks on its node
    (:func:`summa.device.staging.copy_threads`; for a machine planned from
    afar, this host's cores: a profile records none). ``(None, None)`` on
    CPUs, which multiply where the data lie. Raises ValueError for a way
    that is not ``"stage"`` or ``"lock"``, the same on every rank."""
    if asked is not None and asked not in options.HOST_COPIES:
        raise ValueError(f"host_copies must be {' or '.join(options.HOST_COPIES)}, "
                         f"got {asked!r}")
    if not traits(machine.backend).gpu:
        return None, None
    return asked or options.current().host_copies, staging.copy_threads(machine.node_ranks)


def restage(plan: Plan, staged: tuple) -> Plan:
    """`plan` for broadcasters that do (or do not) stage each direction's
    panels (``(row, column)``, ``ipc``): the broadcasters are made and
    self-tested after planning, so an out-of-core run learns this last;
    `plan` itself where it planned for the same (always on CPUs)."""
    pr, pc = plan.grid
    staged = (bool(staged[0]) and pc > 1, bool(staged[1]) and pr > 1)
    if not plan.out_of_core or tuple(plan.memory.staged) == staged:
        return plan
    m, n, k = plan.shape
    with ozaki_gpu.asked_moduli(plan.moduli):
        memory = memory_plan(m, n, k, plan.dtype, plan.grid, plan.panel_width,
                             Execution(plan.lookahead, plan.backend,
                                       device_budget=plan.device_budget, out_of_core=True,
                                       precision=plan.precision, staged=staged,
                                       copy_threads=plan.copy_threads))
    return replace(plan, memory=memory)


def _grid(grid, machine: Machine, m: int, n: int, dtype, schedule: str) -> tuple:
    """The grid asked for (checked against the ranks), or the default."""
    if grid is None:
        return tuple(grid_for(machine.ranks, m, n, machine.backend, dtype, schedule))
    dims = parse_grid(grid) if isinstance(grid, str) else (int(grid[0]), int(grid[1]))
    if dims[0] < 1 or dims[1] < 1:
        raise ValueError(f"grid dimensions must be >= 1, got {dims[0]}x{dims[1]}")
    check_grid_ranks(dims, machine.ranks)
    return dims


def _is_width(width) -> bool:
    return isinstance(width, (int, np.integer)) and not isinstance(width, bool)


def _width(asked, backend: str, dtype, precision, ooc: bool, grid, schedule: str):
    """The panel width the run takes: `asked` where an integer; the default
    for the mode for None (and out of core for anything else); ``"auto"``
    in memory where there is something to measure (several ranks, panels)."""
    if _is_width(asked):
        return int(asked)
    auto = isinstance(asked, str) and asked == "auto"
    if ooc or asked is None or (auto and (grid[0] * grid[1] == 1 or (
            schedule == "strips" and grid[0] > 1))):
        return default_panel_width(backend, dtype, precision, out_of_core=ooc)
    return asked  # "auto", or a bad value the multiply refuses with its own message


@dataclass(frozen=True)
class _MemoryAsk:
    """What :func:`make_plan` was asked of memory (its arguments of the same
    names): where the product runs (`out_of_core`, `device_memory`), how K
    is cut (`schedule`), the GEMMs' `precision` and the broadcasters'
    `staged` directions; and the `copy_threads` of its host copies out of
    core (:attr:`Plan.copy_threads`), whose page-locked ring it counts."""

    out_of_core: bool | None
    device_memory: object
    schedule: str
    precision: object
    staged: tuple
    copy_threads: int | None = None


def _memory(machine, shape, dtype, grid, panel_width, lookahead, asked: _MemoryAsk):
    """``(MemoryPlan, device budget or None, note)``: in memory where it
    fits (or was asked for), else out of core to a budget."""
    m, n, k = shape
    out_of_core, device_memory, schedule = asked.out_of_core, asked.device_memory, asked.schedule
    precision, staged = asked.precision, asked.staged
    backend = machine.backend
    note = None
    if out_of_core is not True and not device_memory:
        width = int(panel_width) if _is_width(panel_width) else \
            default_panel_width(backend, dtype, precision)
        memory = memory_plan(m, n, k, dtype, grid, width,
                             Execution(lookahead, backend, schedule=schedule, precision=precision,
                                       ))
        try:
            _check(machine, memory)
            return memory, None, None
        except ValueError as exc:
            if schedule == "strips" and traits(backend).gpu:  # in memory only
                raise ValueError(str(exc).replace("use --device-memory (out of core) or",
                                                  "use --schedule panels (which can run out "
                                                  "of core) or")) from None
            if not traits(backend).gpu or out_of_core is False:  # (False: asked for)
                raise
            note = f"the in-memory plan does not fit ({exc}); running out of core"
    budget = parse_bytes(device_memory) if device_memory else _free_budget(machine)
    memory = _out_of_core(shape, dtype, grid, panel_width, lookahead, backend,
                          (budget, precision, staged, asked.copy_threads))
    if machine.comm is not None:
        check_host_memory(memory, machine.comm)
    return memory, budget, note


#: Narrowest panel an out-of-core plan takes on GPUs to move fewer bytes:
#: GEMMs over 2048 terms still run near the GPU's peak.
MIN_OOC_WIDTH = 2048
#: A narrower panel is taken where its tiles move this share fewer bytes.
TRAFFIC_GAIN = 0.95


def _out_of_core(shape, dtype, grid, panel_width, lookahead, backend, limits) -> MemoryPlan:
    """The out-of-core MemoryPlan: at the width asked, else at the mode's
    default or a half or quarter of it (not under :data:`MIN_OOC_WIDTH`),
    whichever tiles move fewest bytes between host and GPU, the widest of
    equals. Under a tight budget narrower panels leave room for taller C
    tiles, so B crosses the link fewer times: float64 32768³ under 8 GiB
    takes 3 x 1 tiles with 2048-wide panels (42.9 GB moved) where 4096 took
    4 x 1 (51.5 GB), the host link being what bounds it on one H200 (22.7 GB/s,
    ``summa.matmul`` at 0.55 of ``cupy.matmul``). `limits`: ``(device
    budget, precision, staged, copy threads)``; fp64-int8 keeps its width
    (its products lose more to narrow panels than the bytes save)."""
    m, n, k = shape
    budget, precision, staged, threads = limits
    if _is_width(panel_width):
        widths = [int(panel_width)]
    else:
        widest = default_panel_width(backend, dtype, precision, out_of_core=True)
        narrower = [] if precision == "fp64-int8" or not traits(backend).gpu else \
            [w for w in (widest // 2, widest // 4) if w >= MIN_OOC_WIDTH]
        widths = [widest] + narrower
    best, refusal = None, None
    for width in widths:
        try:
            memory = memory_plan(m, n, k, dtype, grid, width,
                                 Execution(lookahead, backend, device_budget=budget,
                                           out_of_core=True, precision=precision, staged=staged,
                                           copy_threads=threads))
        except ValueError as exc:  # too small for this width's tiles: maybe a narrower
            refusal = refusal or exc
            continue
        moved = host_traffic(memory, shape, grid)
        if best is None or moved < TRAFFIC_GAIN * best[0]:
            best = (moved, memory)
    if best is None:
        raise refusal
    return best[1]


def host_traffic(memory: MemoryPlan, shape, grid) -> int:
    """Elements one rank moves between host and GPU out of core: its A
    block once per column of C tiles, its B block once per row of them, its
    C block once."""
    m, n, k = shape
    ml, nl, kl = -(-m // grid[0]), -(-n // grid[1]), k
    rows, cols = memory.tiles
    return ml * kl * cols + kl * nl * rows + ml * nl


def _check(machine: Machine, memory: MemoryPlan) -> None:
    """Refuse an in-memory plan the machine's devices or hosts cannot hold."""
    if machine.comm is not None:
        check_memory(memory, machine.device, machine.comm)
        check_host_memory(memory, machine.comm)
    elif machine.free_device is not None and memory.device_bytes > machine.free_device:
        raise ValueError(f"each rank needs {memory.device_bytes / 2**30:.1f} GiB on its GPU, "
                         f"{machine.free_device / 2**30:.1f} GiB free; use --device-memory "
                         "(out of core) or more ranks")


def _free_budget(machine: Machine) -> int:
    """An out-of-core budget where none was given: a share of the least free
    device memory of any rank (live GPUs), of `free_device`, or 1 GiB on
    NumPy. Collective where live."""
    if not traits(machine.backend).gpu:
        return NUMPY_BUDGET
    if machine.comm is not None:
        return machine.comm.allreduce(int(machine.device.memory_free() * FREE_SHARE),
                                      op=MPI.MIN)
    if machine.free_device is None:
        raise ValueError("out of core on a machine planned from afar needs its device "
                         "memory (--device-memory)")
    return int(machine.free_device * FREE_SHARE)


def _panel_sums(memory, dtype, grid, shape, width, precision, schedule) -> int | None:
    """Device bytes of fp64-int8's panel sums where this product may take
    them (in memory, panels, on a grid): :func:`summa.precision.ozaki_gpu.panel_sums_apply`."""
    m, n, k = shape
    if (precision != "fp64-int8" or memory.mode != "in-memory" or schedule == "strips"
            or not isinstance(width, int)
            or not ozaki_gpu.panel_sums_apply(dtype, grid[0] * grid[1], k)):
        return None
    return ozaki_gpu.panel_sums_bytes(-(-m // grid[0]), -(-n // grid[1]), width, k)


def _predict(plan: Plan, path=None, native: Plan | None = None) -> dict:
    """The model's time for `plan` by the profile at `path` (None: shipped):
    ``seconds`` and ``tflops`` as the split combines them, the ``split``
    (:meth:`summa.planning.model.TimeSplit.as_dict`), its ``bound`` and
    ``bound_share``, ``advice`` (what would move the bound), ``summa_seconds``
    (the SUMMA alone on data in GPU memory, what ``summa model`` predicts),
    and beside fp64-int8 the time of float64's `native` plan; or ``error``."""
    # the model loads only when asked
    from .model import Profile, RunSetting, predict, shipped_profile
    path = path or shipped_profile()
    out = {"profile": str(path), "shipped": str(path) == shipped_profile()}
    try:
        profile = Profile.load(path)
        split, details = _split(plan, profile)
        summa = predict(profile, *plan.shape, plan.dtype, plan.grid, _model_width(plan),
                        RunSetting(lookahead=plan.lookahead, precision=plan.precision))
    except (ValueError, KeyError) as exc:
        return {**out, "error": str(exc)}
    m, n, k = plan.shape
    flops = (8 if np.dtype(plan.dtype).kind == "c" else 2) * m * n * k
    bound, worst = split.bound()
    parts = split.parts()
    runner = max((p for p in parts if p != bound), key=parts.get, default=None)
    following = runner if runner and parts[runner] >= NEXT_BOUND_SHARE * worst else None
    out.update(seconds=split.seconds, tflops=flops / split.seconds / 1e12,
               split=split.as_dict(), bound=bound, bound_share=worst / split.seconds,
               summa_seconds=summa.seconds, **details,
               advice=_advice(plan, profile, bound, details["host_link"]), next=following,
               next_advice=_advice(plan, profile, following, details["host_link"])
               if following else [])
    if native is not None and "seconds" in (native.predicted or {}):
        out.update(native_seconds=native.predicted["seconds"],
                   native_tflops=native.predicted["tflops"])
    return out


#: A part of the time split at least this share of the bound's is named
#: beside it with what would move it too: it bounds the run once the bound
#: is halved.
NEXT_BOUND_SHARE = 0.5


def _model_width(plan: Plan) -> int:
    """The panel width the model predicts for (``"auto"``: the default)."""
    return plan.panel_width if _is_width(plan.panel_width) else \
        default_panel_width(plan.backend, plan.dtype, plan.precision)


def _split(plan: Plan, profile) -> tuple:
    """``(TimeSplit, details)`` of `plan` by `profile`, per rank.

    The model (:func:`summa.planning.model.predict`) times one C tile's SUMMA (in
    memory: the whole block), times the number of tiles: its GEMMs, its
    broadcasts, and what of its time is neither (the exposed rest). Out of
    core without peer access each GPU uploads its own panel parts, so
    nothing goes between GPUs (``broadcaster="auto"`` of
    :func:`summa.api.multiply.matmul_arrays`). The host
    link moves :func:`_host_bytes`; out of core its copies overlap the
    GEMMs but for the first upload and the last write-back, in memory they
    come before and after the SUMMA. The disk is timed beside, not in it."""
    from .model import BOUNDS, RunSetting, TimeSplit, predict
    (m, n, k), (pr, pc) = plan.shape, plan.grid
    itemsize = np.dtype(plan.dtype).itemsize
    rows, cols = plan.memory.tiles if plan.out_of_core else (1, 1)
    tile = plan.memory.tile if plan.out_of_core else (-(-m // pr), -(-n // pc))
    own = plan.out_of_core and pr * pc > 1 and not profile.peer_access
    width = _model_width(plan)
    one = predict(profile, tile[0] * pr, tile[1] * pc, k, plan.dtype, plan.grid, width,
                  RunSetting(lookahead=plan.lookahead, precision=plan.precision))
    gemm = rows * cols * one.panels * one.panel_compute
    if own:
        links = 0.0
        summa = rows * cols * one.panels * (one.panel_compute + profile.panel_overhead(pr * pc))
    else:
        links, summa = rows * cols * one.received * one.panel_comm, rows * cols * one.seconds
    exposed = max(0.0, summa - max(gemm, links))
    # CPU ranks multiply where the data lie: nothing crosses a host link
    up, down = _host_bytes(plan, own) if traits(plan.backend).gpu else (0, 0)
    host = profile.host_seconds(up, down) if up else 0.0
    if up and host is not None and plan.out_of_core:
        exposed += profile.host_seconds(*_head_tail(plan, width, tile))
    split = TimeSplit(gemm, host, links, exposed, BOUNDS if plan.out_of_core else
                      ("gemm", "gpu_links"),
                      profile.disk_seconds((m * k + k * n) * itemsize, m * n * itemsize))
    return split, {"host_bytes": [up, down], "own_uploads": own, "comm": one.comm,
                   "host_link": profile.host_link()}


def _host_bytes(plan: Plan, own: bool) -> tuple[int, int]:
    """``(up, down)``: bytes one rank moves from host memory to its GPU and
    back, A and B starting in host memory and C ending there (beta 0). In
    memory: its blocks of A and B once up, of C once down. Out of core its
    C block comes down once; where every GPU uploads its own panel parts
    (`own`), all it needs (:func:`host_traffic`), else the parts it owns:
    its A block once per column of C tiles, its B block once per row."""
    (m, n, k), (pr, pc) = plan.shape, plan.grid
    itemsize = np.dtype(plan.dtype).itemsize
    ml, nl = -(-m // pr), -(-n // pc)
    if own:
        return (host_traffic(plan.memory, plan.shape, plan.grid) - ml * nl) * itemsize, \
            ml * nl * itemsize
    rows, cols = plan.memory.tiles if plan.out_of_core else (1, 1)
    return (ml * -(-k // pc) * cols + -(-k // pr) * nl * rows) * itemsize, ml * nl * itemsize


def _head_tail(plan: Plan, width: int, tile) -> tuple[int, int]:
    """``(up, down)``: the bytes out of core that nothing hides: the first
    panel's first piece goes up before the first GEMM, and the last tile's
    last row strip comes down after its GEMM (:mod:`summa.execution.outofcore`)."""
    itemsize = np.dtype(plan.dtype).itemsize
    int8 = plan.precision == "fp64-int8"  # its first panel goes whole
    first = min(width if int8 else HEAD_FIRST, plan.shape[2])
    last = min(FP64_INT8_TAIL_SMALLEST if int8 else TAIL_SMALLEST, tile[0])
    return first * (tile[0] + tile[1]) * itemsize, last * tile[1] * itemsize


def _advice(plan: Plan, profile, bound: str, link) -> list[str]:
    """What would move the bound `bound` of `plan` (a part's name)."""
    if bound == "gpu_links":
        return ["GPUs that read each other's memory (NVLink, peer access), fewer ranks in a "
                "grid row or column, or wider panels (--nb) where the broadcasts' latency weighs"]
    if bound == "gemm":
        advice = []
        native = plan.precision is None
        if native and plan.dtype in ("float64", "complex128") and _rates(profile, plan,
                                                                         "fp64-int8"):
            advice.append("--precision fp64-int8 (float64 from exact INT8 tensor-core products, "
                          f"{_rates(profile, plan, 'fp64-int8'):.1f}x this profile's float64 "
                          "GEMM rate here; summa.freivalds checks the product)")
        if native and plan.dtype == "float32" and _rates(profile, plan, "tf32"):
            advice.append("--precision tf32 (float32 on tensor cores, "
                          f"{_rates(profile, plan, 'tf32'):.1f}x this profile's rate here)")
        return advice + ["more GPUs (each takes its share of the GEMMs)"]
    rows, cols = plan.memory.tiles if plan.out_of_core else (1, 1)
    advice = [] if plan.out_of_core else [
        "out of core (--device-memory; summa.matmul on NumPy arrays runs so by itself): the "
        "copies then overlap the GEMMs"]
    if rows * cols > 1:
        advice.append(f"more device memory per GPU: fewer C tiles than {rows} x {cols} (B "
                      f"crosses the link once per row of tiles, A once per column)")
    if link and link.get("pinned_h2d_gbs"):
        advice.append("operands in page-locked memory (copied directly, "
                      f"{link['pinned_h2d_gbs']:g} GB/s against {link['h2d_gbs']:g} staged "
                      "from pageable memory)")
    if plan.out_of_core:  # a new result's pages are faulted in beside the copies
        advice.append("a result array used before (summa.matmul(..., out=c)): float64 16384³ "
                      "on an H200 took 0.20 s into one against 0.29-0.97 s into a new one")
    return advice + ["more GPUs, each on a link of its own (each moves its share)"]


def _rates(profile, plan: Plan, precision: str) -> float | None:
    """How many times faster the profile rates `precision`'s GEMMs than the
    plan's at its block shape, each at its default width (None: no samples)."""
    (m, n, _), (pr, pc) = plan.shape, plan.grid
    ml, nl = -(-m // pr), -(-n // pc)
    try:
        faster = profile.gemm_rate(ml, nl, default_panel_width(plan.backend, plan.dtype,
                                                               precision), plan.dtype, precision)
        now = profile.gemm_rate(ml, nl, _model_width(plan), plan.dtype, plan.precision)
    except ValueError:
        return None
    return faster / now if faster > now else None


def _lines(plan: Plan) -> list[str]:
    """What ``summa plan`` prints: the memory per rank, then each decision."""
    gib = 2.0**30
    memory, (m, n, k), grid = plan.memory, plan.shape, plan.grid
    lines = [f"plan: {m} x {n} x {k} {plan.dtype} on {plan.ranks} ranks (grid {grid[0]}x"
             f"{grid[1]}), nb {plan.panel_width}, lookahead {plan.lookahead}, {plan.backend} "
             f"backend: {memory.mode}",
             f"  peak per rank: device {memory.device_bytes / gib:.2f} GiB, host "
             f"{memory.host_bytes / gib:.2f} GiB"]
    if memory.tile:
        lines.append(f"  C tiles of {memory.tile[0]} x {memory.tile[1]} ({memory.tiles[0]} x "
                     f"{memory.tiles[1]} per rank), panels of {memory.chunk} columns in "
                     f"{memory.slots} slots")
    if any(memory.staged):
        lines.append("  copy-engine broadcasts (ipc) stage each slot's panel once more "
                     "(counted above; --comm nccl plans without)")
    if memory.transposed_a:
        lines.append("  A's panels are copied transposed for the GEMMs (one scratch panel "
                     "counted above; SUMMA_TRANSPOSE_A)")
    if plan.moduli is not None:
        lines.append(f"  fp64-int8: each panel product's int8 residues ({plan.moduli} moduli), "
                     "integer products and float64 sums counted above")
    if plan.panel_sums is not None:
        lines.append(f"  on this grid each rank sums its panels' INT8 products and folds C once "
                     f"where its device also holds the sums ({plan.panel_sums / gib:.2f} GiB "
                     "beside its blocks and panels); else a fold a panel, as counted above")
    if memory.staging_bytes:
        threads = plan.copy_threads
        lines.append(f"  host copies pass through {memory.staging_bytes / 2**20:.0f} MiB of "
                     f"page-locked chunks, filled and drained by {threads} copy "
                     f"thread{'s' * (threads != 1)} a rank (SUMMA_COPY_THREADS); summa.matmul "
                     "on NumPy arrays reads A and B where they lie, so its extra host "
                     f"memory is C ({m * n * np.dtype(plan.dtype).itemsize / gib:.2f} GiB, or "
                     "none with out=) and those chunks")
    if plan.predicted:
        lines += _prediction_lines(plan)
    lines += _storage_lines(plan)
    decided = (f"  decided: {plan.schedule}, op(A) {plan.trans[0]}, op(B) {plan.trans[1]}, "
               f"broadcaster {plan.broadcaster}, precision {plan.precision or 'default'}")
    if plan.out_of_core:
        decided += f", device budget {plan.device_budget / gib:.2f} GiB"
    if plan.host_copies:
        decided += f", host copies {plan.host_copies}"
    lines.append(decided)
    if plan.placement.where != "host":
        lines.append(f"  {plan.placement}")
    if plan.note:
        lines.append(f"  {plan.note}")
    return lines


def _storage_lines(plan: Plan) -> list[str]:
    """How A and B are read where they lie, never by a transposing copy
    (nothing where both lie by rows)."""
    if tuple(plan.storage) == ("rows", "rows") and not any(plan.conj):
        return []
    lines = []
    for name, storage, conj in zip("AB", plan.storage, plan.conj):
        text = {"rows": "by rows, as it lies",
                "cols": "by columns: its transpose's rows, the GEMM's transposed operand",
                "strided rows": "strided: gathered by rows by the host copy threads",
                "strided cols": "strided: gathered by columns by the host copy threads, the "
                                "GEMM's transposed operand"}[storage]
        if conj:
            text += (", conjugated by the GEMM" if transposed(storage) else
                     ", conjugated before its GEMM (a copy on the device)")
        lines.append(f"  op({name}) {text}")
    return lines


def _prediction_lines(plan: Plan) -> list[str]:
    """The model's time for the plan, where it goes, what bounds it and
    what would move that, with what it assumes."""
    pred = plan.predicted
    if "error" in pred:
        return [f"  no prediction from {pred['profile']}: {pred['error']}"]
    where = " (the profile shipped with summa: 2 H200s; calibrate yours)" if pred["shipped"] \
        else ""
    lines = [f"  predicted by the model: {pred['seconds']:.2f} s, {pred['tflops']:.1f} "
             f"TFLOP/s{where}",
             f"  where the time goes, a {'GPU' if traits(plan.backend).gpu else 'rank'} (A and "
             "B start in host memory, C ends there):"]
    lines += _split_lines(plan)
    split, names = pred["split"], _PART_NAMES
    if plan.out_of_core:
        combined = "max(GEMMs, host link, GPU links) + exposed: out of core they overlap"
        if plan.precision == "fp64-int8":
            # its tiles fold C once per panel and make their own residues (docs/benchmarks.md,
            # "float64 on INT8: speed", out of core: 59 against 77 TFLOP/s in memory)
            combined += ("; not in the model: fp64-int8 measured 0.77 of in-memory on one H200 "
                         "(each panel folds the tile again, each tile makes its residues)")
        else:
            combined += (" (measured 0.86-0.99 of in-memory on one H200 where the host link "
                         "keeps up with the GEMMs)")
    else:
        combined = ("host link + max(GEMMs, GPU links) + exposed: in memory the copies come "
                    "before and after the SUMMA (none for data made on the GPUs, as bench's)")
    others = sorted((value, name) for name, value in split.items()
                    if name in names and name != pred["bound"] and value is not None)
    lines += [f"  combined: {combined}",
              f"  bound by: {_bound_name(pred['bound'], pred)}, {pred['bound_share'] * 100:.0f} % "
              f"of the time" + (f"; {names[others[-1][1]]} would take {others[-1][0]:.1f} s"
                             if others else ""),
              "  would move it: " + "; ".join(pred["advice"])]
    if pred.get("next"):
        lines.append(f"  next bound, {_bound_name(pred['next'], pred)} at "
                     f"{split[pred['next']]:.1f} s: " + "; ".join(pred["next_advice"]))
    if "native_seconds" in pred:
        native = pred["native_seconds"]
        lines.append(f"  native {plan.dtype} by the same profile: {native:.2f} s, "
                     f"{pred['native_tflops']:.1f} TFLOP/s ({native / pred['seconds']:.2f}x "
                     "fp64-int8's time)")
    return lines


#: The parts of a time split as ``summa plan`` names them.
_PART_NAMES = {"gemm": "the GEMMs", "host_link": "the host link", "gpu_links": "the GPU links"}


def _bound_name(bound: str, pred: dict) -> str:
    """The bound named for a person: the host link with its kind (PCIe)."""
    link = pred.get("host_link") or {}
    if bound == "host_link" and link.get("name"):
        return f"the host link ({link['name']})"
    return _PART_NAMES[bound]


def _split_lines(plan: Plan) -> list[str]:
    """One line a part of the plan's time split, with what it counts."""
    pred = plan.predicted
    split, link = pred["split"], pred.get("host_link")
    (m, n, k), ranks = plan.shape, plan.ranks
    gb = 1e9
    up, down = (b / gb for b in pred["host_bytes"])
    flops = (8 if np.dtype(plan.dtype).kind == "c" else 2) * m * n * k / ranks
    kind = plan.dtype + (" from INT8 products" if plan.precision == "fp64-int8" else "")
    rows = [("GEMMs", split["gemm"], f"{kind} at {flops / split['gemm'] / 1e12:.2f} TFLOP/s a "
             + ("GPU" if traits(plan.backend).gpu else "rank"))]
    moved = f"{up:.1f} GB up, {down:.1f} GB down"
    if not traits(plan.backend).gpu:
        moved = "none: CPU ranks multiply in host memory"
    elif link:
        moved = (f"{link.get('name', 'host <-> GPU')}: {moved} at {link['h2d_gbs']:g} / "
                 f"{link['d2h_gbs']:g} GB/s, staged from pageable memory")
    else:
        moved = f"the profile has no host_link rates ({moved})"
    rows.append(("host link", split["host_link"], moved))
    if ranks == 1:
        between = "one GPU"
    elif pred["own_uploads"]:
        between = "none: without peer access each GPU uploads its own panel parts"
    else:
        between = f"the panels each GPU receives, by {pred['comm']}"
    rows.append(("GPU links", split["gpu_links"], between))
    rows.append(("exposed", split["exposed"], "pipeline fill, per-panel overhead"
                 + (", the first upload and the last write-back" if plan.out_of_core else "")))
    files = f"{(m * k + k * n) * np.dtype(plan.dtype).itemsize / gb:.1f} GB and writes " \
        f"{m * n * np.dtype(plan.dtype).itemsize / gb:.1f} GB"
    rows.append(("disk", split["disk"], f"only summa multiply on .npy files, beside the time "
                 f"above: reads {files}" if split["disk"] is not None else
                 f"the profile has no disk rate (summa multiply on .npy files reads {files})"))
    return [f"    {name:<10}{f'{value:10.2f} s' if value is not None else 'not counted':>12}  "
            f"{what}" for name, value, what in rows]
