"""Every decision of a multiply, made once before it runs.

:func:`make_plan` (:mod:`summa.planning.planner`), from what a call asks
(:class:`PlanRequest`, :mod:`summa.planning.request`), returns a frozen, printable
:class:`Plan` (:mod:`summa.planning.plan`): grid, memory mode and tiles
(:mod:`summa.planning.memory`), panel width (:mod:`summa.planning.tuning`, out of core
:mod:`summa.planning.widths`), the SUMMA schedule as data
(:mod:`summa.planning.schedule`), the broadcasters
(:mod:`summa.planning.selection`) and the predicted time of the performance
model (:mod:`summa.planning.model`, by a machine's profile
:mod:`summa.planning.profile`, for a Plan :mod:`summa.planning.prediction`).
The checks of a product's inputs (:mod:`summa.planning.checks`) and the
Plan of arrays held on one rank, final for the arrays as they lie
(:mod:`summa.planning.arrays`), come before any run.
``summa plan`` prints what a run takes (:mod:`summa.planning.report`). The
planner's public names are re-exported here.
"""

from .plan import Machine, Plan
from .planner import make_plan, restage
from .request import PlanRequest

__all__ = ["Machine", "Plan", "PlanRequest", "make_plan", "restage"]
