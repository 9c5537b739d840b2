"""One planner: every decision a multiply makes before it moves data, made
once by :func:`make_plan` and kept in a frozen, printable
:class:`summa.planning.plan.Plan`.

The grid, in memory or out of core, the panel width, the device budget and
its C tiles, precision and moduli are decided here and nowhere else on the
paths that take a Plan: the out-of-core sweep (:func:`summa.execution.outofcore.run_out_of_core`)
runs the Plan's :class:`summa.planning.memory.MemoryPlan` as it is, and ``summa plan``
prints the Plan a run on that machine would take. Where the machine is this
one (:meth:`summa.planning.plan.Machine.live`) the plan asks the devices for
their free memory and checks the nodes' host memory (collective); where it
is described by figures (``summa plan`` planning for another machine)
nothing is asked.

The Plan, Machine and Placement are :mod:`summa.planning.plan`'s; the
out-of-core panel width and the refusal of too fine a sweep
:mod:`summa.planning.widths`'; what the model predicts of a plan's time
:mod:`summa.planning.prediction`'s (``make_plan(predict=True)``); the plan
as text (``str(plan)``, what ``summa plan`` prints)
:mod:`summa.planning.report`'s.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..runtime.mpi import MPI
from ..precision import ozaki_gpu
from .precision import (asked_moduli, moduli_asked, moduli_for, panel_sums_apply,
                        panel_sums_bytes)
from ..distribution.grid import check_grid_ranks, grid_for, parse_grid
from .memory import (Execution, MemoryPlan, format_bytes, memory_plan, parse_bytes,
                     resident_plan)
from .memorycheck import check_host_memory, check_memory, ranks_on_device
from .model import gemm_flops
from .plan import Machine, Placement, Plan
from .prediction import predict_plan
from .request import PlanRequest
from .checks import check_schedule
from .tuning import default_panel_width, is_width
from .widths import LEAST_OOC_WIDTH, check_sweep, narrowest_that_fits, out_of_core_memory
from ..device import staging
from ..device.traits import traits
from .. import options

__all__ = ["make_plan", "restage", "restore"]

#: Share of the free device memory an out-of-core plan takes where no
#: budget is given (the rest: the memory pool's rounding, library workspaces).
FREE_SHARE = 0.9
#: Out-of-core "device" budget of the NumPy backend (tests: tiles still cut).
NUMPY_BUDGET = 1 << 30


def make_plan(shape, dtype, machine: Machine, request: PlanRequest = PlanRequest(), *,
              host_held: bool = False, moduli=None, staged: tuple = (False, False),
              host_copies=None, predict: bool = False, profile=None,
              placement: Placement | None = None, storage: tuple = ("rows", "rows")) -> Plan:
    """Plan ``C = op(A) @ op(B)`` of `shape` ``(m, n, k)`` on `machine`.

    Collective over ``machine.comm`` where the machine is live
    (:meth:`Machine.live`); no communication otherwise.

    Parameters
    ----------
    request : PlanRequest
        The options the caller asked (:class:`summa.planning.request.PlanRequest`:
        grid, memory mode and budget, transposes, panel width, lookahead,
        schedule, precision, broadcaster); the notes below tell how the
        planner reads some of them.
    host_held : bool
        The operands lie in host memory (NumPy arrays): with `out_of_core`
        None they stay there on GPUs, or wherever `device_memory` caps the
        device (panels only); in memory they ignore `device_memory`.
    request.out_of_core : bool or None
        True: out of core; False: in memory (no fallback); None: out of core
        where `device_memory` is given, or on GPUs where the in-memory plan
        does not fit.
    request.device_memory : str or int, optional
        Device bytes per rank out of core ("16GiB"); default 90 % of the
        free memory (live GPUs, or ``machine.free_device``), 1 GiB on NumPy.
    moduli : int, optional
        fp64-int8's moduli (:func:`summa.precision.ozaki_gpu.check_moduli`);
        default as the panel width sets them.
    staged : tuple
        ``(row, column)``: whether that direction's broadcasts stage panels
        through buffers of their own (copy engines, ``ipc``); both where
        `broadcaster` is ``ipc`` on GPUs; see :func:`restage` for the run,
        where the broadcasters are made later.
    host_copies : {"stage", "lock"}, optional
        Out of core on GPUs, how host blocks reach the devices
        (:attr:`Plan.host_copies`, with its :attr:`Plan.copy_threads`);
        default ``SUMMA_HOST_COPIES``. Host blocks that are not page-locked
        go ``"stage"``: through a ring of page-locked chunks filled and
        drained by host threads (:mod:`summa.device.staging`; as many as
        ``copy_threads``; nothing to do before the first GEMM), or
        ``"lock"``: page-locked whole first, for as long as they live, and
        copied directly (pays once, for blocks multiplied again and again,
        as ``bench`` does). Page-locking A and B in the background instead,
        staging until then, measured slower on the H200 machine (N = 40960:
        4.34 s against 3.13 s): locking stalls the other CUDA calls, and
        unlocking costs at the end. Blocks already page-locked are always
        copied directly.
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
    (m, n, k), dtype = (int(x) for x in shape), np.dtype(dtype)
    grid, out_of_core, device_memory = request.grid, request.out_of_core, request.device_memory
    trans_a, trans_b, panel_width = request.trans_a, request.trans_b, request.panel_width
    lookahead, schedule, precision = int(request.lookahead), request.schedule, request.precision
    broadcaster = request.broadcaster
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
        native = _native_plan(machine, (m, n, k), dtype, replace(
            request, grid=grid, precision=None), dict(
            host_held=host_held, staged=staged, host_copies=host_copies, profile=profile,
            storage=storage))
    return replace(plan, predicted=predict_plan(plan, profile, native))


def _native_plan(machine: Machine, shape: tuple, dtype, request: PlanRequest,
                 asked: dict) -> Plan | None:
    """The predicted plan of the same product in the dtype's own precision,
    as `request` and `asked` (:func:`make_plan`'s other arguments) say; None
    where there is none."""
    try:
        return make_plan(shape, dtype, machine, request, predict=True, **asked)
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
    (:func:`summa.planning.widths.narrowest_that_fits`), the note saying so. A sweep the staging
    cuts into too many tiny steps is refused as the planner refuses one
    (:func:`summa.planning.widths.check_sweep`): 4096³ float64 under 4 MiB on two GPUs, planned
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
            return narrowest_that_fits(lambda w: plan_at(w, budget), min(plan.panel_width, k),
                                        min(LEAST_OOC_WIDTH, k), exc)
    memory = fitted(plan.device_budget)
    check_sweep(memory, k, (plan.device_budget, traits(plan.backend).gpu,
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
    """What :func:`make_plan` was asked of memory (its request's fields and arguments of the
    same names): where the product runs (`out_of_core`, `device_memory`), how K
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
    memory, narrowed = out_of_core_memory(shape, dtype, grid, panel_width, Execution(
        lookahead, backend, device_budget=budget, out_of_core=True, precision=precision,
        staged=staged, copy_threads=asked.copy_threads, storage=asked.storage))
    if machine.comm is not None:
        check_host_memory(memory, machine.comm)
    return memory, budget, "; ".join(x for x in (note, narrowed) if x) or None


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
