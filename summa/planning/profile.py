"""The profile: one machine's measured rates (GEMMs by shape, broadcasts,
per-panel overhead, host link, host memory, disk), read from JSON, merged
across calibrations, and asked for the rate of one operation; the profiles
shipped by hardware name (``--hardware``). What a whole product's time is
by those rates is :mod:`summa.planning.model`'s.

A profile is JSON: ``{"machine": ..., "gemm": [{"dtype", "precision",
"ranks_per_node", "m", "n", "k", "seconds"}, ...], "bcast": [{"comm",
"ranks", "alpha", "beta", "overlap", "gemm_slowdown"}, ...], "overhead": [{"ranks",
"seconds"}, ...], "device_memory": bytes per GPU, "gpus": GPUs in all, "nodes": the nodes
they sit on (each optional)}``; ``summa calibrate``
writes one, and profiles of machines we cannot run on (e.g. 8 GPUs per node on NVLink, nodes on
InfiniBand) can be written by hand in the same form. Optional, for the time split of a plan
(:class:`summa.planning.model.TimeSplit`): ``"host_link": {"name", "h2d_gbs", "d2h_gbs",
"pinned_h2d_gbs", "pinned_d2h_gbs", "note", "concurrency", "gpus"}`` (GB/s per GPU between
pageable host memory and the GPU, staged through page-locked chunks, while the node's GPUs copy
at once, as ``summa calibrate`` measures it on GPUs; `gpus`: how many copied at once where it
was measured), ``"host_memory":
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

import numpy as np

__all__ = ["Profile", "HARDWARE", "DEFAULT_HARDWARE", "hardware_profile", "shipped_profile",
           "RATE_POWER", "MEMCPY_TRAFFIC", "profile_backend"]


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
        if other.host_link():  # the link measured last
            data["host_link"] = other.data["host_link"]
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
        itself (:class:`summa.execution.sweep.SweepOperands`' `own_copies`)."""
        return bool(self.data.get("peer_access", True))

    def host_link(self) -> dict | None:
        """The profile's ``host_link`` section (rates in GB/s), or None."""
        link = self.data.get("host_link")
        return link if link and link.get("h2d_gbs") and link.get("d2h_gbs") else None

    def link_gpus(self) -> int | None:
        """How many GPUs of a node copied at once where the host link's rates
        were measured (``host_link``'s ``gpus``, as ``summa calibrate``
        writes it), or None where the profile does not say: the rates then
        leave the host memory of a node's copies to its own term."""
        link = self.host_link() or {}
        return int(link["gpus"]) if link.get("gpus") else None

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


def profile_backend(profile: Profile) -> str:
    """The backend name (``cupy`` or ``numpy``) whose runs `profile` measured."""
    return "cupy" if str(profile.data.get("backend", "")).startswith("cupy") else "numpy"
