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

A profile is JSON: ``{"machine": ..., "gemm": [{"dtype", "precision",
"ranks_per_node", "m", "n", "k", "seconds"}, ...], "bcast": [{"comm",
"ranks", "alpha", "beta", "overlap", "gemm_slowdown"}, ...], "overhead": [{"ranks",
"seconds"}, ...], "device_memory": bytes per GPU, "gpus": GPUs in all, "nodes": the nodes
they sit on (each optional)}``; ``summa calibrate``
writes one, and profiles of machines we cannot run on (e.g. 8 GPUs per node on NVLink, nodes on
InfiniBand) can be written by hand in the same form. Optional, for the time split of a plan
(:class:`TimeSplit`): ``"host_link": {"name", "h2d_gbs", "d2h_gbs", "pinned_h2d_gbs",
"note", "concurrency"}`` (GB/s per GPU between pageable host memory and the GPU, staged
through page-locked chunks, while the node's GPUs copy at once), ``"host_memory":
{"copy_gbs": [[copiers, GB/s], ...], "cores", "estimate", "note"}`` (a node's
pageable -> page-locked memcpy rate with that many threads copying at once, as
``summa calibrate`` measures it; the cores of a node, which the copy threads divide;
whether the figures are an estimate), ``"disk": {"read_gbs", "write_gbs", "note"}`` and
``"peer_access"`` (whether a node's GPUs read each other's memory; absent: they do).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, replace

import numpy as np

from ..distribution.grid import grid_for, grid_shapes
from .schedule import OWN_FIRST_RECEIVES
from .selection import connect_seconds
from .tuning import default_panel_width
from ..transports.ipc import stays_open

__all__ = ["Profile", "Prediction", "TimeSplit", "predict", "RunSetting", "sweep", "SWEEP_RANKS",
           "recommend", "HARDWARE", "DEFAULT_HARDWARE", "hardware_profile", "shipped_profile",
           "gemm_flops"]


def gemm_flops(dtype, m: int, n: int, k: int) -> int:
    """Real floating-point operations of an ``m x k`` by ``k x n`` product
    of `dtype`: 2 m n k, four times that for complex (a complex
    multiply-add is four real multiplies and four adds). The figure every
    TFLOP/s of summa's is a rate of."""
    return (8 if np.dtype(dtype).kind == "c" else 2) * m * n * k


#: The hardware whose profiles ship with summa (``--hardware NAME``): what each describes.
HARDWARE = {"h200": "2 H200s with NVLink, measured by summa calibrate (the default)",
            "rtx3090x8": "8 GeForce RTX 3090 (24 GB) over PCIe 4.0, no peer access: datasheet "
                         "figures, not a measurement"}
#: The hardware predictions assume where none is named.
DEFAULT_HARDWARE = "h200"


def hardware_profile(name: str) -> str:
    """The shipped profile file of the hardware `name` (a key of :data:`HARDWARE`)."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # summa/
    return os.path.join(package, "profiles", f"{name}.json")


def shipped_profile() -> str:
    """The profile predictions use by default (:data:`DEFAULT_HARDWARE`'s:
    2 H200s, calibrated 2026-11-30)."""
    return hardware_profile(DEFAULT_HARDWARE)


#: The inverse-distance weights' power, on squared distances: 2 weighs each
#: sample by distance**-4, so a shape between two measured ones takes their
#: rates, not those of the many small-K samples further off (fp64-int8 runs
#: 14-22 TFLOP/s at K = 1024 and 58 from 8192 on: with power 1 a 32768² x
#: 16384 product was predicted at 52.8 between samples at 57.6-58.1;
#: leave-one-out over the shipped profile's samples: float64 2.3 -> 2.1 %
#: mean error, fp64-int8 31 -> 24 %, its edges).
RATE_POWER = 2


#: Bytes of host memory traffic a byte memcpy'd into a page-locked chunk
#: makes: read from the source, the chunk's lines read before they are
#: written (ordinary stores: a chunk, 8 MiB, is below glibc's threshold for
#: stores that bypass the caches), written. So a staged upload, which the
#: DMA also reads from the chunk, costs 4/3 of a memcpy'd byte: on one H200
#: host 16 threads staged 42.9 GB/s up alone against 59 GB/s of memcpy,
#: 0.73 (h200.json's host_link and host_memory).
MEMCPY_TRAFFIC = 3


class Profile:
    """Calibrated rates of one machine (see module docstring for the format)."""

    def __init__(self, data: dict):
        if not isinstance(data, dict) or not data.get("gemm"):
            raise ValueError("a profile needs a non-empty 'gemm' list")
        self.data = data
        self.gemm = data["gemm"]
        self.bcast = data.get("bcast", [])

    @classmethod
    def load(cls, path) -> "Profile":
        try:
            with open(path) as fh:
                return cls(json.load(fh))
        except FileNotFoundError:
            raise ValueError(f"{path}: no such profile (run: python -m summa calibrate "
                             f"-o {path})") from None
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not a JSON profile ({exc})") from None

    def save(self, path) -> None:
        with open(path, "w") as fh:
            json.dump(self.data, fh, indent=1)

    def merge(self, other: "Profile") -> "Profile":
        """This profile with `other`'s samples added (e.g. another rank count)."""
        data = dict(self.data)
        data["gemm"] = self.gemm + other.gemm
        theirs = {o["ranks"] for o in other.data.get("overhead", [])}
        data["overhead"] = [o for o in self.data.get("overhead", [])
                            if o["ranks"] not in theirs] + other.data.get("overhead", [])
        ranks = [p.data["ranks"] for p in (self, other) if p.data.get("ranks")]
        if ranks:  # the machine is as large as the most ranks calibrated on it
            data["ranks"] = max(ranks)
        data["bcast"] = [b for b in self.bcast if (b["comm"], b["ranks"]) not in
                         {(o["comm"], o["ranks"]) for o in other.bcast}] + other.bcast
        if other.host_memory():  # its copier counts added, theirs measured last
            rates = dict((c, g) for c, g in (self.host_memory() or {}).get("copy_gbs", []))
            rates.update((c, g) for c, g in other.host_memory()["copy_gbs"])
            data["host_memory"] = dict(other.host_memory(),
                                       copy_gbs=[[c, g] for c, g in sorted(rates.items())])
        return Profile(data)

    def gemm_rate(self, m: int, n: int, k: int, dtype: str, precision=None,
                  ranks_per_node: int = 1) -> float:
        """Flop/s of one ``(m x k) @ (k x n)`` GEMM: an inverse-distance-weighted
        mean of the calibrated rates of this dtype, distance measured in
        ``(log mn, log k)`` (weights ``distance**-2 RATE_POWER``; an exact
        shape returns its own rate), preferring samples taken with as many
        ranks per node."""
        precision = precision or "default"
        cands = [g for g in self.gemm if g["dtype"] == dtype
                 and g.get("precision", "default") == precision]
        if not cands:
            raise ValueError(f"the profile has no GEMM samples for {dtype}"
                             + ("" if precision == "default" else f"/{precision}"))
        rpn = min({g.get("ranks_per_node", 1) for g in cands},
                  key=lambda r: (abs(math.log(r / ranks_per_node)), -r))
        cands = [g for g in cands if g.get("ranks_per_node", 1) == rpn]

        def distance(g):
            return (math.log(max(g["m"] * g["n"], 1) / max(m * n, 1)) ** 2
                    + math.log(max(g["k"], 1) / max(k, 1)) ** 2)
        weights = rates = 0.0
        for g in cands:
            rate = 2.0 * g["m"] * g["n"] * g["k"] / g["seconds"]
            d = distance(g)
            if d < 1e-12:
                return rate
            weights += d ** -RATE_POWER
            rates += rate * d ** -RATE_POWER
        return rates / weights

    def bcast_seconds(self, nbytes: float, ranks: int, comm: str) -> float:
        """Seconds to broadcast `nbytes` among `ranks` ranks with broadcaster `comm`."""
        if ranks <= 1 or nbytes == 0:
            return 0.0
        fits = [b for b in self.bcast if b["comm"] == comm]
        if not fits:
            raise ValueError(f"the profile has no broadcast samples for comm {comm!r}")
        exact = [b for b in fits if b["ranks"] == ranks]
        if exact:
            fit = exact[0]
            return fit["alpha"] + nbytes / fit["beta"]
        # Extrapolate from the largest calibrated communicator: latency grows
        # with the depth of a broadcast tree, pipelined bandwidth does not.
        fit = max(fits, key=lambda b: b["ranks"])
        scale = math.log2(ranks) / max(math.log2(fit["ranks"]), 1.0)
        return fit["alpha"] * scale + nbytes / fit["beta"]

    @property
    def device_memory(self) -> int | None:
        """Bytes of memory per GPU, where the profile says."""
        value = self.data.get("device_memory")
        return int(value) if value else None

    @property
    def gpus(self) -> int | None:
        """The GPUs (or ranks) of the machine described: ``"gpus"``, else the
        ``"ranks"`` summa calibrate ran on; None where it says neither."""
        value = self.data.get("gpus") or self.data.get("ranks")
        return int(value) if value else None

    @property
    def nodes(self) -> int:
        """The nodes those GPUs sit on (absent: one)."""
        return max(1, int(self.data.get("nodes") or 1))

    @property
    def peer_access(self) -> bool:
        """Whether a node's GPUs read each other's memory (absent: they do).
        Without it, out of core each GPU uploads every panel part it needs
        itself (:func:`summa.execution.outofcore.summa_out_of_core`'s `own_copies`)."""
        return bool(self.data.get("peer_access", True))

    def host_link(self) -> dict | None:
        """The profile's ``host_link`` section (rates in GB/s), or None."""
        link = self.data.get("host_link")
        return link if link and link.get("h2d_gbs") and link.get("d2h_gbs") else None

    def host_seconds(self, up: float, down: float) -> float | None:
        """Seconds one GPU takes to move `up` bytes from host memory and
        `down` bytes back at the profile's host-link rates (None: it has
        none). The two directions are added: the copies of one direction
        take the host threads and memory bandwidth the other would use."""
        link = self.host_link()
        if link is None:
            return None
        return up / (link["h2d_gbs"] * 1e9) + down / (link["d2h_gbs"] * 1e9)

    def host_memory(self) -> dict | None:
        """The profile's ``host_memory`` section (memcpy GB/s by copiers), or None."""
        section = self.data.get("host_memory")
        return section if section and section.get("copy_gbs") else None

    def host_copy_gbs(self, copiers: int) -> float | None:
        """GB/s a node's `copiers` threads memcpy from pageable to page-locked
        memory together (None: the profile has no ``host_memory``): between
        calibrated counts, linear; past the most, the most's rate (the
        memory's bandwidth is spent); below the fewest, that count's rate a
        thread (one thread copies no faster than its share)."""
        section = self.host_memory()
        if section is None:
            return None
        samples = sorted((int(c), float(gbs)) for c, gbs in section["copy_gbs"])
        copiers = max(1, int(copiers))
        (few, slow), (most, fast) = samples[0], samples[-1]
        if copiers <= few:
            return slow * copiers / few
        if copiers >= most:
            return fast
        return float(np.interp(copiers, [c for c, _ in samples], [g for _, g in samples]))

    def host_memory_seconds(self, traffic: float, copiers: int) -> float | None:
        """Seconds a node's memory takes to carry `traffic` bytes (each byte
        read or written once, by the host's threads or the GPUs' DMA) while
        `copiers` threads copy: :data:`MEMCPY_TRAFFIC` times
        :meth:`host_copy_gbs`. None where the profile has no ``host_memory``."""
        rate = self.host_copy_gbs(copiers)
        return None if rate is None else traffic / (MEMCPY_TRAFFIC * rate * 1e9)

    @property
    def cores(self) -> int | None:
        """A node's cores, where the profile's ``host_memory`` says (the copy
        threads of a plan for it divide them)."""
        value = (self.data.get("host_memory") or {}).get("cores")
        return int(value) if value else None

    def disk_seconds(self, read: float, write: float) -> float | None:
        """Seconds to read `read` and write `write` bytes at the profile's
        disk rates (None: it has none)."""
        disk = self.data.get("disk")
        if not disk or not disk.get("read_gbs") or not disk.get("write_gbs"):
            return None
        return read / (disk["read_gbs"] * 1e9) + write / (disk["write_gbs"] * 1e9)

    def comm_modes(self) -> list[str]:
        return sorted({b["comm"] for b in self.bcast})

    def overlaps(self, comm: str) -> bool:
        """Whether broadcasts of `comm` progress while a GEMM runs."""
        return any(b.get("overlap", True) for b in self.bcast if b["comm"] == comm)

    def gemm_slowdown(self, comm: str, ranks: int) -> float:
        """How much longer GEMMs take beside broadcasts of `comm` (nearest
        calibrated communicator size; 1 where not measured)."""
        fits = [b for b in self.bcast if b["comm"] == comm]
        if not fits:
            return 1.0
        fit = min(fits, key=lambda b: abs(math.log(b["ranks"] / max(ranks, 1))))
        return float(fit.get("gemm_slowdown", 1.0))

    def panel_overhead(self, ranks: int) -> float:
        """Fixed seconds per SUMMA step at `ranks` ranks (nearest calibrated count)."""
        rows = self.data.get("overhead", [])
        if not rows:
            return 0.0
        return min(rows, key=lambda r: abs(math.log(r["ranks"] / ranks)))["seconds"]


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


def profile_backend(profile: Profile) -> str:
    """The backend name (``cupy`` or ``numpy``) whose runs `profile` measured."""
    return "cupy" if str(profile.data.get("backend", "")).startswith("cupy") else "numpy"


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
