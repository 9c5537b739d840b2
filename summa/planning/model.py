"""Performance model of SUMMA (alpha-beta-gamma), from a calibration profile.

For a ``Pr x Pc`` grid, each rank owns an ``m x n`` block of C (m = ceil(M/Pr),
n = ceil(N/Pc)) and steps through ``s = ceil(K/nb)`` panels. Per panel:

* compute  ``t_c = 2 m n nb / gamma(m n, nb)``: the GEMM rate measured for
  that panel shape (nearest calibrated shape, in log space);
* communication ``t_b = bcast(m nb bytes, Pc) + bcast(nb n bytes, Pr)``, each
  broadcast ``alpha(P) + bytes / beta(P)`` as fitted for that communicator size
  (beyond the sizes calibrated: alpha grows with log2 P, beta stays).

With lookahead, where broadcasts progress while the GEMM runs (GPUs: the
GEMM runs on the device while NCCL or MPI moves data), the next panel's
broadcasts hide behind the current GEMM: ``T = t_b + s * (max(S t_c, t_b) + o)``
(one broadcast fills the pipeline), where ``S >= 1`` is how much slower a GEMM
runs beside a broadcast (NCCL's kernels take SMs; calibrated per broadcaster as
``gemm_slowdown``, 1 where absent). On a ``2 x 1`` grid where a rank receives
at most two panels it multiplies its own ``s_o`` first while all broadcasts run:
``T = max(s_o S t_c, s t_b) + (s - s_o) t_c + s o``. Direct copies (``ipc``: copy
engines, no slowdown, own panels first while the peers' blocks open in ``c``):
``T = max(s_o t_c, c + t_b) + (s - s_o) max(t_c, t_b) + s o``, with ``c = 0``
where the blocks stay open from the multiply before (the profile's
``device_memory``: blocks up to 1/64 of it; the repeated multiplies ``bench``
times). Without lookahead,
or on CPU ranks where MPI progresses only while the rank is inside MPI,
``T = s * (t_c + t_b + o)``.
``o`` is the per-panel overhead (loop, panel copies, synchronisation) fitted by
calibration for that rank count. One rank does a single GEMM:
``T = 2 M N K / gamma``. (TFLOP/s use 8 M N K for complex dtypes.)

The rates come from a calibration profile (:class:`summa.planning.profile.Profile`:
its format, the profiles shipped by hardware name).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from ..distribution.grid import grid_for, grid_shapes
from .profile import Profile, profile_backend
from .schedule import OWN_FIRST_RECEIVES
from .selection import connect_seconds
from .tuning import default_panel_width
from ..transports.ipc import stays_open

__all__ = ["Prediction", "TimeSplit", "predict", "RunSetting", "sweep", "SWEEP_RANKS",
           "recommend", "gemm_flops"]


def gemm_flops(dtype, m: int, n: int, k: int) -> int:
    """Real floating-point operations of an ``m x k`` by ``k x n`` product
    of `dtype`: 2 m n k, four times that for complex (a complex
    multiply-add is four real multiplies and four adds). The figure every
    TFLOP/s of summa's is a rate of."""
    return (8 if np.dtype(dtype).kind == "c" else 2) * m * n * k



@dataclass
class Prediction:
    """Model output for one configuration."""

    seconds: float
    tflops: float
    efficiency: float
    panel_compute: float
    panel_comm: float
    panels: int
    grid: tuple
    panel_width: int
    #: The broadcaster assumed (None on one rank).
    comm: str | None = None
    #: Panels each rank receives from others (by broadcast or direct copy).
    received: int = 0

    def as_dict(self) -> dict:
        return dict(self.__dict__)


#: The parts of a :class:`TimeSplit` that can bound a run.
BOUNDS = ("gemm", "host_link", "host_memory", "gpu_links")
#: The parts that are one set of copies seen from two sides, the GPU's link
#: and the node's memory they pass through: they run at once, so where the
#: copies add to the time (in memory), they add the longer of the two.
COPIES = ("host_link", "host_memory")


