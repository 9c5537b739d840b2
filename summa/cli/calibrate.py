"""Measure this machine for the performance model: GEMM rates (gamma) by shape
and dtype, broadcast latency/bandwidth (alpha, beta) by broadcaster and
communicator size, the nodes' host memory copy rate by copy threads, and
on GPUs the host link's staged and page-locked rates.
Collective; rank 0 gets the profile data."""

from __future__ import annotations

import math
import platform
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import numpy as np

from ..runtime.mpi import MPI
from ..transports.broadcasters import make_broadcaster
from ..planning.checks import check_scalars
from ..distribution.grid import ProcessGrid, node_rank
from ..distribution.matrix import DistMatrix
from ..execution.algorithm import summa
from ..planning.model import RunSetting, predict
from ..planning.memory import resident_plan
from ..planning.profile import Profile
from ..planning.units import format_bytes
from ..execution.transpose import PanelsOfA
from ..planning.tuning import transposes_a
from ..planning.precision import asked_scheme
from ..runtime.watchdog import watch
from ..device.staging import CHUNK_BYTES, copy_threads, get_stager, usable_cores

__all__ = ["calibrate", "default_sizes", "default_widths", "gemm_slowdown",
           "host_copy_rates", "host_link_rates", "HOST_COPY_BYTES", "HOST_LINK_BYTES"]

#: The overhead run: per-rank block, panel width and number of panels. Its
#: GEMM shape lies inside the default calibrated shapes, so the model's GEMM
#: term for it is an interpolation, not a guess.
OVERHEAD_BLOCK, OVERHEAD_WIDTH, OVERHEAD_STEPS = 384, 128, 16


#: Per-rank block sizes calibrated on a GPU; the largest only where it fits
#: (long GEMMs run slower than short ones once the GPU lowers its clocks
#: under sustained load, so the shapes of big runs are worth measuring).
GPU_SIZES, GPU_LARGE_SIZE = (4096, 8192, 16384), 32768


def default_widths(backend) -> list[int]:
    """Panel widths to calibrate: those SUMMA uses on this kind of rank."""
    return [1024, 2048, 4096, 8192] if backend.is_gpu else [64, 128, 256, 512, 1024]


def default_sizes(comm: MPI.Comm, backend, dtypes) -> list[int]:
    """Block sizes to calibrate: small ones on CPU ranks; on GPUs add
    GPU_LARGE_SIZE where every rank has room for its three operands twice over."""
    if not backend.is_gpu:
        return [256, 512, 1024, 2048]
    free = backend.memory_free()
    need = 2 * 3 * GPU_LARGE_SIZE ** 2 * max(np.dtype(d).itemsize for d in dtypes)
    fits = comm.allreduce(free >= need, op=MPI.LAND)
    return list(GPU_SIZES) + ([GPU_LARGE_SIZE] if fits else [])


def _best(comm: MPI.Comm, run, repeat: int) -> float:
    """Best over `repeat` of the slowest rank's time of `run()` (all ranks at once)."""
    with watch("the other ranks to take part in a calibration measurement"):
        run()
        best = float("inf")
        for _ in range(repeat):
            comm.Barrier()
            t0 = time.perf_counter()
            run()
            best = min(best, comm.allreduce(time.perf_counter() - t0, op=MPI.MAX))
    return best


def _gemm_samples(comm, backend, dtype, precision, sizes, widths, repeat, ranks_per_node):
    xp = backend.xp
    rng = xp.random.default_rng(0)
    samples = []
    # The GEMMs as summa's steps run them: A's panel copied transposed first, where it is.
    transposed = transposes_a(backend.name, dtype, precision)
    asked = asked_scheme(precision)  # fp64-int8: the moduli asked, as a run's plan takes them
    for size in sizes:
        _check_operands_fit(comm, backend, size, max(widths + [size]), dtype, transposed)
        a = rng.standard_normal((size, max(widths + [size]))).astype(dtype)
        b = rng.standard_normal((max(widths + [size]), size)).astype(dtype)
        c = xp.zeros((size, size), dtype=dtype)
        operand_a = PanelsOfA(backend, size, a.shape[1], dtype, transposed)
        for k in sorted(set(w for w in widths if w < size) | {size}):
            scheme = _scheme_that_fits(comm, backend, asked, size, k, dtype, precision)

            def run():
                backend.gemm(1.0, operand_a(a[:, :k]), b[:k], c, precision=precision,
                             scheme=scheme)
                backend.synchronize()
            seconds = _best(comm, run, repeat)
            samples.append(dict(dtype=np.dtype(dtype).name, precision=precision or "default",
                                ranks_per_node=ranks_per_node, m=size, n=size, k=k,
                                seconds=seconds, transposed_a=transposed))
    return samples


