"""What a call asks of the plan of a product: one description of its options.

:class:`PlanRequest` holds the options a product's caller chooses (grid,
memory mode and budget, transposes, panel width, lookahead, schedule,
precision, broadcaster), with their defaults. The public entry points
(``summa.matmul``, :class:`summa.Matmul`, ``DistMatrix.gemm``,
``summa.multiply_files``) keep them written out in their NumPy-shaped
signatures and build one request; the functions beneath them, down to
:func:`summa.planning.make_plan`, take the request instead of restating
the options. It imports nothing of summa's: every layer may take it.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PlanRequest"]


@dataclass(frozen=True)
class PlanRequest:
    """The options of one product that its plan (:func:`summa.planning.make_plan`)
    decides by, as its caller asked them; frozen, so one request may be
    kept (:class:`summa.Matmul`) and passed to other ranks (the pool's
    workers).

    Parameters
    ----------
    grid : tuple, str or None
        The process grid ``(Pr, Pc)`` (or ``"PrxPc"``); None: chosen for
        the shape (:func:`summa.distribution.grid.grid_for`). Where the
        caller already holds a :class:`summa.distribution.grid.ProcessGrid`
        (``DistMatrix``), its shape.
    out_of_core : bool or None
        True: out of core; False: in memory (no fallback); None: decided by
        the planner (out of core where `device_memory` is given, where the
        operands are host-held on GPUs, or where memory would not fit).
    device_memory : str, int or None
        Device bytes per rank out of core (``"16GiB"``); None: 90 % of the
        free device memory.
    trans_a, trans_b : {"N", "T", "C"}
        op(A) and op(B): as given, transposed, or conjugate-transposed.
    panel_width : int, "auto" or None
        Columns of A (rows of B) per SUMMA step; None: the default for the
        mode (:func:`summa.planning.tuning.default_panel_width`); ``"auto"``:
        tuned at the run.
    lookahead : int
        Panels broadcast ahead of the one being multiplied.
    schedule : {"panels", "strips"}
        How K is cut: SUMMA's panels, or whole strips (a grid of one
        column, in device memory only).
    precision : str or None
        The GEMMs' precision (``"fp64-int8"``: Ozaki's scheme on int8
        tensor cores); None: the dtype's own.
    broadcaster : str
        The panels' broadcaster: ``"auto"`` or one of
        :data:`summa.transports.broadcasters.BROADCASTERS` (``"nccl"``,
        ``"cuda-aware"``, ``"mpi"``, ``"ipc"``).
    """

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
