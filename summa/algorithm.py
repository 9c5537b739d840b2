"""The SUMMA loop and the public ``gemm`` entry point.

For each panel of the inner dimension the grid column owning A's panel
broadcasts it along the grid rows, the grid row owning B's panel broadcasts it
along the grid columns, and every rank accumulates ``C_local += alpha * A_p @ B_p``.
With lookahead ``L`` the broadcasts of the next ``L`` panels are in flight while
the current panel's GEMM runs. Broadcasts start in the same order on every
rank; a rank multiplies the panels it holds first where that lets all its
receives start at once (:func:`_own_first`), and with direct copies (ipc).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace

import numpy as np
from mpi4py import MPI

from . import ozaki
from .checks import check_layouts, check_operands, check_scalars
from .layout import Distribution, Layout, panel_schedule, split_panel
from .matrix import DistMatrix
from .ozaki_gpu import asked_moduli, check_moduli, panel_sums_apply, panel_sums_bytes
from .plan import ranks_on_device
from .selection import _export, _pick_broadcasters
from .strips import check_schedule, multiply_strips, strip_bounds
from .transpose import PanelsOfA
from .tuning import auto_panel_width, default_panel_width, transposes_a
from .faults import inject
from .watchdog import watch

__all__ = ["summa", "gemm", "SummaStats", "default_panel_width"]

#: Pieces the first panel is sent in on GPUs (its broadcast is the pipeline fill).
HEAD_PIECES = 4


@dataclass
class SummaStats:
    """What one SUMMA call spent, on this rank.

    Attributes
    ----------
    seconds : float
        Wall time of the whole loop on this rank.
    compute : float
        Time spent in GEMMs (device time on GPUs).
    wait : float
        ``seconds - compute``: time not spent computing, i.e. exposed
        communication and overheads.
    comm_seconds : float
        Time the broadcasts took (device time for NCCL; on MPI paths the host
        time spent in broadcast calls).
    panels : int
        Number of SUMMA steps.
    panel_width : int
        Requested panel width.
    """

    seconds: float = 0.0
    compute: float = 0.0
    wait: float = 0.0
    comm_seconds: float = 0.0
    panels: int = 0
    panel_width: int = 0
    comm: str = ""
    lookahead: int = 0
    extra: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)


def summa(alpha, A: DistMatrix, B: DistMatrix, beta, C: DistMatrix, panel_width=None,
          lookahead: int = 1, broadcaster: str = "auto", precision: str | None = None,
          progress=None, schedule: str = "panels") -> SummaStats:
    """``C <- alpha * A @ B + beta * C`` in place, by SUMMA.

    Parameters
    ----------
    alpha, beta : scalar
        Scale factors; ``beta == 0`` ignores C's old values (NaNs included).
    A, B, C : DistMatrix
        Operands on one grid, with A's rows laid out like C's rows and B's
        columns like C's columns. A's columns and B's rows may differ.
    panel_width : int or "auto", optional
        Width of the inner-dimension panels (default per backend); ``"auto"``
        measures the GEMM rate of candidate widths once per problem
        (:func:`summa.tuning.auto_panel_width`).
    lookahead : int
        Panels whose broadcasts run ahead of the GEMM (0 disables overlap).
    broadcaster : str
        Broadcaster: ``"auto"``, ``"ipc"``, ``"nccl"``, ``"cuda-aware"`` or ``"mpi"``.
    precision : {None, "tf32"}
        ``"tf32"`` lets float32/complex64 GEMMs use TF32 tensor cores (GPU).
    progress : callable, optional
        Called as ``progress(steps_done, steps_total)`` after each panel is queued.
    schedule : {"panels", "strips"}
        ``"strips"`` (grids of one column): B assembled in column strips of
        `panel_width` (``"auto"``: the default), each GEMM over all of K
        (:mod:`summa.strips`).

    Returns
    -------
    SummaStats
        This rank's timings.
    """
    check_operands(A, B, C)
    check_layouts(A, B, C)
    check_scalars(alpha, beta, C.dtype, precision, C.backend)
    strips = check_schedule(schedule, C.grid.shape) == "strips" and C.grid.size > 1
    backend, grid = C.backend, C.grid
    if strips and isinstance(panel_width, str) and panel_width == "auto":
        # "auto" times GEMMs of K panels; strips cut columns, which cost nothing
        # measurable (split_probe.py): the default width serves.
        panel_width = None
    panel_width, measured = _panel_width(A, B, C, panel_width, precision)
    if int(lookahead) < 0:
        raise ValueError(f"lookahead must be >= 0, got {lookahead}")
    lookahead = int(lookahead)
    panels = panel_schedule(A.layout.cols, B.layout.rows, panel_width)
    row_bc, col_bc = _pick_broadcasters(A, B, C, panels, broadcaster, precision)
    direct = _export(grid, backend, row_bc, col_bc, A.local, B.local)
    transpose = transposes_a(backend.name, C.dtype, precision,
                             schedule="strips" if strips else "panels")
    if grid.size == 1:
        # One rank: nothing to overlap, so the fewest GEMMs (panel by panel where
        # A is read transposed: a copy of all of A would take its room).
        if not transpose:
            panels = one_rank_steps(panels, C.local.shape, backend.name)
    elif strips:
        panels = strip_bounds(C.local.shape[1], panel_width,
                              HEAD_PIECES if backend.name == "cupy" else 1)
    else:
        # The head splits on GPUs whatever the lookahead, so that the summation
        # order, and so the bits, never depend on it; but only where a rank has
        # no panel of its own to multiply while the first one is on its way.
        panels = _order(panels, grid, direct, backend.name == "cupy"
                        and _someone_waits_first(panels, grid, A, B, direct, lookahead))
    stats = SummaStats(panels=len(panels), panel_width=panel_width,
                       comm=(col_bc if strips else row_bc).name,
                       lookahead=lookahead, extra={"panel_width_measured": measured,
                                                   "schedule": "strips" if strips else "panels",
                                                   "transposed_a": transpose})

    t0 = time.perf_counter()
    # One rank's first GEMM applies beta itself (beta 0: C is not read), one
    # pass over C fewer: 1-2 % of a one-GPU run at N = 16384 (TF32, float16).
    first_beta = beta if grid.size == 1 and panels else 1
    if first_beta == 1 and beta == 0:
        C.local.fill(0)
    elif first_beta == 1 and beta != 1:
        C.local *= beta
    marks = []
    with backend.checked_later() as checks, backend.compute_stream():
        # Made inside: its copies go on the stream its GEMMs run on.
        operand_a = PanelsOfA(backend, C.local.shape[0], 0 if strips else
                              max((p.width for p in panels), default=0), C.dtype, transpose)
        sums = _panel_sums(A, B, C, precision, strips, panels, lookahead)
        if precision == "fp64-int8":  # (bench's records say which way it went)
            stats.extra["panel_sums"] = sums is not None
        if grid.size == 1:
            for i, p in enumerate(panels):
                a, b = local_parts(A, B, p) if transpose or len(panels) > 1 else \
                    (A.local, B.local)
                marks.append(backend.timing_mark())
                backend.gemm(alpha, operand_a(a), b, C.local, beta=first_beta if i == 0 else 1,
                             precision=precision)
                marks.append(backend.timing_mark())
                if progress is not None:
                    progress(i + 1, len(panels))
        elif strips:
            multiply_strips(alpha, A, B, C, panels, lookahead, col_bc, direct[1], marks,
                            precision, progress, stats.extra)
        else:
            _pipeline(alpha, A, B, C, panels, lookahead, row_bc, col_bc, direct, marks,
                      precision, progress, stats.extra, operand_a,
                      None if sums is None else sums.add)
            if sums is not None:  # the one fold of C, alpha applied (beta already was)
                marks.append(backend.timing_mark())
                sums.finish(alpha, C.local, 1.0)
                marks.append(backend.timing_mark())
    with watch("the queued GPU work of the SUMMA loop (broadcasts and GEMMs)"):
        backend.synchronize()
    # float64 on INT8: inputs checked for Inf/NaN as the products went, asked once here
    if not grid.comm.allreduce(checks.finite(), op=MPI.LAND):
        raise ValueError(ozaki.NOT_FINITE)
    stats.seconds = time.perf_counter() - t0
    stats.compute = sum(backend.elapsed(a, b) for a, b in zip(marks[::2], marks[1::2]))
    stats.wait = max(0.0, stats.seconds - stats.compute)
    stats.comm_seconds = row_bc.take_seconds() + col_bc.take_seconds()
    return stats


#: Floating-point operations of one GEMM of a CPU rank that multiplies alone:
#: Ctrl-C (KeyboardInterrupt) is taken between GEMMs, so this bounds its wait
#: (0.7 s at 100 GFLOP/s, what two cores ran; one GEMM of 6000^3 made it 4.3 s).
ONE_RANK_GEMM_FLOPS = 2**36
#: ... but no narrower than this: OpenBLAS passes over C once per few hundred
#: of K anyway, and 1024-wide steps of 4000^3 ran as fast as one GEMM.
ONE_RANK_MIN_WIDTH = 1024


def one_rank_steps(panels: list, c_shape, backend_name: str) -> list:
    """The GEMMs of a rank that multiplies alone: on GPUs one over all of K
    (the first panel stands for it; they queue, so more would not bound a
    wait), on CPUs consecutive panels joined into steps of about
    :data:`ONE_RANK_GEMM_FLOPS` each (at least :data:`ONE_RANK_MIN_WIDTH`
    wide), so that Ctrl-C is answered within one of them."""
    if backend_name == "cupy" or len(panels) < 2:
        return panels[:1]
    m, n = c_shape
    width = max(ONE_RANK_MIN_WIDTH, ONE_RANK_GEMM_FLOPS // max(1, 2 * m * n))
    if panels[-1].k1 - panels[0].k0 <= width:
        return panels[:1]
    steps = [panels[0]]
    for p in panels[1:]:
        if p.k1 - steps[-1].k0 <= width:
            steps[-1] = replace(steps[-1], k1=p.k1)  # one rank: K's panels are contiguous
        else:
            steps.append(p)
    return steps


def prepare(A: DistMatrix, B: DistMatrix, C: DistMatrix, panel_width=None,
            broadcaster: str = "auto", precision: str | None = None) -> None:
    """Set up what :func:`summa` on these operands will use, so that it then
    times only the multiply: the broadcasters (made and self-tested once per
    grid), an ``"auto"`` panel width (measured once per problem), and with
    direct copies the peers' blocks opened. Collective.
    """
    width, _ = _panel_width(A, B, C, panel_width, precision)
    row_bc, col_bc = _pick_broadcasters(A, B, C,
                                        panel_schedule(A.layout.cols, B.layout.rows, width),
                                        broadcaster, precision)
    # Direct copies (ipc): open the peers' blocks now; those that stay open
    # (summa/ipc.py) the multiply then reads at once.
    direct = _export(C.grid, C.backend, row_bc, col_bc, A.local, B.local)
    readers = [bc for bc, on in zip((row_bc, col_bc), direct) if on]
    for bc in readers:
        bc.connect()
    for bc in readers:
        bc.release()


def _panel_sums(A, B, C, precision, strips, panels, lookahead):
    """fp64-int8 on a grid of several ranks: a :class:`summa.ozaki_gpu.PanelSums`
    for this rank's C block with the exponents of all of K
    (:func:`summa.ozaki_gpu.grid_exponents`), so the panels' INT8 products
    are summed and C folded once, not once a panel (a fold costs ~35 ms per
    2**29 elements of C on an H200: at 4096-wide panels a third of each
    rank's compute, s17d), and the product is one GPU's whole one; else
    None: for complex128, strips, K past an int32 sum or of fewer than
    :data:`summa.ozaki.K_NATIVE` terms (native float64 then), where
    ``SUMMA_FP64_INT8_SUMS=0``, or where any rank's device lacks the
    memory for the sums (4 bytes an element of C a modulus). Collective."""
    grid, k = C.grid, A.layout.shape[1]
    if precision != "fp64-int8" or strips or not panel_sums_apply(C.dtype, grid.size, k):
        return None
    width = max((p.width for p in panels), default=0)
    m, n = C.local.shape
    # beside the sums, the panel buffers the pipeline makes next (and their
    # staging), a margin for the pool's rounding and the GEMMs' workspace
    buffers = 2 * (lookahead + 1) * (m + n) * width * C.dtype.itemsize
    need = panel_sums_bytes(m, n, width, k) + buffers
    free = C.backend.memory_free()
    sharing = ranks_on_device(C.backend, grid.comm)  # (their sums come out of the same memory)
    fits = free is not None and free >= sharing * (need + need // 16 + (256 << 20))
    if not grid.comm.allreduce(fits, op=MPI.LAND):
        return None
    from .ozaki_gpu import PanelSums, grid_exponents
    exponents = grid_exponents(A.local, B.local, grid.row_comm, grid.col_comm, k)
    return PanelSums(m, n, k, exponents, C.backend)


def _panel_width(A, B, C, panel_width, precision) -> tuple[int, bool]:
    """The panel width to use (the backend's default for None; measured for
    ``"auto"``), and whether it was measured in this call."""
    backend, grid = C.backend, C.grid
    measured = False
    if panel_width is None:
        panel_width = default_panel_width(backend.name, C.dtype, precision)
    elif isinstance(panel_width, str) and panel_width == "auto":
        if grid.size == 1:  # one rank runs a single GEMM: nothing to choose
            panel_width = default_panel_width(backend.name, C.dtype, precision)
        else:
            panel_width, measured = auto_panel_width(A, B, C, precision)
    if not isinstance(panel_width, (int, np.integer)) or panel_width < 1:
        raise ValueError(f"panel width must be an integer >= 1 or 'auto', got {panel_width!r}")
    return int(panel_width), measured


def _order(panels, grid, direct, split_head: bool) -> list:
    """This rank's order of the SUMMA steps.

    Broadcasts pair up across ranks, so every rank starts them in the same
    order, the first one in pieces when `split_head` (a rank with nothing of
    its own to multiply meanwhile then starts after a fraction of it); the
    GEMMs of panels a rank holds go first anyway (:func:`_steps`). Direct copies
    (ipc) pair with nothing, so a rank first multiplies the panels it holds
    itself, which hides its set-up, and only splits the head when that one has
    to be fetched.
    """
    if any(direct):
        panels = sorted(panels, key=lambda p: _fetched(p, grid, direct))
        split_head = split_head and _fetched(panels[0], grid, direct) > 0
    if split_head and panels:
        panels = split_panel(panels[0], HEAD_PIECES) + panels[1:]
    return panels


def _in_place(part, root: int, me: int, size: int, reads: bool) -> bool:
    """Is this rank's part of a panel used where it lies (no receive, no
    packing)? On its owner, where it is contiguous or peers read it in place
    (direct copies), and along a grid row/column of one rank (its owner)."""
    return me == root and (reads or size == 1 or part.flags.c_contiguous)


def _held(p, grid, A, B, direct) -> bool:
    """Does this rank multiply panel `p` where it lies, both parts in place?"""
    a_part, b_part = local_parts(A, B, p)
    return (_in_place(a_part, p.a_root, grid.col, grid.shape[1], direct[0])
            and _in_place(b_part, p.b_root, grid.row, grid.shape[0], direct[1]))


#: Most panels a rank may receive and still multiply its own ones first: all
#: its receives must start at once, into the two slots of the default lookahead.
OWN_FIRST_RECEIVES = 2


def _own_first(panels, grid, A, B, direct, lookahead) -> list:
    """The panels this rank multiplies before all others (:func:`_steps`): the
    ones it holds, where lookahead is on and it receives at most
    :data:`OWN_FIRST_RECEIVES` panels, adjacent in the common order, so that
    their broadcasts all start at once whatever the depth; else none (the
    common order). Otherwise a receive would wait for a GEMM of the common
    order while this rank's GEMMs went another way (and the peers' sends behind
    it on the broadcaster's stream with it). The rule does not depend on the
    lookahead's depth, so neither do the bits (lookahead 0 aside)."""
    held = [i for i, p in enumerate(panels) if _held(p, grid, A, B, direct)]
    received = sorted(set(range(len(panels))) - set(held))
    adjacent = len(received) < 2 or received[-1] - received[0] == len(received) - 1
    if lookahead >= 1 and held and len(received) <= OWN_FIRST_RECEIVES and adjacent:
        return held
    return []


