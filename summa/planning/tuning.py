"""Panel width: the per-backend default and ``"auto"``, chosen by measurement.

``auto`` times this rank's GEMM for a panel of each candidate width (on a
slice of C's rows, so it needs little memory), agrees across the grid on the
slowest rank's times, and takes the narrowest width within 3 % of the best
rate: narrow panels overlap communication sooner and need smaller buffers. The
choice is cached per problem for the life of the process.
"""

from __future__ import annotations

import functools
import time

import numpy as np

from ..runtime.mpi import MPI
from ..device.base import gemm_library, transpose_a_setting, transpose_b_setting
from ..device.traits import traits
from ..host.storage import copyable_rows

__all__ = ["default_panel_width", "auto_panel_width", "panel_width_for", "planned_width",
           "transposes_a", "transposes_b", "column_major", "is_width", "CANDIDATE_WIDTHS"]

#: Widths ``auto`` considers (those wider than K are dropped).
CANDIDATE_WIDTHS = (256, 512, 1024, 2048, 4096, 8192)
#: Rows of C the measurement multiplies into (a slice is representative).
PROBE_ROWS = 4096
_cache: dict = {}


def default_panel_width(backend_name: str, dtype, precision: str | None = None,
                        out_of_core: bool = False) -> int:
    """Panel width used when none is given.

    Wide panels keep each GEMM near the device's peak (the C block is read and
    written once per panel) while leaving several panels to overlap broadcasts
    with. Measured on 2 H200s at N = 32768 (docs/benchmarks.md): 4096 is best
    for float64 (8192 lost 4 %), TF32 needs 8192 (621 against 531 TFLOP/s).
    float16 GEMMs are faster still, so each 4096-wide panel's fixed costs
    (broadcast latency, launches) weigh even more: it takes 8192 like TF32.
    float32 panel GEMMs alone reach 0.955 of one GEMM at 4096 and 0.962 at
    8192, and whole runs gained 1-2 % (NCCL 101.7 against 100.1-101.1, ipc
    102.8 against 101.1): 8192 in memory. Out of core keeps 4096 for float32,
    the width its plans and measurements were made with (wider panels take
    room from the C tiles).
    """
    if not traits(backend_name).gpu:
        return 256
    dtype = np.dtype(dtype)
    if precision == "fp64-int8":
        # Each product's reconstruction passes over its C block once: the
        # wider the panel, the fewer passes per INT8 GEMM (FP64_INT8_WIDTH).
        # Out of core its scratch takes the C tiles' room: with whole rows of
        # C as tiles 16384 left tiles of 2048 rows under 24 GiB, but
        # the planner now cuts fp64-int8's C in both directions (uploading
        # least), and there 16384 ran 60.4 TFLOP/s against 8192's 52.3
        # (docs/benchmarks.md, "Measurements behind the defaults"); the
        # planner takes 8192 where its tiles move fewer bytes
        # (widths.MIN_OOC_WIDTH_INT8).
        return FP64_INT8_OOC_WIDTH if out_of_core else FP64_INT8_WIDTH
    if precision == "tf32" or dtype == np.float16 or (dtype == np.float32 and not out_of_core):
        return 8192
    return 4096


#: Panel width of float64 products on INT8 tensor cores (``fp64-int8``):
#: each panel's product folds its 16 integer products into the C block and
#: reconstructs it (a few passes over C at memory speed), so wide panels
#: keep that share small.
FP64_INT8_WIDTH = 16384
#: ... and out of core (see :func:`default_panel_width`).
FP64_INT8_OOC_WIDTH = 16384


#: GPU GEMMs that run faster reading A column-major (cuBLAS's transposed
#: operand) than row-major, by dtype char: on an H200, one rank's share of
#: N = 32768 (16384 x 32768 x 32768) ran float64 56.6 against 52.1 TFLOP/s,
#: float32 54.4 against 53.4 (docs/benchmarks.md, "Measurements behind the defaults").
TRANSPOSED_A_FASTER = frozenset("fd")


