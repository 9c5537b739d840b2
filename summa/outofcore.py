"""Out-of-core SUMMA: matrices in host memory, streamed through the device in tiles.

A rank's blocks of A, B and C stay in host memory. SUMMA proceeds in groups of
panels (as many as fit the host budget for panel buffers, ``lookahead + 1``
panels by default): the group's A and B panels are broadcast once, through
host memory, then every C tile on this rank is brought to the device, updated
with the whole group chunk by chunk, and written back. Each panel is therefore
broadcast exactly once (the same communication volume as in-memory SUMMA),
while each C tile crosses the host-device link twice per group.

Host-device traffic per rank and group of width W: ``2 ml nl`` for C plus
``(ml nl / tn + ml nl / tm) W`` for the panel chunks; with tiles of a few
thousand rows the GEMMs (``2 ml nl W`` flops) dominate.

On a GPU the chunk copies run on a stream of their own into two alternating
device buffers, overlapped with the GEMMs (:class:`_StreamedSweep`); on the
NumPy backend (tests) the same tiling runs with plain copies.
"""

from __future__ import annotations

import time

import numpy as np

from .algorithm import (SummaStats, _check_layouts, _check_operands, _check_scalars,
                        local_first_panel, local_parts, wait_for_panel)
from .backend import NumpyBackend
from .comm import make_broadcaster
from .layout import panel_schedule
from .matrix import DistMatrix
from .plan import memory_plan

__all__ = ["summa_out_of_core"]


def summa_out_of_core(alpha, A: DistMatrix, B: DistMatrix, beta, C: DistMatrix, device,
                      device_budget: int, panel_width: int = 4096, group_panels: int = 2,
                      precision=None, progress=None) -> SummaStats:
    """``C <- alpha * A @ B + beta * C`` with A, B, C in host memory.

    Parameters
    ----------
    A, B, C : DistMatrix
        Host-resident operands (NumPy backend).
    device : Backend
        Where the GEMMs run (CuPy; NumPy for tests, where "device" arrays are
        host arrays and the budget still decides the tiling).
    device_budget : int
        Bytes of device memory this rank may use.
    group_panels : int
        Panels broadcast together before the C tiles sweep over them.

    Returns
    -------
    SummaStats
        With ``extra`` holding the tile shape, chunk width and transfer bytes.
    """
    _check_operands(A, B, C)
    _check_layouts(A, B, C)
    _check_scalars(alpha, beta, C.dtype, precision, device)
    if C.backend.name != "numpy":
        raise ValueError("out-of-core operands must be host-resident (NumPy backend)")
    grid = C.grid
    m, k = A.shape
    n = B.shape[1]
    plan = memory_plan(m, n, k, C.dtype, grid.shape, panel_width,
                       lookahead=group_panels - 1, backend=device.name,
                       device_budget=device_budget, out_of_core=True)
    tm, tn = plan.tile
    chunk = plan.chunk
    panels = panel_schedule(A.layout.cols, B.layout.rows, panel_width)
    host = NumpyBackend()
    row_bc = make_broadcaster("mpi", grid.row_comm, host)
    col_bc = make_broadcaster("mpi", grid.col_comm, host)
    ml, nl = C.local.shape
    stats = SummaStats(panels=len(panels), panel_width=panel_width, comm="mpi (host)",
                       lookahead=group_panels - 1)
    t0 = time.perf_counter()
    if beta == 0:
        C.local.fill(0)
    elif beta != 1:
        C.local *= beta
    moved = 0
    compute = 0.0
    sweep = (_StreamedSweep if device.name == "cupy" else _Sweep)(device, C.dtype, tm, tn, chunk)
    early = local_first_panel(panels, grid)
    try:
        for g0 in range(0, len(panels), group_panels):
            group = panels[g0:g0 + group_panels]
            # Broadcast the whole group first: each panel crosses the network once.
            received = []
            if g0 == 0 and early is not None:  # same order of additions as in memory
                received.append((*local_parts(A, B, panels[early]), None, None, early))
            for i, p in enumerate(group, start=g0):
                a = _host_array(device, (ml, p.width), C.dtype)
                b = _host_array(device, (p.width, nl), C.dtype)
                a_part, b_part = local_parts(A, B, p)
                if grid.col == p.a_root:
                    a[...] = a_part
                if grid.row == p.b_root:
                    b[...] = b_part
                received.append((a, b, row_bc.ibcast(a, p.a_root), col_bc.ibcast(b, p.b_root),
                                 i))
            for a, b, ra, rb, i in received:
                if ra is not None:  # the local-first panel has nothing to wait for
                    wait_for_panel(i, panels[i], ra, rb, grid)
            # Sweep the C tiles over the group, one device-sized chunk at a time.
            # (the local-first panel was swept with group 0; skip its own turn)
            panels_here = [(a, b) for a, b, ra, _, i in received if ra is None or i != early]
            moved_now, seconds = sweep.run(C.local, panels_here, alpha, precision)
            moved += moved_now
            compute += seconds
            if progress is not None:
                progress(min(g0 + group_panels, len(panels)), len(panels))
    finally:
        sweep.close()
        row_bc.free()
        col_bc.free()
    stats.seconds = time.perf_counter() - t0
    stats.compute = compute
    stats.wait = max(0.0, stats.seconds - compute)
    stats.extra = {"out_of_core": True, "tile": [tm, tn], "chunk": chunk,
                   "device_budget": device_budget, "device_bytes_planned": plan.device_bytes,
                   "transfer_bytes": moved}
    return stats


