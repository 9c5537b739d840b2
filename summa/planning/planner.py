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

What the model predicts of a plan's time is :mod:`summa.planning.prediction`'s
(``make_plan(predict=True)``); the plan as text (``str(plan)``, what ``summa
plan`` prints) is :mod:`summa.planning.report`'s.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

import numpy as np

from ..runtime.mpi import MPI
from ..precision import ozaki_gpu
from .precision import (asked_moduli, moduli_asked, moduli_for, panel_sums_apply,
                        panel_sums_bytes)
from ..distribution.grid import check_grid_ranks, grid_for, parse_grid
from .memory import (Execution, MemoryPlan, check_host_memory, check_memory,
                     format_bytes, host_traffic, memory_plan, parse_bytes, resident_plan,
                     ranks_on_device, sweep_steps, waited_write_backs)
from .tiling import TRAFFIC_GAIN
from .model import gemm_flops
from .prediction import predict_plan
from .report import plan_lines
from .checks import check_schedule
from .tuning import default_panel_width, is_width
from ..device import staging
from ..device.traits import traits
from ..distribution.topology import topology_of
from .. import options

__all__ = ["Machine", "Placement", "Plan", "make_plan", "restage", "restore"]

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
    cores : int, optional
        A node's cores, which its ranks' host copy threads divide, where a
        profile says (a machine planned from afar); None: this process's.
    """

    backend: str = "numpy"
    ranks: int = 1
    free_device: int | None = None
    ranks_on_node: int | None = None
    comm: object = field(default=None, compare=False, repr=False)
    device: object = field(default=None, compare=False, repr=False)
    cores: int | None = None

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
    host_integers : tuple or None
        ``(A's, B's, the product's)`` dtype names where the operands are
        integers (or bools) lying in host memory that the host copy threads
        convert into float64 as they stage them into page-locked chunks,
        and the float64 product back as its chunks drain
        (:mod:`summa.device.casts`): no whole float64 copy of them in host
        memory (out of core on one GPU rank,
        :func:`summa.planning.arrays.with_integers`). None elsewhere:
        integers are converted whole first, the product after.
    scheme_moduli : int or None
        fp64-int8: the moduli every product takes (:attr:`scheme`), as the
        planner read them once: :attr:`moduli` where an in-memory SUMMA
        takes them for every panel, else those asked
        (``SUMMA_FP64_INT8_MODULI``, an entry point's ``moduli``); None:
        each product its K's default (:func:`_scheme_moduli`).
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
    host_integers: tuple | None = None
    scheme_moduli: int | None = None
    note: str | None = field(default=None, compare=False)
    predicted: dict | None = field(default=None, compare=False)

    def as_dict(self) -> dict:
        """The plan as JSON's values (tuples as lists): equal to what JSON
        gives back, so a recorded plan compares with a printed one."""
        return _plain(asdict(self))

    @property
    def scheme(self) -> ozaki_gpu.Scheme | None:
        """fp64-int8: how its products run (:class:`summa.precision.ozaki_gpu.Scheme`),
        what the executors hand the GEMMs: the moduli (:attr:`scheme_moduli`),
        the rows of A and C each takes at a time and the integer products a
        fold takes (``memory.int8_rows``, ``memory.int8_planes``, the memory
        plan's); None for other precisions."""
        if self.precision != "fp64-int8":
            return None
        return ozaki_gpu.Scheme(moduli=self.scheme_moduli, rows=self.memory.int8_rows,
                                planes=self.memory.int8_planes or ozaki_gpu.PLANES)

    def __str__(self) -> str:
        return "\n".join(plan_lines(self))


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
              placement: Placement | None = None, storage: tuple = ("rows", "rows")) -> Plan:
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
        through buffers of their own (copy engines, ``ipc``); both where
        `broadcaster` is ``ipc`` on GPUs; see :func:`restage` for the run,
        where the broadcasters are made later.
    host_copies : {"stage", "lock"}, optional
        Out of core on GPUs, how host blocks reach the devices
        (:attr:`Plan.host_copies`, with its :attr:`Plan.copy_threads`);
        default ``SUMMA_HOST_COPIES``.
    predict, profile : bool, str
        Fill :attr:`Plan.predicted` by the model profile at `profile`
        (default the one shipped with summa): the time, its split
        (:class:`summa.planning.model.TimeSplit`) and bound; for fp64-int8 also
        the time of float64's own plan of the same inputs.
    placement : Placement, optional
        Where the operands lie (default: host memory, as `host_held` says);
        on a GPU: one GEMM there where it fits (:func:`_resident`), else
        planned as host-held operands, the note saying why.
    storage : tuple
        How op(A) and op(B) lie in host memory (:attr:`Plan.storage`; host
        operands' :func:`summa.host.storage.storage_of`): out of core, C is
        cut the way that reads them in the larger pieces
        (:func:`summa.planning.tiling.columns_first`).

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
    placement, fetched, memory = placement or Placement(), None, None
    if placement.where != "host":
        check_schedule(schedule, grid)
        memory, fetched = _resident(machine, (m, n, k), dtype, (trans_a, trans_b), placement,
                                    (out_of_core, device_memory, precision))
        if memory is None:  # copied to host memory: planned as host-held operands
            placement, host_held = replace(placement, fetched=True), True
    if memory is not None:  # one GEMM where the operands lie
        budget, note, width = None, None, max(k, 1)
    else:
        if broadcaster == "ipc" and traits(machine.backend).gpu:
            staged = (True, True)  # asked for: planned, not learned at the run (restage)
        ask = _MemoryAsk(out_of_core, device_memory, schedule, precision, staged, copies[1],
                         tuple(storage))
        ask = _held_in_host(ask, machine.backend) if host_held else ask
        check_schedule(schedule, grid, out_of_core=bool(ask.out_of_core) or bool(ask.device_memory))
        with asked_moduli(moduli):  # the plans count their scratch
            memory, budget, note = _memory(machine, (m, n, k), dtype, grid, panel_width,
                                           lookahead, ask)
            width = _width(panel_width, machine.backend, dtype, precision, budget is not None,
                           grid, schedule)
        if budget is not None and memory.chunk < min(width, k):  # narrower: fewer bytes moved
            width = memory.chunk
    ooc = budget is not None
    copies = copies if ooc else (None, None)
    count = moduli_for(width, moduli) if precision == "fp64-int8" and \
        is_width(width) else None
    plan = Plan((m, n, k), dtype.name, machine.backend, machine.ranks, grid,
                (str(trans_a).upper(), str(trans_b).upper()), schedule, ooc, width, lookahead,
                precision, count, budget, memory, broadcaster, host_copies=copies[0],
                copy_threads=copies[1],
                panel_sums=_panel_sums(memory, dtype, grid, (m, n, k), width, precision,
                                       schedule),
                placement=placement, storage=tuple(storage),
                scheme_moduli=_scheme_moduli(precision, count, ooc or placement.resident, moduli),
                note="; ".join(x for x in (fetched, note) if x) or None)
    if not predict:
        return plan
    native = None
    if precision == "fp64-int8":  # is it worth it here? float64's own plan of the same inputs
        native = _native_plan(machine, (m, n, k), dtype, dict(
            grid=grid, trans_a=trans_a, trans_b=trans_b, host_held=host_held,
            out_of_core=out_of_core, device_memory=device_memory, panel_width=panel_width,
            lookahead=lookahead, schedule=schedule, broadcaster=broadcaster, staged=staged,
            host_copies=host_copies, profile=profile, storage=storage))
    return replace(plan, predicted=predict_plan(plan, profile, native))


def _native_plan(machine: Machine, shape: tuple, dtype, asked: dict) -> Plan | None:
    """The predicted plan of the same product in the dtype's own precision,
    as `asked` (:func:`make_plan`'s other arguments); None where there is none."""
    try:
        return make_plan(shape, dtype, machine, predict=True, **asked)
    except ValueError:  # no plan of its own to set beside it
        return None


def _held_in_host(ask: _MemoryAsk, backend: str) -> _MemoryAsk:
    """`ask` for operands in host memory: with `out_of_core` None they stay
    there on GPUs (or wherever `device_memory` caps the device, panels
    only); in memory they ignore `device_memory`."""
    out_of_core, device_memory = ask.out_of_core, ask.device_memory
    if out_of_core is None:
        out_of_core = ask.schedule == "panels" and (traits(backend).gpu
                                                    or device_memory is not None)
    if out_of_core is False:
        device_memory = None  # arrays copied onto the devices take them whole
    return replace(ask, out_of_core=out_of_core, device_memory=device_memory)


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
    free = machine.device.memory_free() if machine.device is not None else machine.free_device
    budget = parse_bytes(device_memory) if device_memory else None
    # room for fp64-int8's scratch, which takes C's rows in chunks where all
    # of them would pass the free memory or the cap beside the operands
    room = [x for x in (free, None if budget is None else budget - placement.held)
            if x is not None]
    memory = resident_plan(m, n, k, dtype, precision, placement.copies + conjugated,
                           new_c=not placement.into_out, budget=min(room, default=None))
    if budget is not None:
        need = memory.device_bytes + placement.held
        if need > budget:
            return None, fetched + (f"they and the product need {need / 2**30:.2f} GiB, more "
                                    f"than device_memory ({budget / 2**30:.2f} GiB)")
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
    afar, the cores its profile records, else this host's). ``(None,
    None)`` on CPUs, which multiply where the data lie. Raises ValueError
    for a way that is not ``"stage"`` or ``"lock"``, the same on every
    rank."""
    if asked is not None and asked not in options.HOST_COPIES:
        raise ValueError(f"host_copies must be {' or '.join(options.HOST_COPIES)}, "
                         f"got {asked!r}")
    if not traits(machine.backend).gpu:
        return None, None
    threads = staging.copy_threads(machine.node_ranks, machine.cores)
    return asked or options.current().host_copies, threads


def restage(plan: Plan, staged: tuple) -> Plan:
    """`plan` for broadcasters that do (or do not) stage each direction's
    panels (``(row, column)``, ``ipc``): the broadcasters are made and
    self-tested after planning, so an out-of-core run learns this last;
    `plan` itself where it planned for the same (always on CPUs). Where the
    staging buffers leave no room for tiles of the plan's panels, narrower
    panels, as the planner takes under a budget too small
    (:func:`_narrowest_that_fits`), the note saying so. A sweep the staging
    cuts into too many tiny steps is refused as the planner refuses one
    (:func:`_check_sweep`): 4096³ float64 under 4 MiB on two GPUs, planned
    in 34816 steps, took 69632 staged."""
    pr, pc = plan.grid
    staged = (bool(staged[0]) and pc > 1, bool(staged[1]) and pr > 1)
    if not plan.out_of_core or tuple(plan.memory.staged) == staged:
        return plan
    m, n, k = plan.shape

    def plan_at(width: int, budget: int) -> MemoryPlan:
        with asked_moduli(plan.moduli):
            return memory_plan(m, n, k, plan.dtype, plan.grid, width,
                               _execution(plan, device_budget=budget, staged=staged))

    def fitted(budget: int) -> MemoryPlan:  # the plan's width, else the widest narrower
        try:
            return plan_at(plan.panel_width, budget)
        except ValueError as exc:  # (a sweep's tiny budget: its staging takes the room)
            return _narrowest_that_fits(lambda w: plan_at(w, budget), min(plan.panel_width, k),
                                        min(LEAST_OOC_WIDTH, k), exc)
    memory = fitted(plan.device_budget)
    _check_sweep(memory, k, (plan.device_budget, traits(plan.backend).gpu,
                             gemm_flops(plan.dtype, m, n, k)), lambda b: (fitted(b), None))
    width = max(1, min(plan.panel_width, k))
    if memory.chunk == width:
        return replace(plan, memory=memory)
    note = (f"the broadcasts' staging buffers leave a device budget of "
            f"{format_bytes(plan.device_budget)} no tiles with panels {width} wide: "
            f"{memory.chunk}-wide panels")
    return replace(plan, memory=memory, panel_width=memory.chunk,
                   note="; ".join(x for x in (plan.note, note) if x))


def restore(plan: Plan, storage: tuple, machine: Machine | None = None) -> Plan:
    """`plan` for host operands that lie as `storage` says (a
    :class:`summa.Matmul` planned for arrays of one layout and run on
    another's): its memory planned again at its own width, mode and budget,
    so out of core C is cut the way these operands read in larger pieces and
    B's panels that lie by columns are copied where that is faster
    (:func:`summa.planning.memory.memory_plan`). In memory on `machine`
    (live: collective) the new plan must fit its devices; where it does not,
    or no `machine` is given, `plan` with the storage alone, which the
    executors run as the operands lie within its memory. `plan` itself
    where it planned for `storage`."""
    storage = tuple(storage)
    if tuple(plan.storage) == storage:
        return plan
    stored = replace(plan, storage=storage)
    if plan.placement.resident or (not plan.out_of_core and machine is None):
        return stored
    m, n, k = plan.shape
    width = plan.panel_width if is_width(plan.panel_width) else \
        default_panel_width(plan.backend, plan.dtype, plan.precision)  # "auto": as planned
    try:
        with asked_moduli(plan.moduli):
            memory = memory_plan(m, n, k, plan.dtype, plan.grid, width,
                                 _execution(plan, storage=storage))
        if not plan.out_of_core:
            _check(machine, memory)
    except ValueError:  # (the same on every rank)
        return stored
    return replace(stored, memory=memory)


def _execution(plan: Plan, **changed) -> Execution:
    """How `plan` runs, as its memory plan counted it, with the `changed`
    fields (:class:`summa.planning.memory.Execution`'s)."""
    return replace(Execution(plan.lookahead, plan.backend, device_budget=plan.device_budget,
                             out_of_core=plan.out_of_core, schedule=plan.schedule,
                             precision=plan.precision, staged=tuple(plan.memory.staged),
                             copy_threads=plan.copy_threads, storage=tuple(plan.storage)),
                   **changed)


def _grid(grid, machine: Machine, m: int, n: int, dtype, schedule: str) -> tuple:
    """The grid asked for (checked against the ranks), or the default."""
    if grid is None:
        return tuple(grid_for(machine.ranks, m, n, machine.backend, dtype, schedule))
    dims = parse_grid(grid) if isinstance(grid, str) else (int(grid[0]), int(grid[1]))
    if dims[0] < 1 or dims[1] < 1:
        raise ValueError(f"grid dimensions must be >= 1, got {dims[0]}x{dims[1]}")
    check_grid_ranks(dims, machine.ranks)
    return dims


def _width(asked, backend: str, dtype, precision, ooc: bool, grid, schedule: str):
    """The panel width the run takes: `asked` where an integer; the default
    for the mode for None (and out of core for anything else); ``"auto"``
    in memory where there is something to measure (several ranks, panels)."""
    if is_width(asked):
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
    `staged` directions; the `copy_threads` of its host copies out of
    core (:attr:`Plan.copy_threads`), whose page-locked ring it counts, and
    the operands' `storage` (:attr:`Plan.storage`), which the cut follows."""

    out_of_core: bool | None
    device_memory: object
    schedule: str
    precision: object
    staged: tuple
    copy_threads: int | None = None
    storage: tuple = ("rows", "rows")


def _memory(machine, shape, dtype, grid, panel_width, lookahead, asked: _MemoryAsk):
    """``(MemoryPlan, device budget or None, note)``: in memory where it
    fits (or was asked for), else out of core to a budget."""
    m, n, k = shape
    out_of_core, device_memory, schedule = asked.out_of_core, asked.device_memory, asked.schedule
    precision, staged = asked.precision, asked.staged
    backend = machine.backend
    note = None
    if out_of_core is not True and not device_memory:
        width = int(panel_width) if is_width(panel_width) else \
            default_panel_width(backend, dtype, precision)
        room = _device_room(machine) if precision == "fp64-int8" else None
        memory = memory_plan(m, n, k, dtype, grid, width,
                             Execution(lookahead, backend, schedule=schedule, precision=precision,
                                       storage=asked.storage, device_room=room))
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
    memory, narrowed = _out_of_core(shape, dtype, grid, panel_width, Execution(
        lookahead, backend, device_budget=budget, out_of_core=True, precision=precision,
        staged=staged, copy_threads=asked.copy_threads, storage=asked.storage))
    if machine.comm is not None:
        check_host_memory(memory, machine.comm)
    return memory, budget, "; ".join(x for x in (note, narrowed) if x) or None


#: Narrowest panel an out-of-core plan takes on GPUs to move fewer bytes:
#: GEMMs over 2048 terms still run near the GPU's peak.
MIN_OOC_WIDTH = 2048
#: ... and fp64-int8's: each panel's products fold the C tile again, so narrow
#: panels cost it more. ``summa.matmul(a, b, out=c, precision="fp64-int8")`` of
#: pageable 40960² arrays on one H200 with 24 GiB free (its products in row
#: chunks), two calls at each width in one process: 8192-wide panels 2.46-2.64 s
#: (2 x 2 tiles, 67 GB moved), 16384 2.71-2.86 s (3 x 2 tiles, 80.5 GB), 4096
#: 3.12-3.19 s (3 x 1 tiles, 67 GB; its products 2.9 s against 8192's 2.3)
#: (docs/benchmarks.md; ``benchmarks/fp64_int8_user_case.py --panel-width``).
MIN_OOC_WIDTH_INT8 = 8192
#: Narrowest panel any out-of-core plan takes (the NumPy backend's default
#: width): a budget too small for the tiles of panels this wide is refused,
#: not planned into thousands of tiny GEMMs (``summa bench --size 96
#: --device-memory 100B`` on a GPU ran one-element tiles for minutes).
LEAST_OOC_WIDTH = 256
#: Most GEMMs (C tiles x panels) an out-of-core sweep is planned with where
#: each is too small to hide a step's own cost (less than
#: :data:`STEP_FLOPS`): a budget that cuts C finer is refused, with the least
#: budget that does not. A step of tiny tiles costs ~90 us on one CPU rank
#: (2000 x 2000 x 300 under 40 KiB, a million steps of 1 x 8 tiles, took
#: 91 s) and on an H200 ~1.6 ms a step and ~3.1 ms a C tile
#: (:data:`summa.planning.prediction.SWEEP_STEP_SECONDS`; pageable float64
#: 8192³ under 16 MiB, 482 x 17 tiles x 4 panels, took 76 s), so this many
#: are seconds on a CPU and a few minutes on a GPU: slow, but a
#: budget or width the caller chose; ``summa plan --size 8192
#: --device-memory 100KiB`` had cut C into 8192 x 8192 one-element tiles.
MAX_SWEEP_GEMMS = 1 << 16
#: Real flops of a step's GEMM (complex: four real products) that hide the
#: step's own cost: ~90 us at 50 GFLOP/s on a CPU rank, ~1 ms at 70 TFLOP/s
#: on an H200. A sweep of steps this large is planned however many (float64
#: 100000 x 100000 x 1.2e6 under 2 GiB: 69148 steps of 1695 x 25000 x 4096,
#: 3.5e11 flops each).
STEP_FLOPS = {"cpu": 1 << 22, "gpu": 1 << 36}


def _out_of_core(shape, dtype, grid, panel_width, execution: Execution) -> tuple:
    """``(MemoryPlan, note or None)``: the out-of-core MemoryPlan at the
    width asked, else at the mode's default or a half or quarter of it (not
    under :data:`MIN_OOC_WIDTH`), whichever tiles move fewest bytes between
    host and GPU (write-backs a tile waits for counted twice), the widest of
    equals; a sweep of too many tiny steps refused (:func:`_check_sweep`).
    Under a tight
    budget narrower panels leave room for taller C tiles, so B crosses the
    link fewer times: float64 65536 x 8192 x 65536 under 8 GiB takes one tile
    with 2048-wide panels where 4096 takes 2 x 1. `execution`: the sweep
    as :func:`summa.planning.memory.memory_plan` counts it, to its device
    budget (out of core); fp64-int8 goes no narrower
    than :data:`MIN_OOC_WIDTH_INT8` (its products lose more to narrower
    panels than the bytes save). A budget too small for all of these takes
    the widest narrower width that fits, down to :data:`LEAST_OOC_WIDTH`
    (:func:`_narrowest_that_fits`), the note saying so."""
    m, n, k = shape
    budget, precision, backend = execution.device_budget, execution.precision, execution.backend

    def plan_at(width: int, budget: int = budget) -> MemoryPlan:
        return memory_plan(m, n, k, dtype, grid, width, replace(execution, device_budget=budget))
    if is_width(panel_width):
        widths = [int(panel_width)]
    else:
        widest = default_panel_width(backend, dtype, precision, out_of_core=True)
        least = MIN_OOC_WIDTH_INT8 if precision == "fp64-int8" else MIN_OOC_WIDTH
        narrower = [w for w in (widest // 2, widest // 4) if w >= least] \
            if traits(backend).gpu else []
        widths = [widest] + narrower

    def moved(memory: MemoryPlan) -> int:
        # (the write-backs a tile waits for count as moved twice: at equal
        # traffic, a width that fits two C tiles wins)
        return host_traffic(memory, shape, grid) + waited_write_backs(memory)

    def choose(given: int) -> tuple:  # the plan and note under `given` bytes
        return _choose(lambda w: plan_at(w, given), widths, moved, is_width(panel_width),
                       (given, k))
    memory, note = choose(budget)
    flops = gemm_flops(dtype, m, n, k)
    _check_sweep(memory, k, (budget, traits(backend).gpu, flops), choose)
    return memory, note


def _choose(plan_at, widths: list, moved, asked: bool, limits: tuple) -> tuple:
    """:func:`_out_of_core`'s choice, unchecked: ``(MemoryPlan, note or
    None)``, the plan (``plan_at(width)``) of `widths` that moves fewest
    bytes (``moved(plan)``), else a narrower one that fits. `asked`: the
    width was the caller's (refused where its tiles do not fit); `limits`:
    ``(device budget, K)``."""
    budget, k = limits
    best, refusal = None, None
    for width in widths:
        try:
            memory = plan_at(width)
        except ValueError as exc:  # too small for this width's tiles: maybe a narrower
            refusal = refusal or exc
            continue
        bytes_moved = moved(memory)
        if best is None or bytes_moved < TRAFFIC_GAIN * best[0] or \
                (bytes_moved <= best[0] and memory.c_buffers > best[1].c_buffers):
            best = (bytes_moved, memory)
    if best is not None:
        return best[1], None
    if asked:
        raise refusal
    narrowest = min(widths + [k])
    memory = _narrowest_that_fits(plan_at, narrowest, min(LEAST_OOC_WIDTH, k), refusal)
    return memory, (f"a device budget of {format_bytes(budget)} holds no tiles with panels "
                    f"{narrowest} wide: {memory.chunk}-wide panels (narrower GEMMs, "
                    "slower; more device memory restores them)")


def _too_fine(memory: MemoryPlan, k: int, gpu: bool, flops: int) -> bool:
    """Whether `memory`'s sweep of K takes more than :data:`MAX_SWEEP_GEMMS`
    steps, each fewer than :data:`STEP_FLOPS` (a GPU's or a CPU's) of the
    product's real `flops`."""
    gemms = sweep_steps(memory, k)
    return gemms > MAX_SWEEP_GEMMS and flops < STEP_FLOPS["gpu" if gpu else "cpu"] * gemms


def _check_sweep(memory: MemoryPlan, k: int, limits: tuple, choose) -> None:
    """Refuse a sweep of too many small steps (:func:`_too_fine`; `limits`:
    ``(device budget, on a GPU, the product's real flops)``), naming the
    least power of two of bytes from the budget up under which the
    planner's own choice (``choose(bytes)[0]``) is not, or, where panels
    that narrow are too many even for one tile, the width."""
    budget, gpu, flops = limits
    if not _too_fine(memory, k, gpu, flops):
        return
    (rows, cols), (tm, tn), width = memory.tiles, memory.tile, memory.chunk
    cut = (f"cuts C into {rows} x {cols} tiles of {tm} x {tn} ({sweep_steps(memory, k)} "
           f"GEMMs with {width}-wide panels)")
    enough = 1 << (budget - 1).bit_length()
    for _ in range(64):  # more memory: fewer tiles, down to one (or the cut asked for)
        if not _too_fine(choose(enough)[0], k, gpu, flops):
            raise ValueError(f"a device budget of {format_bytes(budget)} {cut}: too small to "
                             f"finish; give each rank at least {format_bytes(enough)} "
                             "(--device-memory, device_memory=)")
        enough *= 2
    # panels this narrow are too many whatever the budget: the width's fault
    raise ValueError(f"this plan {cut}: too many to finish; take wider panels (--nb; at least "
                     f"{-(-k * rows * cols // MAX_SWEEP_GEMMS)} columns with these tiles)")


def _narrowest_that_fits(plan_at, width: int, least: int, refusal) -> MemoryPlan:
    """``plan_at(w)``, the out-of-core MemoryPlan at width w, for the widest
    of `width` halved, down to `least` (:data:`LEAST_OOC_WIDTH`), whose
    tiles fit a budget too small for the preferred widths: a slower plan,
    but the product where `refusal` would refuse a valid call. Raise
    `refusal` where none fits."""
    while width > least:
        width = max(width // 2, least)
        try:
            return plan_at(width)
        except ValueError:
            continue
    raise refusal


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


def _scheme_moduli(precision, count: int | None, own_products: bool,
                   moduli: int | None) -> int | None:
    """fp64-int8: the moduli every product of the plan takes
    (:attr:`Plan.scheme_moduli`), read here once, as the runs took them:
    in memory the plan's `count` for every panel (its width's), where it
    has one; a sweep's tile products and a resident GEMM (`own_products`),
    and panels of a width measured later, those asked (`moduli`, else
    ``SUMMA_FP64_INT8_MODULI``; None: each its K's default, a narrower last
    panel fewer). None for other precisions."""
    if precision != "fp64-int8":
        return None
    return count if count is not None and not own_products else moduli_asked(moduli)


def _panel_sums(memory, dtype, grid, shape, width, precision, schedule) -> int | None:
    """Device bytes of fp64-int8's panel sums where this product takes them
    (in memory, panels, on a grid, where they fit: ``memory.panel_sums``,
    :func:`summa.planning.precision.panel_sums_apply`); the executor takes
    them as planned."""
    m, n, k = shape
    if (precision != "fp64-int8" or memory.mode != "in-memory" or schedule == "strips"
            or not is_width(width) or not memory.panel_sums
            or not panel_sums_apply(dtype, grid[0] * grid[1], k)):
        return None
    return panel_sums_bytes(-(-m // grid[0]), -(-n // grid[1]), width, k)


def _device_room(machine: Machine) -> int | None:
    """The device bytes one rank may fill in memory where the plan chooses
    how much (fp64-int8's row chunks and planes): :data:`FREE_SHARE` of the
    least free memory of any rank's GPU shared among the ranks on it (live,
    collective), or of the machine's `free_device`, as an out-of-core plan
    takes where no budget is given; None on CPUs or where unknown."""
    if not traits(machine.backend).gpu:
        return None
    if machine.comm is not None:
        sharing = ranks_on_device(machine.device, machine.comm)
        free = machine.comm.allreduce(machine.device.memory_free() // sharing, op=MPI.MIN)
    elif machine.free_device is None:
        return None
    else:
        free = machine.free_device
    return int(free * FREE_SHARE)
