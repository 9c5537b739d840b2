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
"""

from __future__ import annotations

import time

import numpy as np

from .algorithm import SummaStats, _check_layouts, _check_operands, _check_scalars
from .backend import NumpyBackend
from .comm import make_broadcaster
from .layout import panel_schedule
from .matrix import DistMatrix
from .plan import memory_plan
from .watchdog import watch

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
    try:
        for g0 in range(0, len(panels), group_panels):
            group = panels[g0:g0 + group_panels]
            # Broadcast the whole group first: each panel crosses the network once.
            received = []
            for p in group:
                a = np.empty((ml, p.width), dtype=C.dtype)
                b = np.empty((p.width, nl), dtype=C.dtype)
                if grid.col == p.a_root:
                    a[...] = A.local[:, p.a_offset:p.a_offset + p.width]
                if grid.row == p.b_root:
                    b[...] = B.local[p.b_offset:p.b_offset + p.width, :]
                received.append((a, b, row_bc.ibcast(a, p.a_root), col_bc.ibcast(b, p.b_root),
                                 p))
            for a, b, ra, rb, p in received:
                with watch(f"the broadcast of A panel at columns {p.k0}:{p.k1} from grid "
                           f"column {p.a_root} along grid row {grid.row}"):
                    ra.wait()
                with watch(f"the broadcast of B panel at rows {p.k0}:{p.k1} from grid row "
                           f"{p.b_root} along grid column {grid.col}"):
                    rb.wait()
            # Sweep the C tiles over the group, one device-sized chunk at a time.
            for i0 in range(0, ml, tm):
                for j0 in range(0, nl, tn):
                    i1, j1 = min(i0 + tm, ml), min(j0 + tn, nl)
                    c_dev = device.asarray(np.ascontiguousarray(C.local[i0:i1, j0:j1]))
                    tc = time.perf_counter()
                    for a, b, _, _, p in received:
                        for k0 in range(0, p.width, chunk):
                            k1 = min(k0 + chunk, p.width)
                            a_dev = device.asarray(np.ascontiguousarray(a[i0:i1, k0:k1]))
                            b_dev = device.asarray(np.ascontiguousarray(b[k0:k1, j0:j1]))
                            device.gemm(alpha, a_dev, b_dev, c_dev, precision=precision)
                            moved += a_dev.nbytes + b_dev.nbytes
                    device.synchronize()
                    compute += time.perf_counter() - tc
                    C.local[i0:i1, j0:j1] = device.to_host(c_dev)
                    moved += 2 * c_dev.nbytes
            if progress is not None:
                progress(min(g0 + group_panels, len(panels)), len(panels))
    finally:
        row_bc.free()
        col_bc.free()
    stats.seconds = time.perf_counter() - t0
    stats.compute = compute
    stats.wait = max(0.0, stats.seconds - compute)
    stats.extra = {"out_of_core": True, "tile": [tm, tn], "chunk": chunk,
                   "device_budget": device_budget, "device_bytes_planned": plan.device_bytes,
                   "transfer_bytes": moved}
    return stats