def _host_array(device, shape, dtype) -> np.ndarray:
    """A host array, pinned when the device is a GPU (fast, asynchronous copies)."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape)) * dtype.itemsize
    if device.name != "cupy" or nbytes == 0:
        return np.empty(shape, dtype=dtype)
    return device.host_buffer(nbytes).view(dtype).reshape(shape)


def _tiles(rows: int, cols: int, tm: int, tn: int):
    for i0 in range(0, rows, tm):
        for j0 in range(0, cols, tn):
            yield i0, min(i0 + tm, rows), j0, min(j0 + tn, cols)


def _chunks(panels, chunk: int):
    for a, b in panels:
        for k0 in range(0, a.shape[1], chunk):
            yield a, b, k0, min(k0 + chunk, a.shape[1])


class _Sweep:
    """C tiles through the device with plain (synchronous) copies."""

    def __init__(self, device, dtype, tm, tn, chunk):
        self.device, self.tm, self.tn, self.chunk = device, tm, tn, chunk

    def run(self, c_host, panels, alpha, precision) -> tuple[int, float]:
        """Update every tile of `c_host` with every chunk of `panels`; return
        (bytes moved between host and device, seconds of device work)."""
        device, moved, t0 = self.device, 0, time.perf_counter()
        for i0, i1, j0, j1 in _tiles(*c_host.shape, self.tm, self.tn):
            c_dev = device.asarray(np.ascontiguousarray(c_host[i0:i1, j0:j1]))
            for a, b, k0, k1 in _chunks(panels, self.chunk):
                a_dev = device.asarray(np.ascontiguousarray(a[i0:i1, k0:k1]))
                b_dev = device.asarray(np.ascontiguousarray(b[k0:k1, j0:j1]))
                device.gemm(alpha, a_dev, b_dev, c_dev, precision=precision)
                moved += a_dev.nbytes + b_dev.nbytes
            c_host[i0:i1, j0:j1] = device.to_host(c_dev)
            moved += 2 * c_dev.nbytes
        device.synchronize()
        return moved, time.perf_counter() - t0

    def close(self) -> None:
        pass


class _StreamedSweep(_Sweep):
    """C tiles through a GPU with copies overlapped with GEMMs.

    Panel chunks are copied host-to-device on a stream of their own into two
    alternating device buffers; each GEMM waits (on the GPU) for its chunk's
    copy, and a buffer is refilled only after the GEMM that read it. C tiles
    move on the compute stream, so they are ordered with their GEMMs. Host
    panels are pinned; C's host memory is registered (pinned) while in use.
    """

    _H2D, _D2H = 1, 2  # cudaMemcpyKind

    def __init__(self, device, dtype, tm, tn, chunk):
        super().__init__(device, dtype, tm, tn, chunk)
        xp = device.xp
        self.xp, self.item = xp, np.dtype(dtype).itemsize
        self.copy_stream = xp.cuda.Stream(non_blocking=True)
        self.compute_stream = xp.cuda.Stream(non_blocking=True)
        self.a_dev = [xp.empty(tm * chunk, dtype=dtype) for _ in range(2)]
        self.b_dev = [xp.empty(chunk * tn, dtype=dtype) for _ in range(2)]
        self.c_dev = xp.empty(tm * tn, dtype=dtype)
        self.released = [None, None]  # event: last GEMM reading each buffer
        self.registered = []

    def _copy(self, dst, dst_pitch, src, src_pitch, rows, row_bytes, kind, stream):
        self.xp.cuda.runtime.memcpy2DAsync(dst, dst_pitch, src, src_pitch, row_bytes, rows,
                                           kind, stream.ptr)

    def _to_device(self, flat, host_view, stream):
        rows, cols = host_view.shape
        dev = flat[: rows * cols].reshape(rows, cols)
        self._copy(dev.data.ptr, cols * self.item, host_view.ctypes.data, host_view.strides[0],
                   rows, cols * self.item, self._H2D, stream)
        return dev

    def _pin(self, array: np.ndarray) -> None:
        register = getattr(self.xp.cuda.runtime, "hostRegister", None)
        if register is None or not array.nbytes or array.ctypes.data in self.registered:
            return
        try:
            register(array.ctypes.data, array.nbytes, 0)
            self.registered.append(array.ctypes.data)
        except self.xp.cuda.runtime.CUDARuntimeError:
            pass  # already pinned, or not allowed: pageable copies still work

    def run(self, c_host, panels, alpha, precision) -> tuple[int, float]:
        xp, moved = self.xp, 0
        self._pin(c_host)
        start = xp.cuda.Event()
        start.record(self.compute_stream)
        n = 0
        for i0, i1, j0, j1 in _tiles(*c_host.shape, self.tm, self.tn):
            c = self._to_device(self.c_dev, c_host[i0:i1, j0:j1], self.compute_stream)
            for a, b, k0, k1 in _chunks(panels, self.chunk):
                slot = n % 2
                if self.released[slot] is not None:
                    self.copy_stream.wait_event(self.released[slot])
                a_dev = self._to_device(self.a_dev[slot], a[i0:i1, k0:k1], self.copy_stream)
                b_dev = self._to_device(self.b_dev[slot], b[k0:k1, j0:j1], self.copy_stream)
                copied = xp.cuda.Event(disable_timing=True)
                copied.record(self.copy_stream)
                self.compute_stream.wait_event(copied)
                with self.compute_stream:
                    self.device.gemm(alpha, a_dev, b_dev, c, precision=precision)
                done = xp.cuda.Event(disable_timing=True)
                done.record(self.compute_stream)
                self.released[slot] = done
                moved += a_dev.nbytes + b_dev.nbytes
                n += 1
            tile = c_host[i0:i1, j0:j1]
            self._copy(tile.ctypes.data, tile.strides[0], c.data.ptr, c.shape[1] * self.item,
                       c.shape[0], c.shape[1] * self.item, self._D2H, self.compute_stream)
            moved += 2 * c.nbytes
        end = xp.cuda.Event()
        end.record(self.compute_stream)
        end.synchronize()
        self.copy_stream.synchronize()
        return moved, xp.cuda.get_elapsed_time(start, end) / 1e3

    def close(self) -> None:
        self.compute_stream.synchronize()
        self.copy_stream.synchronize()
        for ptr in self.registered:
            try:
                self.xp.cuda.runtime.hostUnregister(ptr)
            except self.xp.cuda.runtime.CUDARuntimeError:
                pass
        self.registered = []