@dataclass(frozen=True)
class TimeSplit:
    """Where the time of one multiply goes, on one rank (all alike).

    The parts in :attr:`overlapped` run at once (GEMMs on the device, copies
    on copy engines, broadcasts beside them), so the slowest of them bounds
    the run; the other counted parts add to it (the two sides of the host
    copies, :data:`COPIES`, the longer of them), and so does :attr:`exposed`.
    :attr:`seconds` combines them so::

        seconds = max(overlapped parts) + the other counted parts + exposed

    Attributes
    ----------
    gemm : float
        Seconds of the GEMMs alone, at the profile's rate for their shape.
    host_link : float or None
        Seconds of the copies between host memory and the GPU at the
        profile's ``host_link`` rates; None where it has none (not counted).
    gpu_links : float
        Seconds of the broadcasts (or direct copies) between GPUs.
    exposed : float
        What does not overlap: the SUMMA pipeline's fill, the per-panel
        overhead and GEMMs slowed beside broadcasts (the model's time less
        the larger of the GEMMs and broadcasts), and out of core the first
        upload and the last write-back.
    overlapped : tuple
        Names of the parts that run at once (of :data:`BOUNDS`).
    disk : float or None
        Seconds to read A and B from files and write C (``multiply`` on
        .npy files), where the profile has disk rates: beside the time, not
        in it (only files pay it).
    host_memory : float or None
        Seconds the node's host memory takes to carry what all its ranks'
        host copies read and write (:meth:`Profile.host_memory_seconds`):
        the same for every rank of the node, since they share it; None
        where the profile has no ``host_memory`` (not counted).
    """

    gemm: float
    host_link: float | None
    gpu_links: float
    exposed: float
    overlapped: tuple
    disk: float | None = None
    host_memory: float | None = None

    def parts(self) -> dict:
        """The counted parts that can bound the run, by name."""
        return {name: getattr(self, name) for name in BOUNDS if getattr(self, name) is not None}

    @property
    def seconds(self) -> float:
        parts = self.parts()
        at_once = [value for name, value in parts.items() if name in self.overlapped]
        serial = {name: value for name, value in parts.items() if name not in self.overlapped}
        copies = [serial.pop(name) for name in COPIES if name in serial]
        return (max(at_once, default=0.0) + self.exposed + max(copies, default=0.0)
                + sum(serial.values()))

    def bound(self) -> tuple[str, float]:
        """``(name, seconds)`` of the largest part: what bounds the run."""
        return max(self.parts().items(), key=lambda item: item[1])

    def as_dict(self) -> dict:
        return {**{name: getattr(self, name) for name in BOUNDS}, "exposed": self.exposed,
                "overlapped": list(self.overlapped), "disk": self.disk}


@dataclass(frozen=True)
class RunSetting:
    """How a predicted run goes beside its shape, grid and panel width.

    Attributes
    ----------
    lookahead : int
        Panels broadcast ahead of the GEMMs.
    comm : str or None
        The broadcaster (None: the fastest the profile calibrated).
    precision : str or None
        The GEMMs' precision (``tf32``, ``fp64-int8``, ...).
    ranks_per_node : int or None
        Ranks sharing a node (None: all of them on one).
    """

    lookahead: int = 1
    comm: str | None = None
    precision: object = None
    ranks_per_node: int | None = None