def _check_operands_fit(comm, backend, size: int, width: int, dtype, transposed: bool) -> None:
    """Refuse, on every rank at once, a block `size` whose operands (A of
    `size` x `width` made through a float64 draw, B, C and A's transposed
    copy) do not fit the memory free on some rank's device, before any of
    them is made: one clear error, not the device's own."""
    if not backend.is_gpu:
        return
    item = np.dtype(dtype).itemsize
    need = (2 * size * width + size * size) * item + size * width * (8 + item * transposed)
    free = backend.memory_free()
    short = comm.allreduce(max(0, need - free), op=MPI.MAX)
    if short:
        raise ValueError(f"calibrate --sizes {size}: the {np.dtype(dtype).name} operands need "
                         f"{format_bytes(need)} of device memory, {format_bytes(short)} more "
                         f"than a rank has free; give smaller --sizes or --widths")


#: Share of a device's free memory a calibrated fp64-int8 GEMM's scratch may
#: take: the rest for cuBLAS's workspaces and CuPy's pool rounding (as
#: ``summa ideal`` leaves it).
FREE_SHARE = 0.95


def _scheme_that_fits(comm, backend, asked, size: int, k: int, dtype, precision):
    """The scheme of one calibrated fp64-int8 GEMM (`asked`: the moduli
    asked): its rows of A and C a chunk and its products folded a pass
    chosen, as a run's plan chooses them (:func:`summa.planning.memory.resident_plan`),
    so that its scratch fits beside the operands on every rank's device;
    `asked` itself for other precisions."""
    if asked is None or not backend.is_gpu:
        return asked
    budget = int(FREE_SHARE * comm.allreduce(backend.memory_free(), op=MPI.MIN))
    plan = resident_plan(size, size, k, dtype, precision, new_c=False, budget=budget)
    if plan.device_bytes > budget:
        raise ValueError(f"calibrate --sizes {size}: an fp64-int8 GEMM over K = {k} needs "
                         f"{format_bytes(plan.device_bytes)} of scratch even in its smallest "
                         f"chunks, {format_bytes(budget)} free; give smaller --sizes")
    return replace(asked, rows=plan.int8_rows, planes=plan.int8_planes or asked.planes)