def _someone_waits_first(panels, grid, A, B, direct, lookahead) -> bool:
    """Collective: does any rank's first GEMM wait for a broadcast (neither its
    own panels first nor the first panel its own)?"""
    mine = not (_own_first(panels, grid, A, B, direct, lookahead)
                or (panels and _held(panels[0], grid, A, B, direct)))
    return grid.comm.allreduce(mine, op=MPI.LOR)


def _fetched(p, grid, direct) -> int:
    """How many of panel `p`'s two parts this rank copies from another rank."""
    return int(direct[0] and p.a_root != grid.col) + int(direct[1] and p.b_root != grid.row)


def _pipeline(alpha, A, B, C, panels, lookahead, row_bc, col_bc, direct, marks, precision,
              progress, extra, operand_a=None, product=None) -> None:
    """The SUMMA steps with `lookahead` panels in flight; GEMM marks go to `marks`,
    the direct broadcasters' set-up and tear-down seconds to `extra`; each
    GEMM reads A as `operand_a` (a :class:`PanelsOfA`) gives it, or with
    `product` each panel product is ``product(a, b)`` instead."""
    grid, xp = C.grid, C.backend.xp
    mloc, nloc = C.local.shape
    depth = lookahead + 1
    width = max((p.width for p in panels), default=0)
    nslots = min(depth, len(panels))
    # Panel buffers only where panels arrive from other ranks.
    a_bufs = [xp.empty(mloc * width if grid.shape[1] > 1 else 0, dtype=C.dtype)
              for _ in range(nslots)]
    b_bufs = [xp.empty(width * nloc if grid.shape[0] > 1 else 0, dtype=C.dtype)
              for _ in range(nslots)]

    # Broadcasters that can read the roots' blocks directly (ipc) need no packing
    # on the root and no per-panel handshake: the blocks are exported once, and
    # the (collective, slow) opening of the peers' blocks waits until this
    # rank's first GEMM is queued on its own panel, which it then hides.
    readers = [bc for bc, on in zip((row_bc, col_bc), direct) if on]
    connected = not readers
    # Direct copies into a slot wait only for the GEMM that last read it.
    slot_free = [None] * nslots

    def connect():
        nonlocal connected
        if not connected:
            t0 = time.perf_counter()
            for bc in readers:
                bc.connect()
            extra["connect_seconds"] = time.perf_counter() - t0
            extra["opened_blocks"] = sum(bc.opened_blocks for bc in readers)
            connected = True

    # Panels this rank multiplies first, where they lie (none: the common order).
    # Their sends, like every receive then, start at once: they wait only for
    # the operands' values, not for the GEMMs queued before them. (In the common
    # order a send waits for those, so that it starts when its receivers do and
    # NCCL's kernels do not spin beside the GEMMs meanwhile.)
    held = set(_own_first(panels, grid, A, B, direct, lookahead))
    extra["own_first"] = bool(held)
    operands = C.backend.record_event()

    def panel(local_panel, bufs, shape, root, me, broadcaster, slot, region, direct,
              early):
        # The owner multiplies (and, where it is contiguous, broadcasts) its
        # panel where it lies; GEMM takes row-strided views, so a grid row or
        # column of one rank never copies at all.
        own = _in_place(local_panel, root, me, broadcaster.comm.Get_size(), direct)
        if own:
            view = local_panel
        else:
            view = bufs[slot][: shape[0] * shape[1]].reshape(shape)
            if me == root:
                view[...] = local_panel
        if direct:
            return view, broadcaster.iget(view, root, *region, after=slot_free[slot])
        if own and early:
            return view, broadcaster.ibcast(view, root, slot, ready=operands, own=True)
        return view, broadcaster.ibcast(view, root, slot)

    def finished(i):
        if readers and _fetched(panels[i], grid, direct):
            slot_free[i % depth] = C.backend.record_event()

    def start(i):
        p, slot = panels[i], i % depth
        if _fetched(p, grid, direct):
            connect()  # after the GEMMs of the panels this rank holds are queued
        a_part, b_part = local_parts(A, B, p)
        a_cols = slice(p.a_offset, p.a_offset + p.width)
        b_rows = slice(p.b_offset, p.b_offset + p.width)
        a, ra = panel(a_part, a_bufs, (mloc, p.width), p.a_root, grid.col, row_bc, slot,
                      (slice(0, mloc), a_cols), direct[0], i in held)
        b, rb = panel(b_part, b_bufs, (p.width, nloc), p.b_root, grid.row, col_bc, slot,
                      (b_rows, slice(0, nloc)), direct[1], i in held)
        return a, b, ra, rb

    # With direct copies, the GEMMs of the leading panels this rank holds are
    # all queued before the first fetch, whose set-up (opening the peers'
    # blocks) they then hide.
    hold = next((j for j, p in enumerate(panels) if _fetched(p, grid, direct)),
                len(panels)) if readers else 0
    try:
        _steps(alpha, C, panels, depth, hold, start, finished, marks, precision, progress,
               held, lambda i: local_parts(A, B, panels[i]), operand_a, product)
        connect()  # every rank takes part, even one that fetched nothing
    except BaseException:
        for bc in readers:  # the peers may be gone: close what this rank opened, no barrier
            bc.release_local()
        raise
    t0 = time.perf_counter()
    for bc in readers:
        bc.release()
    if readers:
        extra["release_seconds"] = time.perf_counter() - t0