def predict(profile: Profile, m: int, n: int, k: int, dtype: str, grid: tuple,
            panel_width: int, setting: RunSetting = RunSetting()) -> Prediction:
    """Predicted time of ``C = A @ B`` (M x K times K x N) on a `grid` of ranks,
    run as `setting` (:class:`RunSetting`) says.

    Efficiency is against P times the one-rank rate of the per-rank share done
    as one GEMM, the same "ideal" that ``summa bench`` measures. Without
    ``setting.comm``, the fastest broadcaster in the profile is assumed (as ``--comm
    auto`` picks NCCL over host-staged MPI), ``ipc`` only where all ranks are on
    one node (``setting.ranks_per_node``, default all) and no more than it was
    calibrated on.
    """
    lookahead, comm, precision = setting.lookahead, setting.comm, setting.precision
    ranks_per_node = setting.ranks_per_node
    pr, pc = grid
    p = pr * pc
    rpn = ranks_per_node or p
    itemsize = np.dtype(dtype).itemsize
    flops = gemm_flops(dtype, m, n, k)
    ml, nl = -(-m // pr), -(-n // pc)
    # Rates are 2 m n k / seconds of samples in the same dtype, so complex
    # costs are already in them.
    ideal = 2.0 * ml * nl * k / profile.gemm_rate(ml, nl, k, dtype, precision, rpn)
    if p == 1:
        seconds = ideal
        return Prediction(seconds, flops / seconds / 1e12, 1.0, seconds, 0.0, 1, tuple(grid),
                          panel_width)
    if comm is None:  # as --comm auto would: the fastest broadcaster calibrated
        # ipc copies only within a node: no more ranks than it was calibrated on
        ipc_ranks = max((b["ranks"] for b in profile.bcast if b["comm"] == "ipc"), default=0)
        modes = [mode for mode in profile.comm_modes()
                 if mode != "ipc" or (rpn >= p and ipc_ranks >= p)]
        return min((predict(profile, m, n, k, dtype, grid, panel_width,
                            replace(setting, comm=mode))
                    for mode in modes or ["mpi"]), key=lambda q: q.seconds)
    nb = min(panel_width, k)
    steps = -(-k // nb)
    t_c = 2.0 * ml * nl * nb / profile.gemm_rate(ml, nl, nb, dtype, precision, rpn)
    t_b = (profile.bcast_seconds(ml * nb * itemsize, pc, comm)
           + profile.bcast_seconds(nb * nl * itemsize, pr, comm))
    overhead = profile.panel_overhead(p)
    if comm == "ipc" and lookahead > 0:
        seconds, fetched = _direct_copies_seconds((ml, nl, k), grid, nb, steps,
                                                  (t_c, t_b, overhead), itemsize,
                                                  profile.device_memory)
        return Prediction(seconds, flops / seconds / 1e12, ideal / seconds, t_c, t_b, steps,
                          tuple(grid), nb, comm, fetched)
    seconds = _broadcast_loop_seconds(profile, grid, (k, nb), (t_c, t_b, overhead), comm,
                                      lookahead)
    return Prediction(seconds, flops / seconds / 1e12, ideal / seconds, t_c, t_b, steps,
                      tuple(grid), nb, comm, steps)


def _broadcast_loop_seconds(profile: Profile, grid: tuple, widths: tuple, times: tuple,
                            comm: str, lookahead: int) -> float:
    """Seconds of the SUMMA loop whose panels are broadcast (every
    broadcaster but ``ipc``'s direct copies): `widths` ``(K, panel width)``,
    `times` ``(GEMM, broadcasts, overhead)`` a panel; with `lookahead` and a
    broadcaster that overlaps the GEMMs, the slower of the two a panel (the
    GEMMs slowed beside the broadcasts), else their sum."""
    (pr, pc), (k, nb), (t_c, t_b, overhead) = grid, widths, times
    steps = -(-k // nb)
    # Own panels first (summa.planning.schedule.own_first): on 2 x 1, each rank's
    # received panels are adjacent; with more ranks a middle one's are not.
    own = -(-(-(-k // pr)) // nb) if (pr, pc) == (2, 1) else 0  # panels of its own B rows
    if lookahead > 0 and profile.overlaps(comm) and 0 < steps - own <= OWN_FIRST_RECEIVES:
        # Each rank multiplies its own panels first while every broadcast runs.
        shared = profile.gemm_slowdown(comm, max(pr, pc))
        return max(own * shared * t_c, steps * t_b) + (steps - own) * t_c + steps * overhead
    if lookahead > 0 and profile.overlaps(comm):
        shared = profile.gemm_slowdown(comm, max(pr, pc))
        return t_b + steps * (max(shared * t_c, t_b) + overhead)
    return steps * (t_c + t_b + overhead)


def _direct_copies_seconds(local, grid, nb, steps, times, itemsize,
                           device_memory=None) -> tuple[float, int]:
    """SUMMA with direct copies (``ipc``; summa.planning.selection): a rank multiplies
    the panels it holds first (on a 1-D grid, its share of K; on a 2-D grid the
    slowest rank may hold none) while it opens its peers' blocks, unless they
    are open from the multiply before (blocks that stay open on a device of
    `device_memory` bytes, where the profile says: summa/transports/ipc.py); then each
    fetched panel's copy (copy engines: no SMs taken, so no GEMM slowdown) runs
    behind the GEMM before it. `local`: ``(ml, nl, k)``, a rank's block of C
    and all of K; `grid`: ``(pr, pc)``; `times`: ``(t_c, t_b, overhead)``,
    one panel's GEMM, its broadcasts and the per-panel overhead in seconds.
    Returns ``(seconds, panels fetched)``."""
    ml, nl, k = local
    pr, pc = grid
    t_c, t_b, overhead = times
    own = min(-(-(-(-k // max(pr, pc))) // nb), steps) if min(pr, pc) == 1 else 0
    blocks = (ml * -(-k // pc) * itemsize, -(-k // pr) * nl * itemsize)
    open_already = device_memory and all(stays_open(b, device_memory) for b in blocks)
    connect = 0.0 if open_already else connect_seconds((pr, pc), *blocks)
    fetched = steps - own
    if not fetched:
        return steps * (t_c + overhead), 0
    return max(own * t_c, connect + t_b) + fetched * max(t_c, t_b) + steps * overhead, fetched


def recommend(profile: Profile, m: int, n: int, k: int, dtype: str, ranks: int,
              widths=(256, 512, 1024, 2048, 4096, 8192), **kwargs) -> Prediction:
    """The fastest predicted grid and panel width for `ranks` ranks; among
    grids predicted alike, the one ``bench`` takes by default
    (:func:`summa.distribution.grid.grid_for`: the model does not tell a block from its
    transpose, cuBLAS does).

    Only widths inside the range of panel widths the profile measured are
    considered: outside it the nearest sample would stand in for a GEMM shape
    it does not describe.
    """
    backend = profile_backend(profile)
    # and the width bench and multiply take (fp64-int8's is wider than the list)
    widths = sorted(set(widths) | {default_panel_width(backend, dtype, kwargs.get("precision"))})
    sampled = [g["k"] for g in profile.gemm if g["dtype"] == dtype]
    lo, hi = (min(sampled), max(sampled)) if sampled else (0, float("inf"))
    usable = [w for w in widths if lo <= w <= hi and w <= max(k, widths[0])] \
        or [min(widths, key=lambda w: abs(math.log(w / max(lo, 1))))]
    options = [predict(profile, m, n, k, dtype, g, w, RunSetting(**kwargs))
               for g in grid_shapes(ranks) for w in usable]
    default = grid_for(ranks, m, n, backend, dtype)
    return min(options, key=lambda pred: (pred.seconds, pred.grid != default))


#: Rank counts of scaling sweeps and model curves by default (up to 8 nodes of 8 GPUs).
SWEEP_RANKS = (1, 2, 4, 8, 16, 32, 64)


def sweep(profile: Profile, size: int, dtype: str, ranks=SWEEP_RANKS,
          weak: bool = False, **kwargs) -> list[tuple[int, int, Prediction]]:
    """Strong scaling (fixed `size`) or weak scaling (``size * P**(1/3)``, constant
    work per rank) over `ranks`, each at its recommended grid and panel width.

    Returns ``[(ranks, N, prediction), ...]``.
    """
    rows = []
    for p in ranks:
        n = int(round(size * p ** (1 / 3))) if weak else size
        rows.append((p, n, recommend(profile, n, n, n, dtype, p, **kwargs)))
    return rows
