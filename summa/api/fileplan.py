"""A multiply of ``.npy`` files before a byte of its data is read: the call
checked against the files' headers (shapes, dtypes, ops, C0, the output
path and its disk space: :func:`check_files`), the compute dtype, whether
Freivalds' test is cheap, whether the files stream through the GPUs and how
their blocks lie, the plan (:func:`plan_files`), and the read-ahead that
starts the disk meanwhile. :mod:`summa.api.files` runs the phases that
follow (:func:`summa.api.files.multiply_files`); the dtype rule is its.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import numpy as np

from ..runtime.agree import collectively
from ..device.backend import get_backend, resolve_dtype
from ..host.filemaps import read_ahead
from ..planning.checks import op_shape
from .promotion import common_type
from ..host.npyio import NpyError, mapped_by_columns, read_header
from ..host.npyoutput import check_output_path, check_output_room
from ..device.traits import traits
from ..planning.plan import Machine
from ..planning.planner import make_plan, restore
from ..planning.request import PlanRequest

__all__ = ["FilesJob", "Timeline", "check_is_cheap", "check_files", "plan_files",
           "read_ahead_inputs", "streams_by_default", "streamable", "maps_files"]


#: Assumed rates for deciding whether a check is cheap (bytes/s of memory
#: traffic for the matrix-vector products, flop/s for the multiply).
_RATES = {"cupy": (3e12, 5e13), "numpy": (1e10, 5e10)}


def check_is_cheap(m: int, n: int, k: int, itemsize: int, backend_name: str) -> bool:
    """True when Freivalds' test should cost under 2 % of the multiply.

    The test reads A, B and C about eight times in float64 (two vectors, each
    with a value and a gauge pass): ``64 (MK + KN + MN)`` bytes at memory speed,
    against ``2 MNK`` flops at GEMM speed.
    """
    bandwidth, rate = _RATES.get(backend_name, _RATES["numpy"])
    check = 64 * (m * k + k * n + m * n) / bandwidth
    multiply = 2 * m * n * k / rate
    return check < 0.02 * multiply


def _compute_dtype(headers: dict, dtype) -> np.dtype:
    if dtype is not None:
        return resolve_dtype(dtype)
    for header in headers.values():  # A, B, C0: the message names the file
        if header is not None and header.dtype.kind in "iu":
            raise NpyError(f"{header.path}: integer dtype {header.dtype.name}; pass --dtype "
                           "(e.g. float64) to convert it")
    a, b = headers["A"], headers["B"]
    # (files stored big-endian are read into native order, as --dtype converts)
    kinds = [header.dtype.newbyteorder("=") for header in (a, b)]
    if kinds[0] == kinds[1]:
        return resolve_dtype(kinds[0])
    common = common_type(*kinds)  # two types: their common one, as NumPy's matmul takes them
    if common is None:
        raise NpyError(f"{a.path} is {a.dtype.name} but {b.path} is {b.dtype.name}; pass "
                       f"--dtype to compute in one type (both are converted to it)")
    return common


@dataclass(frozen=True)
class FilesJob:
    """One multiply of .npy files: what the call asked for, and once checked
    (:func:`check_files`, before a byte of data is read) the files' headers,
    the product's shape, the compute dtype and the output path to write.

    The fields up to `request` are :func:`multiply_files`' arguments, the
    options of the product in `request` (`check`, and the request's
    `out_of_core`, stay None where the call left them to summa until the
    plan settles them).

    Attributes
    ----------
    request : summa.planning.request.PlanRequest
        The product's options as the call asked them (once checked, its
        ops upper-case; once planned, its `out_of_core` settled).
    headers : dict
        ``"A"``, ``"B"``, ``"C0"`` (None where there is none): the files'
        :class:`summa.host.npyio.NpyHeader`.
    shape : tuple
        ``(m, n, k)`` of the product.
    compute : numpy.dtype
        The dtype the product is computed and written in.
    out : str
        The output path, checked (:func:`summa.host.npyoutput.check_output_path`).
    """

    a_path: str
    b_path: str
    c_path: str | None
    out_path: str
    alpha: object = 1.0
    beta: object = 0.0
    dtype: object = None
    block: tuple | None = None
    backend: str = "auto"
    check: bool | None = None
    request: PlanRequest = PlanRequest()
    headers: dict | None = None
    shape: tuple | None = None
    compute: np.dtype | None = None
    out: str | None = None

    @property
    def trans(self) -> tuple:
        """``(trans_a, trans_b)`` of the request."""
        return self.request.trans_a, self.request.trans_b


class Timeline:
    """Where the time of one call went, in order: (step, seconds since the
    call) on this rank, so that no second of the wall time is in none of the
    phases."""

    def __init__(self):
        self.started = time.perf_counter()
        self.steps = []

    def mark(self, step: str) -> None:
        self.steps.append((step, round(time.perf_counter() - self.started, 4)))


def check_files(job: FilesJob, comm) -> FilesJob:
    """Everything about the files that can be checked before a byte of data
    is read, the same on every rank: the ops, C0 where beta needs it, the
    headers' shapes and dtypes, the output path and the free disk space
    its file needs. Returns `job` with its ops
    upper-case, its headers, ``(m, n, k)``, compute dtype and output path;
    collective."""
    a_path, b_path, c_path = job.a_path, job.b_path, job.c_path
    trans_a, trans_b = str(job.trans[0]).upper(), str(job.trans[1]).upper()
    for name, t in (("trans_a", trans_a), ("trans_b", trans_b)):
        if t not in ("N", "T", "H"):
            raise ValueError(f"{name} must be N, T or H, got {t!r}")
    if job.beta != 0 and c_path is None:
        raise ValueError("beta is not 0, so C0 is needed: pass --c C0.npy")
    headers = {"A": read_header(a_path, comm), "B": read_header(b_path, comm),
               "C0": read_header(c_path, comm) if c_path is not None else None}
    (m, k), (k2, n) = op_shape(headers["A"].shape, trans_a), op_shape(headers["B"].shape,
                                                                          trans_b)
    if k != k2:
        raise NpyError(f"inner dimensions differ: op({a_path}) is {m}x{k} but op({b_path}) "
                       f"is {k2}x{n}")
    if headers["C0"] is not None and headers["C0"].shape != (m, n):
        raise NpyError(f"{c_path}: is {headers['C0'].shape[0]}x{headers['C0'].shape[1]}, "
                       f"but the product is {m}x{n}")
    compute = _compute_dtype(headers, job.dtype)
    out = check_output_path(job.out_path, [a_path, b_path, c_path], comm)
    # a full disk found now, not after the whole multiply
    check_output_room(out, (m, n), compute, comm)
    return replace(job, request=replace(job.request, trans_a=trans_a, trans_b=trans_b),
                   headers=headers, shape=(m, n, k), compute=compute, out=out)


def plan_files(job: FilesJob, comm, local: int, timeline: Timeline) -> tuple:
    """The backend (of node rank `local`), the check and the mode where the
    call left them to summa, and the Plan of a checked `job`; collective.
    Returns ``(job with those settled, backend, plan, the record so far)``."""
    (m, n, k), (trans_a, trans_b) = job.shape, job.trans
    be = collectively(comm, get_backend, job.backend, local)
    compute = be.check_dtype(job.compute)
    check = job.check
    if check is None:
        check = check_is_cheap(m, n, k, compute.itemsize, be.name)
    record = {"a": str(job.a_path), "b": str(job.b_path), "output": job.out, "m": m, "n": n,
              "k": k, "dtype": compute.name, "trans_a": trans_a, "trans_b": trans_b,
              "alpha": job.alpha, "beta": job.beta, "backend": be.name,
              "timeline": timeline.steps}
    timeline.mark("headers, devices")
    request = job.request
    if request.out_of_core is None and streams_by_default(
            be.name, job.headers, trans_a, trans_b, compute, job.block, request.schedule):
        # streamed: reading, multiplying and writing overlap
        request = replace(request, out_of_core=True)
    # bad input: one message, before any warning
    plan = make_plan((m, n, k), compute, Machine.live(comm, be), request)
    if plan.device_budget is not None:  # streamed: cut as the mapped blocks lie
        plan = restore(plan, _mapped_storage(job, compute))
    record["plan"] = plan.as_dict()
    return replace(job, compute=compute, check=check, request=request), be, plan, record


def read_ahead_inputs(headers, comm, local: int, size: int) -> list:
    """Start reading A's and B's bytes into the page cache (one after the
    other, each of the node's `size` ranks, this one `local`, its share of
    them) where every rank is on one node, so that the disk works from the
    start (what is read twice is read from memory); the events that stop it."""
    if size != comm.Get_size():
        return []  # several nodes: each reads only its blocks, when it maps them
    stops = []
    for header in (headers["A"], headers["B"]):
        nbytes = header.nbytes
        first = header.offset + nbytes * local // size
        last = header.offset + nbytes * (local + 1) // size
        stop = read_ahead(header.path, first, last)
        if stop is not None:
            stops.append(stop)
    return stops


def streams_by_default(backend_name: str, headers: dict, trans_a: str, trans_b: str, compute,
                       block=None, schedule: str = "panels") -> bool:
    """Does a multiply of these files stream them through the GPUs unless told
    otherwise? On GPUs, where both can be read as the multiply goes and there
    is no C0: measured on one H200 (N = 24576), streamed 9.4 s against 12.5 s
    in memory with the files in the page cache, 16.2 against 20.3 s from the
    disk."""
    return (traits(backend_name).gpu and block is None and headers.get("C0") is None
            and schedule == "panels" and streamable(headers["A"], trans_a, compute)
            and streamable(headers["B"], trans_b, compute))


def streamable(header, trans: str, compute) -> bool:
    """Can the out-of-core multiply read this file as it goes
    (:func:`summa.api.files._mapped`)? In the compute dtype, read as it is
    or transposed (C or Fortran order: blocks lying by columns are the
    GEMMs' transposed operands); not op H of a complex file (its
    conjugation would need a copy)."""
    return header.dtype == compute and (trans in ("N", "T") or compute.kind != "c")


def maps_files(job: FilesJob, plan) -> tuple:
    """Whether a streamed multiply of `job`
    (:attr:`summa.api.files._FilesRun.streaming`) maps its blocks of A, B
    and C from files rather than reading them: A and B where streamable
    (:func:`summa.api.files._mapped`), C where the product is written in
    place (no C0)."""
    if plan.device_budget is None or job.block is not None:
        return (False, False, False)
    return (streamable(job.headers["A"], job.trans[0], job.compute),
            streamable(job.headers["B"], job.trans[1], job.compute), job.c_path is None)


def _mapped_storage(job: FilesJob, compute) -> tuple:
    """How op(A) and op(B) lie (:data:`summa.host.storage.STORAGES`) as a
    streamed multiply reads them: memory-mapped where streamable
    (:func:`summa.api.files._mapped`; balanced blocks, which always map), by
    columns for a Fortran-ordered file read as it is or a C-ordered one
    transposed; else by rows (read into C order)."""
    return tuple("cols" if job.block is None and streamable(job.headers[name], t, compute)
                 and mapped_by_columns(job.headers[name], t != "N") else "rows"
                 for name, t in zip("AB", job.trans))