def _steps(alpha, C, panels, depth, hold, start, finished, marks, precision,
           progress, held=(), views=None, operand_a=None, product=None) -> None:
    """Run the SUMMA steps.

    `start(i)` queues panel i's broadcasts, in list order (the order every rank
    shares), into slot ``i % depth``, which panel ``i - depth`` must have left:
    its GEMM queued, or, for a panel in `held` (multiplied where it lies, on
    views ``views(i)``; its slot carries only what this rank sends), its
    sends settled (:func:`_settle`). The GEMMs of `held` panels go
    first, in list order, as they wait for nothing; then the others in list
    order, `depth` steps behind their broadcasts. Panels from `hold` on start
    only once the GEMMs before `hold` are queued (direct copies hide their
    set-up behind those). `finished(i)` runs when GEMM i is queued. The order
    depends only on the panels and `held`, not on `depth`. `operand_a(a)`
    (default: `a` itself) is the A operand each GEMM reads.
    """
    backend, grid = C.backend, C.grid
    n = len(panels)
    first = set(held)
    order = sorted(first) + [i for i in range(n) if i not in first]
    inflight: dict = {}  # started, and not done with: GEMM to come, or a held one's sends
    started = queued = 0  # panels started; GEMMs queued

    def vacate(j) -> bool:
        """Make panel j's slot free for panel ``j + depth``; False if not yet."""
        if j not in inflight:
            return True  # before the first panel, or done with
        if j not in first:
            return False  # its GEMM comes later
        _settle(*inflight.pop(j)[2:])  # a held panel's sends: no stream waits for them
        return True

    def start_more(need: int = -1) -> None:
        """Start the panels up to `need`, and then more while slots are free."""
        nonlocal started
        while started < n:
            if started > need and started >= hold > queued:
                return
            if not vacate(started - depth):
                if started > need:
                    return
                # Cannot happen: every panel before `need` has had its GEMM.
                raise RuntimeError(f"SUMMA schedule: panel {need} needs a slot still in use")
            inflight[started] = start(started)
            started += 1

    start_more()
    for step, i in enumerate(order):
        if i in first:  # multiplied where it lies; its sends go out in list order
            a, b = views(i)
        else:
            start_more(need=i)
            a, b, ra, rb = inflight.pop(i)
        if step == 1:
            inject("summa")
        if i not in first:
            wait_for_panel(i, panels[i], ra, rb, grid)
        marks.append(backend.timing_mark())  # the copy of A, if any, counts as compute
        a = a if operand_a is None else operand_a(a)
        if product is None:
            backend.gemm(alpha, a, b, C.local, precision=precision)
        else:
            product(a, b)
        marks.append(backend.timing_mark())
        queued += 1
        finished(i)
        if progress is not None:
            progress(step + 1, n)
        # Refilling the slot just used: on the GPU, queue order (compute
        # stream, or the broadcaster waiting on it) puts this after the GEMM.
        start_more()
    start_more(n - 1)
    for j in sorted(inflight):  # the held panels' last sends
        _settle(*inflight.pop(j)[2:])


