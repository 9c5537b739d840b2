"""The out-of-core sweep's set-up: what its plan must know of the machine
before it runs.

A sweep's row and column broadcasters are made and self-tested after
:func:`summa.planning.make_plan`, and only then is it known whether they copy
directly (``ipc``, which stages each slot on the device): :func:`prepared_sweep`
makes them and the plan final for them (:func:`summa.planning.restage`), so
that :func:`summa.execution.outofcore.run_out_of_core` decides nothing; it only
refuses a plan not made final (:func:`check_prepared`). The checks of a
sweep's operands and plan that both ask live here too.
"""

from __future__ import annotations

from .. import options
from ..host.storage import copyable_rows
from ..transports.broadcasters import NoBroadcasts
from .checks import check_layouts, check_operands
from .plan import Plan
from .planner import restage
from .selection import grid_broadcasters

__all__ = ["prepared_sweep", "check_prepared", "check_sweep_operands", "check_sweep_plan"]


def prepared_sweep(plan: Plan, operands, device) -> tuple:
    """The broadcasters of a sweep and its plan made final for them.

    Parameters
    ----------
    plan : Plan
        The out-of-core Plan of this product (:func:`summa.planning.make_plan`).
    operands : summa.execution.sweep.SweepOperands
        Host-resident A, B, C and, where given, `own_copies` (then nothing is
        broadcast).
    device : Backend
        Where the sweep's GEMMs run.

    Returns
    -------
    tuple
        ``(plan, (row, column) broadcasters)``: those made
        (:func:`_sweep_broadcasters`), `plan` made final for them
        (:func:`summa.planning.restage`: ipc stages each slot), for
        :func:`summa.execution.outofcore.run_out_of_core`.

    Checks first; collective over C's grid.
    """
    A, B, C = operands.A, operands.B, operands.C
    check_sweep_operands(A, B, C, plan.host_integers)
    check_sweep_plan(plan, A, B, C, device)
    with device.on_device():  # (the broadcasters belong to its GPU)
        bcs = _sweep_broadcasters(plan, operands, device)
    return restage(plan, tuple(bc.name == "ipc" for bc in bcs)), bcs


def check_prepared(plan: Plan, broadcasters: tuple) -> None:
    """Refuse a plan not made final for `broadcasters` (``(row, column)``):
    one whose device budget does not count the staging they need
    (:func:`prepared_sweep` makes it so)."""
    row_bc, col_bc = broadcasters
    if restage(plan, (row_bc.name == "ipc", col_bc.name == "ipc")) is not plan:
        raise ValueError("the plan does not count its broadcasters' staging: prepared_sweep")


def _sweep_broadcasters(plan: Plan, operands, device) -> tuple:
    """``(row, column)`` broadcasters of the sweep: none where every rank
    holds its own copies of the rows of A and columns of B it needs
    (`operands.own_copies`, checked here), else the plan's (``"host"``,
    which needs own copies, as ``"auto"``)."""
    C, k = operands.C, operands.A.shape[1]
    if operands.own_copies is None:
        return grid_broadcasters(C.grid, "auto" if plan.broadcaster == "host"
                                 else plan.broadcaster, device)
    a_rows, b_cols = operands.own_copies
    if a_rows.shape != (C.local.shape[0], k) or b_cols.shape != (k, C.local.shape[1]):
        raise ValueError(f"own_copies must be this rank's {C.local.shape[0]} rows of A and "
                         f"{C.local.shape[1]} columns of B with all {k} of K")
    none = NoBroadcasts()
    return none, none


def check_sweep_operands(A, B, C, integers=None) -> None:
    """Refuse operands the sweep cannot take (the same on every rank);
    `integers`: the plan's staged integers' dtypes
    (:attr:`summa.planning.Plan.host_integers`)."""
    check_operands(A, B, C, dtypes=integers)
    check_layouts(A, B, C)
    if C.backend.is_gpu:
        raise ValueError("out-of-core operands must be host-resident (NumPy backend)")
    # A and B may lie any way (the plan's storage says how they are read); C
    # is written by rows.
    if any(M.local.ndim != 2 for M in (A, B, C)) or not copyable_rows(C.local):
        raise ValueError("out-of-core operands must be 2-D host arrays, C with contiguous rows")


def check_sweep_plan(plan: Plan, A, B, C, device) -> None:
    """Refuse a plan made for another product, grid, dtype or device (C of
    the integer type the plan's staged integers drain into, where it has them)."""
    have = ((A.shape[0], B.shape[1], A.shape[1]), tuple(C.grid.shape), C.dtype.name,
            device.name)
    planned = (tuple(plan.shape), tuple(plan.grid),
               plan.host_integers[2] if plan.host_integers else plan.dtype, plan.backend)
    if not plan.out_of_core:
        raise ValueError("the plan runs in memory, not out of core")
    if have != planned:
        raise ValueError(f"the plan is for (m, n, k), grid, dtype, device {planned}, "
                         f"not {have}")
    # make_plan settles both for GPUs; a plan without them was made otherwise
    if device.is_gpu and (plan.host_copies not in options.HOST_COPIES
                          or not plan.copy_threads):
        raise ValueError(f"a GPU's plan says how host copies go and on how many threads "
                         f"(make_plan), not host_copies={plan.host_copies!r}, "
                         f"copy_threads={plan.copy_threads!r}")
