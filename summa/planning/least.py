"""The least device budget any out-of-core plan of a product can take.

A budget under it (``--device-memory 1B``) is refused from the call's own
arguments, before the backend starts: on a GPU machine CuPy's import and
CUDA's start took 8.7 s before the planner said the same. The figure is a
floor, never more than the planner's least plan needs
(tests/planning/test_least.py holds the two side by side), so what it
refuses the planner would refuse too.
"""

from __future__ import annotations

from .request import PlanRequest
from .widths import LEAST_OOC_WIDTH
from .tuning import is_width
from .units import format_bytes, parse_bytes

__all__ = ["least_budget", "check_least_budget"]


def least_budget(k: int, itemsize: int, panel_width=None) -> tuple[int, int]:
    """``(bytes, width)``: the device bytes of the smallest out-of-core step
    of a product with inner dimension `k` in elements of `itemsize` bytes
    (one element of C, one row of A's panel and one column of B's), and
    that panel's width: `panel_width` where one is given, else the narrowest
    the planner takes (:data:`summa.planning.widths.LEAST_OOC_WIDTH`),
    at most `k`."""
    width = int(panel_width) if is_width(panel_width) else LEAST_OOC_WIDTH
    width = max(1, min(width, int(k)))
    return itemsize * (1 + 2 * width), width


def check_least_budget(shape, itemsize: int, request: PlanRequest) -> None:
    """Refuse the `request`'s `device_memory` (as given: ``"16GiB"``, bytes)
    under :func:`least_budget` (of its `panel_width`) for a product of
    `shape` ``(m, n, k)``, where the budget applies (out of core may be
    taken: its `out_of_core` not False, its `schedule` ``"panels"``). Pure:
    every rank that knows the shape decides the same, with no backend and
    no communication.

    Raises
    ------
    ValueError
        A budget that is not a size, or one that cannot hold the least
        step, in one line saying what that step takes.
    """
    if request.device_memory is None or request.out_of_core is False or \
            request.schedule != "panels":
        return
    budget = parse_bytes(request.device_memory)
    if min(int(x) for x in shape) <= 0:
        return  # an empty product takes no tiles
    least, width = least_budget(shape[2], itemsize, request.panel_width)
    if budget < least:
        raise ValueError(f"a device budget of {format_bytes(budget)} is too small for any "
                         f"out-of-core tile: the least (one element of C with one row and one "
                         f"column of {width}-wide panels) takes {format_bytes(least)}; give "
                         "each rank more (--device-memory, device_memory=)")