def _settle(*sends) -> None:
    """Complete the broadcasts a rank sent from its own block: host requests
    (MPI) finish here; device ones need no stream to wait, since that block is
    never rewritten (waiting would tie this rank's GEMMs to the receivers'
    progress)."""
    for pending in sends:
        with watch("a broadcast this rank sends to finish"):
            pending.settle()


def local_parts(A: DistMatrix, B: DistMatrix, p) -> tuple:
    """This rank's stored parts of panel `p`: its columns of A and its rows of B
    (views; meaningful on the panel's roots)."""
    return (A.local[:, p.a_offset:p.a_offset + p.width],
            B.local[p.b_offset:p.b_offset + p.width, :])


def wait_for_panel(i: int, p, ra, rb, grid, context: str = "") -> None:
    """Complete panel `i`'s two broadcasts, each a step the watchdog can name
    (`context`, e.g. " for C tile 2", is appended to the name)."""
    with watch(f"the broadcast of A panel {i} (columns {p.k0}:{p.k1}) from grid column "
               f"{p.a_root} along grid row {grid.row}{context}"):
        ra.wait()
    with watch(f"the broadcast of B panel {i} (rows {p.k0}:{p.k1}) from grid row "
               f"{p.b_root} along grid column {grid.col}{context}"):
        rb.wait()