def transposes_a(backend_name: str, dtype, precision=None, schedule: str = "panels") -> bool:
    """Do the panel GEMMs (in memory and out of core) copy each panel of A
    transposed (one scratch buffer of panel width x rows) and read it
    column-major?

    ``SUMMA_TRANSPOSE_A`` decides: ``yes`` (any backend, for tests), ``no``, or
    ``auto``: on GPUs, for the dtypes of :data:`TRANSPOSED_A_FASTER` without
    TF32. Column strips keep A as it is, and so do GPU GEMMs through cuBLASLt
    (``SUMMA_GEMM=cublaslt``), whose plans here take row-major operands only.
    """
    setting = transpose_a_setting()
    if traits(backend_name).gpu and gemm_library() == "cublaslt":
        return False
    if schedule != "panels" or setting == "no":
        return False
    if setting == "yes":
        return True
    return (traits(backend_name).gpu and precision not in ("tf32", "fp64-int8")
            and np.dtype(dtype).char in TRANSPOSED_A_FASTER)


#: GPU GEMMs that run slower reading B column-major (cuBLAS's transposed
#: first operand, C being row-major) than row-major, by dtype char: on an
#: H200, a complex128 panel product of 32768 x 32768 x 2048 ran 46.8 TFLOP/s
#: with both operands column-major (Fortran order) against 49.8 with B
#: row-major and 50.4 with both; 32768 x 5462 x 2048, an out-of-core tile,
#: 47.5 against 48.4 and 50.0; float32 with A column-major (as
#: :data:`TRANSPOSED_A_FASTER` reads it) 51.2 against 52.8
#: (`benchmarks/gemm_forms.py`). End to end (`benchmarks/matrix.py`, float32
#: Fortran-ordered 32768³ under 24 GiB, 8 GiB and the whole GPU), the call
#: again ran 0.890 / 0.900 / 0.914 of ``cupy.matmul`` reading B as it lies
#: and 0.954 / 0.953 / 0.952 reading copies. float64 read B column-major 1-4 %
#: faster and complex64 within 1 %: not here. docs/benchmarks.md,
#: "Measurements behind the defaults".
TRANSPOSED_B_FASTER = frozenset("Df")


def transposes_b(backend_name: str, dtype, precision=None, schedule: str = "panels",
                 columns: bool = False) -> bool:
    """Do the panel GEMMs copy each panel of B that lies by columns
    (`columns`: its transpose's rows, :mod:`summa.host.storage`) into a
    row-major scratch buffer (panel width x columns of C) and read that?

    ``SUMMA_TRANSPOSE_B`` decides: ``yes`` (any backend, for tests), ``no``, or
    ``auto``: on GPUs, for the dtypes of :data:`TRANSPOSED_B_FASTER` (not under
    ``tf32``, whose rate by layout is unmeasured). Never
    where B lies by rows, under column strips, through cuBLASLt (whose plans
    copy column-major operands anyway) or for fp64-int8 (its products lay
    out their own operands).
    """
    setting = transpose_b_setting()
    if not columns or schedule != "panels" or setting == "no" or precision == "fp64-int8":
        return False
    if traits(backend_name).gpu and gemm_library() == "cublaslt":
        return False
    return setting == "yes" or (traits(backend_name).gpu and precision != "tf32"
                                and np.dtype(dtype).char in TRANSPOSED_B_FASTER)


def column_major(x) -> bool:
    """Are the columns of the 2-D `x` contiguous (and its rows not)? (B's
    panels that lie so are what :func:`transposes_b` may copy.)"""
    return copyable_rows(x.T) and not copyable_rows(x)


def is_width(width) -> bool:
    """Is `width` a panel width as such (an integer, not a bool), not
    ``"auto"`` or None, which the planner settles?"""
    return isinstance(width, (int, np.integer)) and not isinstance(width, bool)


def planned_width(width) -> int:
    """A Plan's panel width as the executors take it, checked: an integer
    >= 1 (``"auto"`` and None are the planner's to settle before the run:
    :func:`summa.planning.distributed.plan_distributed`,
    :func:`summa.planning.distributed.settled_plan`)."""
    if not is_width(width) or width < 1:
        raise ValueError(f"a plan's panel width must be an integer >= 1 (\"auto\" is "
                         f"settled by the planner before the run), got {width!r}")
    return int(width)