def _bcast_fit(comm, backend, mode, sizes_bytes, repeat, gemm_samples) -> dict | None:
    """Fit ``t = alpha + bytes / beta`` to broadcasts among all ranks of `comm`;
    where broadcasts overlap GEMMs, also measure the GEMMs' slowdown beside them."""
    bc = make_broadcaster(mode, comm, backend)
    times = []
    try:
        for nbytes in sizes_bytes:
            buf = backend.xp.zeros(max(nbytes // 8, 1), dtype=np.float64)

            def run():
                bc.ibcast(buf, 0).wait()
                backend.synchronize()
            times.append(_best(comm, run, repeat))
        x = np.array([max(s // 8, 1) * 8 for s in sizes_bytes], dtype=float)
        slope, intercept = np.polyfit(x, np.array(times), 1)
        # Broadcasts progress during a GEMM only when the GEMM runs on a device;
        # CPU ranks move MPI data only while they are inside MPI calls.
        fit = dict(comm=bc.name, ranks=comm.Get_size(), alpha=max(float(intercept), 1e-7),
                   beta=float(1.0 / max(slope, 1e-15)), overlap=backend.overlaps_gemm,
                   samples=[[int(b), t] for b, t in zip(x, times)])
        if fit["overlap"]:  # GEMMs share the device with this broadcaster
            fit["gemm_slowdown"] = gemm_slowdown(comm, backend, bc, gemm_samples, fit["beta"],
                                                 repeat)
    finally:
        bc.free()
    return fit


#: GEMM duration aimed at when measuring the slowdown beside a broadcast, and
#: the broadcast's size limits (it must outlast the GEMM).
SLOWDOWN_GEMM_SECONDS = 0.01
SLOWDOWN_BYTES = (1 << 20, 1 << 30)


def gemm_slowdown(comm, backend, bc, gemm_samples, beta: float, repeat: int) -> float:
    """How many times longer a GEMM takes while a broadcast of `bc` runs beside
    it than alone (>= 1; the slowest rank's figure).

    On a GPU, NCCL's kernels take SMs from the GEMMs they overlap. The GEMM is
    the calibrated float64 shape nearest SLOWDOWN_GEMM_SECONDS; the broadcast
    is sized from the fitted bandwidth `beta` to last at least twice as long.
    """
    samples = [g for g in gemm_samples if g["dtype"] == "float64"] or gemm_samples
    shape = min(samples, key=lambda g: abs(math.log(g["seconds"] / SLOWDOWN_GEMM_SECONDS)))
    dtype = shape["dtype"]
    xp = backend.xp
    a = xp.ones((shape["m"], shape["k"]), dtype=dtype)
    b = xp.ones((shape["k"], shape["n"]), dtype=dtype)
    c = xp.zeros((shape["m"], shape["n"]), dtype=dtype)
    lo, hi = SLOWDOWN_BYTES
    nbytes = int(min(max(2.0 * shape["seconds"] * beta, lo), hi))
    buf = xp.zeros(nbytes // 8, dtype=np.float64)

    def gemm_seconds(beside: bool) -> float:
        comm.Barrier()
        pending = bc.ibcast(buf, 0) if beside else None
        start = backend.timing_mark()
        backend.gemm(1.0, a, b, c)
        stop = backend.timing_mark()
        if pending is not None:
            pending.wait()
        backend.synchronize()
        return backend.elapsed(start, stop)

    gemm_seconds(False)
    gemm_seconds(True)
    alone = min(gemm_seconds(False) for _ in range(repeat))
    beside = min(gemm_seconds(True) for _ in range(repeat))
    return comm.allreduce(max(1.0, beside / alone), op=MPI.MAX)


#: Bytes each copy thread copies in one host memory measurement: well past
#: the caches of a node's threads together, short enough (~10 ms a thread).
HOST_COPY_BYTES = 64 << 20


def host_copy_rates(comm, threads: int, nbytes: int = HOST_COPY_BYTES,
                    repeat: int = 3) -> list[list]:
    """``[[copiers, GB/s], ...]``: a node's memcpy rate from pageable memory
    into chunks of :data:`summa.device.staging.CHUNK_BYTES`, as the stager
    fills its page-locked ones, with every rank of `comm` copying at once
    (a node's memory carries all its ranks' copies): rank 0 alone on one
    thread, every rank on one, and every rank on `threads` (its copy
    threads). The rate is the bytes a node's ranks copied over the slowest
    rank's time. Collective over `comm`."""
    ranks_per_node = node_rank(comm)[1]
    samples = {}
    for alone, count in ((True, 1), (False, 1), (False, threads)):
        copying = not alone or comm.Get_rank() == 0
        seconds = _best(comm, _copiers(count if copying else 0, nbytes), repeat)
        copiers = count if alone else ranks_per_node * count
        samples[copiers] = (1 if alone else ranks_per_node) * count * nbytes / seconds / 1e9
    return [[copiers, gbs] for copiers, gbs in sorted(samples.items())]


def _copiers(threads: int, nbytes: int):
    """A run of `threads` host threads each copying its own `nbytes` of
    touched pageable memory into a ring of two touched chunks (page-locked
    memory is memory whose pages stay: a memcpy into it runs as into these)."""
    chunk = min(CHUNK_BYTES, nbytes)
    sources = [np.ones(nbytes, np.uint8) for _ in range(threads)]
    rings = [[np.zeros(chunk, np.uint8) for _ in range(2)] for _ in range(threads)]

    def copy(i):
        src, ring = sources[i], rings[i]
        for n, start in enumerate(range(0, nbytes, chunk)):
            part = src[start:start + chunk]
            np.copyto(ring[n % 2][:part.size], part)

    def run():
        if threads:
            with ThreadPoolExecutor(threads) as pool:
                list(pool.map(copy, range(threads)))
    return run


def _host_memory(comm, repeat: int) -> dict:
    """The profile's ``host_memory`` of this machine: :func:`host_copy_rates`
    with the copy threads a rank of a node this full takes, and the cores
    those threads were counted from."""
    threads = copy_threads(node_rank(comm)[1])
    return dict(copy_gbs=host_copy_rates(comm, threads, repeat=repeat), cores=usable_cores(),
                estimate=False, note=f"summa calibrate, {time.strftime('%Y-%m-%d')}: memcpy "
                "from pageable memory into 8 MiB chunks, every rank of a node copying at once")


#: Bytes each rank moves each way to time its host link: 1 GiB takes ~20 ms
#: at a page-locked 55 GB/s, long enough that the stager's start is noise.
HOST_LINK_BYTES = 1 << 30


def host_link_rates(comm, backend, nbytes: int = HOST_LINK_BYTES, repeat: int = 3) -> dict | None:
    """The profile's ``host_link`` of this machine (None on CPU ranks): GB/s
    a GPU moves between touched pageable memory and itself through summa's
    page-locked chunks (:class:`summa.device.staging.Stager`, with the copy
    threads a rank of a node this full takes), and from and into
    page-locked memory; every rank of `comm` copying at once, so the rates
    are a GPU's share while the node's other GPUs copy too. Up and down are
    timed apart, as the model adds them
    (:meth:`summa.planning.profile.Profile.host_seconds`). At most a quarter
    of the least free device memory of a rank is moved. Collective."""
    if not backend.is_gpu:
        return None
    nbytes = min(nbytes, comm.allreduce(backend.memory_free(), op=MPI.MIN) // 4)
    xp, ranks = backend.xp, node_rank(comm)[1]
    threads = copy_threads(ranks)
    rows = max(1, nbytes // (8 * HOST_LINK_COLUMNS))
    host = np.ones((rows, HOST_LINK_COLUMNS))  # touched, as the user's arrays are
    dev = xp.empty(host.shape)
    pinned = np.frombuffer(xp.cuda.alloc_pinned_memory(host.nbytes), host.dtype,
                           host.size).reshape(host.shape)
    stager = get_stager(backend.device, threads)

    def timed(copy):
        def run():
            copy()
            backend.synchronize()
        return host.nbytes / _best(comm, run, repeat) / 1e9
    rates = dict(h2d_gbs=timed(lambda: stager.upload(dev, host).wait()),
                 d2h_gbs=timed(lambda: stager.download(host, dev).wait()),
                 pinned_h2d_gbs=timed(lambda: dev.set(pinned)),
                 pinned_d2h_gbs=timed(lambda: dev.get(out=pinned)))
    return dict({k: round(v, 2) for k, v in rates.items()},
                name="host link (measured)",
                note=f"summa calibrate, {time.strftime('%Y-%m-%d')}: {nbytes / 2**30:g} GiB "
                f"each way staged from and into touched pageable memory through page-locked "
                f"chunks on {threads} copy thread{'s' * (threads != 1)} a rank; page-locked "
                "memory in one copy",
                concurrency=f"{ranks} GPU{'s' * (ranks != 1)} of a node copying at once: "
                "the rates are one GPU's share", gpus=ranks)


#: Columns of the rows :func:`host_link_rates` copies (32 KiB rows: a chunk
#: holds 256 of them, as a large operand's rows fill it).
HOST_LINK_COLUMNS = 4096


def _panel_overhead(comm, backend, profile_so_far: Profile, mode: str, repeat: int) -> float:
    """Seconds per SUMMA step beyond the model's GEMM and broadcast terms, from
    a SUMMA run on this grid with GEMMs of a realistic size (per-rank blocks of
    OVERHEAD_BLOCK, panels of OVERHEAD_WIDTH). Steps of real work matter: ranks
    that share cores (or wait on each other's launches) lose time per step
    only when there is work to be descheduled from; thin panels hide that."""
    with ProcessGrid(comm) as grid:
        width, steps = OVERHEAD_WIDTH, OVERHEAD_STEPS
        m, n = OVERHEAD_BLOCK * grid.shape[0], OVERHEAD_BLOCK * grid.shape[1]
        A = DistMatrix.random((m, width * steps), "float64", grid, backend, seed=1)
        B = DistMatrix.random((width * steps, n), "float64", grid, backend, seed=2)
        C = DistMatrix.zeros((m, n), "float64", grid, backend)
        seconds = _best(comm, lambda: summa(1.0, A, B, 0.0, C, panel_width=width,
                                            broadcaster=mode), repeat)
        shape = tuple(grid.shape)
    if profile_so_far is None:
        return 0.0
    model = predict(profile_so_far, m, n, width * steps, "float64", shape, width,
                    RunSetting(comm=mode))
    return max(0.0, (seconds - model.seconds) / model.panels)


def calibrate(comm: MPI.Comm, backend, dtypes=("float64",), precision=None,
              sizes=(256, 512, 1024), widths=(64, 128, 256, 512, 1024),
              modes=("mpi",), message_bytes=(8, 1 << 16, 1 << 20, 1 << 23),
              repeat: int = 3, optional=()) -> Profile | None:
    """Measure GEMM and broadcast rates on every rank of `comm`, and the
    memcpy rate of its nodes' host memory (:func:`host_copy_rates`).

    A broadcaster in `optional` that fails (a RuntimeError, raised on every
    rank of the communicator measured, as broadcasters' set-up errors are) is
    left out of the profile instead of ending the calibration.

    Returns the :class:`~summa.planning.profile.Profile` on rank 0, None elsewhere.
    """
    for dtype in dtypes:  # the same refusals as a multiply's, before anything runs
        check_scalars(1.0, 0.0, np.dtype(dtype), precision, backend)
    ranks_per_node = node_rank(comm)[1]
    gemm = []
    for dtype in dtypes:
        gemm += _gemm_samples(comm, backend, dtype, precision, list(sizes), list(widths),
                              repeat, ranks_per_node)
    bcast = []
    for mode in modes:
        for ranks in range(2, comm.Get_size() + 1):
            sub = comm.Split(0 if comm.Get_rank() < ranks else MPI.UNDEFINED, comm.Get_rank())
            error = None
            if sub != MPI.COMM_NULL:
                try:
                    fit = _bcast_fit(sub, backend, mode, list(message_bytes), repeat, gemm)
                except Exception as exc:  # noqa: BLE001 - agreed on below, then raised
                    fit = None  # an optional one: e.g. ipc where CUDA IPC is not allowed
                    if not (isinstance(exc, RuntimeError) and mode in optional):
                        error = exc
                sub.Free()
                if comm.Get_rank() == 0 and fit is not None:
                    bcast.append(fit)
            # Every rank learns of a failure: ranks outside `sub` would wait forever.
            whys = [w for w in comm.allgather(None if error is None else str(error)) if w]
            if whys:
                raise error or RuntimeError(f"calibrating the {mode} broadcaster: {whys[0]}")
    data = dict(machine=socket.gethostname(), platform=platform.platform(),
                backend=backend.describe(), ranks=comm.Get_size(),
                nodes=-(-comm.Get_size() // ranks_per_node),  # summa plan's limits
                mpi=MPI.Get_library_version().splitlines()[0].strip(),
                date=time.strftime("%Y-%m-%d"), gemm=gemm, bcast=bcast, overhead=[])
    data["host_memory"] = _host_memory(comm, repeat)
    link = host_link_rates(comm, backend, repeat=repeat)
    if link is not None:
        data["host_link"] = link
    if backend.memory_total():
        # which blocks stay open between multiplies (summa/transports/ipc.py)
        data["device_memory"] = backend.memory_total()
    if comm.Get_size() > 1 and modes:
        partial = comm.bcast(data if comm.Get_rank() == 0 else None, root=0)
        if "float64" not in dtypes:  # the overhead run is float64
            partial["gemm"] = partial["gemm"] + _gemm_samples(
                comm, backend, "float64", None, [OVERHEAD_BLOCK], [OVERHEAD_WIDTH], repeat,
                ranks_per_node)
        overhead = _panel_overhead(comm, backend, Profile(partial), modes[0], repeat)
        data["overhead"] = [dict(ranks=comm.Get_size(), seconds=overhead)]
    if comm.Get_rank() != 0:
        return None
    return Profile(data)