_OPS = ("N", "T", "H")


def _check_op(name: str, op) -> str:
    op = str(op).upper()
    if op not in _OPS:
        raise ValueError(f"{name} must be one of N, T, H; got {op!r}")
    return op


def _operand(X: DistMatrix, op: str, outer: Distribution, inner_block,
             outer_axis: int) -> DistMatrix:
    """``op(X)`` with its outer dimension distributed as `outer` (C's rows for A,
    C's columns for B); a transposed operand is redistributed straight into it.
    An untransposed operand must already match (checked by :func:`gemm`)."""
    if op == "N":
        return X
    inner = Distribution(X.shape[0] if outer_axis == 0 else X.shape[1],
                         X.grid.shape[1 - outer_axis], inner_block)
    dists = (outer, inner) if outer_axis == 0 else (inner, outer)
    conj = op == "H" and X.dtype.kind == "c"
    return X.transpose(conj=conj, layout=Layout.from_distributions(*dists))


def gemm(A: DistMatrix, B: DistMatrix, C: DistMatrix | None = None, alpha=1.0, beta=0.0,
         trans_a: str = "N", trans_b: str = "N", panel_width=None, lookahead: int = 1,
         broadcaster: str = "auto", precision: str | None = None,
         stats: SummaStats | None = None, progress=None, schedule: str = "panels",
         moduli: int | None = None) -> DistMatrix:
    """``C <- alpha * op(A) @ op(B) + beta * C`` with op in N, T, H.

    Parameters
    ----------
    A, B : DistMatrix
        Operands on one grid. A transposed operand is redistributed first (one
        exchange of its blocks), straight into the layout the product needs.
    C : DistMatrix, optional
        Updated in place and returned. When None, a new matrix is returned whose
        rows are distributed like op(A)'s and columns like op(B)'s (beta ignored).
    alpha, beta : scalar
    trans_a, trans_b : {"N", "T", "H"}
        ``H`` is the conjugate transpose (the transpose for real dtypes).
    panel_width, lookahead, broadcaster, precision, progress, schedule
        See :func:`summa`.
    stats : SummaStats, optional
        Filled with this rank's timings.
    moduli : int, optional
        With ``precision="fp64-int8"``: INT8 products per float64 product
        (3-30; default :func:`summa.ozaki.default_moduli`'s, 15 for panels
        up to 56391 wide); fewer is faster and keeps fewer bits.

    Returns
    -------
    DistMatrix
        C.

    Examples
    --------
    >>> C = gemm(A, B, trans_a="T", alpha=2.0)  # doctest: +SKIP
    """
    op_a, op_b = _check_op("trans_a", trans_a), _check_op("trans_b", trans_b)
    # Everything below is checked before the transposes, so bad input never
    # starts communication.
    grid = A.grid
    m, n, _ = check_operands(A, B, C, op_a, op_b)
    check_scalars(alpha, beta, A.dtype, precision, A.backend)
    moduli = check_moduli(moduli, precision)
    check_schedule(schedule, grid.shape)
    if C is None:
        rows = A.layout.rows if op_a == "N" else Distribution(m, grid.shape[0], A.layout.cols.block)
        cols = B.layout.cols if op_b == "N" else Distribution(n, grid.shape[1], B.layout.rows.block)
    else:
        rows, cols = C.layout.rows, C.layout.cols
    for name, X, op, outer, axis in (("A", A, op_a, rows, 0), ("B", B, op_b, cols, 1)):
        have = X.layout.rows if axis == 0 else X.layout.cols
        if op == "N" and have != outer:
            raise ValueError(f"{name} is distributed as {have} along the dimension it "
                             f"shares with C, but C is distributed as {outer}")
    opA = _operand(A, op_a, rows, A.layout.rows.block, 0)
    opB = _operand(B, op_b, cols, B.layout.cols.block, 1)
    if C is None:
        layout = Layout.from_distributions(rows, cols)
        local = A.backend.xp.zeros(layout.local_shape(grid.row, grid.col), dtype=A.dtype)
        C, beta = DistMatrix(grid, layout, local, A.backend), 0.0
    with asked_moduli(moduli):
        result = summa(alpha, opA, opB, beta, C, panel_width=panel_width, lookahead=lookahead,
                       broadcaster=broadcaster, precision=precision, progress=progress,
                       schedule=schedule)
    if stats is not None:
        for key, value in result.as_dict().items():
            setattr(stats, key, value)
    return C