def auto_panel_width(A, B, C, precision=None, panels_of_a=None,
                     scheme=None) -> tuple[int, bool]:
    """Choose the panel width for ``C += A @ B`` by timing; collective over the grid.

    `panels_of_a` is how the multiply hands A's panels to their GEMMs, made
    as ``panels_of_a(backend, rows, width, dtype, transpose)``
    (:class:`summa.execution.transpose.PanelsOfA`, which the executors hand
    in): each width is timed as its steps run, A's panel copied transposed
    first where :func:`transposes_a` says. None: the panels as they lie.
    `scheme`: fp64-int8's (:attr:`summa.planning.Plan.scheme`: the moduli
    asked), which the GEMMs timed take.

    Returns
    -------
    (int, bool)
        The width, and whether it was measured now (False: taken from the cache).
    """
    grid, backend = C.grid, C.backend
    key = (A.shape, B.shape, C.dtype.str, precision, tuple(grid.shape), backend.name,
           A.layout, B.layout, C.layout)
    if key in _cache:
        return _cache[key], False
    k = A.shape[1]
    widths = [w for w in CANDIDATE_WIDTHS if w <= max(k, CANDIDATE_WIDTHS[0])]
    xp = backend.xp
    rows = min(C.local.shape[0], PROBE_ROWS)
    ncols = C.local.shape[1]
    seconds = []
    if rows and ncols:
        rng = xp.random.default_rng(0)
        widest = widths[-1]
        a = rng.standard_normal((rows, widest)).astype(C.dtype)
        b = rng.standard_normal((widest, ncols)).astype(C.dtype)
        c = xp.zeros((rows, ncols), dtype=C.dtype)
        # Timed as the steps run: A's panel copied transposed first, where it is.
        operand_a = (panels_of_a or _as_they_lie)(backend, rows, widest, C.dtype,
                                                  transposes_a(backend.name, C.dtype, precision))
        for w in widths:
            backend.gemm(1.0, operand_a(a[:, :w]), b[:w], c, precision=precision,
                         scheme=scheme)  # warm-up
            backend.synchronize()
            t0 = time.perf_counter()
            backend.gemm(1.0, operand_a(a[:, :w]), b[:w], c, precision=precision, scheme=scheme)
            backend.synchronize()
            seconds.append((time.perf_counter() - t0) / w)  # seconds per unit of K
        del a, b, c, operand_a
    else:
        seconds = [0.0] * len(widths)
    # The slowest rank sets the pace; every rank decides on the same numbers.
    seconds = grid.comm.allreduce(seconds, op=_elementwise_max())
    best = min(seconds)
    width = next(w for w, s in zip(widths, seconds) if s <= best / 0.97)
    _cache[key] = width
    return width, True


def _as_they_lie(backend, rows: int, width: int, dtype, transpose: bool):
    """A's panels handed to their GEMMs as they lie (no ``panels_of_a``)."""
    return lambda a: a


def _larger_of_each(x, y, datatype=None):
    return [max(a, b) for a, b in zip(x, y)]


@functools.cache
def _elementwise_max():
    """The MPI op of :func:`_larger_of_each`, made at its first use (MPI is
    not started where this module is imported to plan)."""
    return MPI.Op.Create(_larger_of_each, commute=True)


def panel_width_for(A, B, C, panel_width, precision,
                    panels_of_a=None, scheme=None) -> tuple[int, bool]:
    """The panel width SUMMA on DistMatrix operands A, B, C uses (the
    backend's default for None; measured for ``"auto"``, once per problem,
    A's panels formed by `panels_of_a` and fp64-int8's `scheme` as
    :func:`auto_panel_width` takes them), and whether it was measured in
    this call: the DistMatrix entry points' one decision of the planner's
    (a Plan's width is already an int)."""
    backend, grid = C.backend, C.grid
    measured = False
    if panel_width is None:
        panel_width = default_panel_width(backend.name, C.dtype, precision)
    elif isinstance(panel_width, str) and panel_width == "auto":
        if grid.size == 1:  # one rank runs a single GEMM: nothing to choose
            panel_width = default_panel_width(backend.name, C.dtype, precision)
        else:
            panel_width, measured = auto_panel_width(A, B, C, precision, panels_of_a, scheme)
    if not isinstance(panel_width, (int, np.integer)) or panel_width < 1:
        raise ValueError(f"panel width must be an integer >= 1 or 'auto', got {panel_width!r}")
    return int(panel_width), measured
