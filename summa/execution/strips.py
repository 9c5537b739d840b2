"""Column strips: on a grid of one column, every GEMM runs over all of K.

On a P x 1 grid each rank holds its rows of A with all of K, and B's rows are
spread over the P ranks. SUMMA's panels cut K, so each GEMM multiplies over a
panel's width of it; here the ranks instead assemble B strip by strip (all K
rows, a strip of columns, each rank broadcasting the rows it holds) and
multiply ``C[:, strip] += alpha * A_local @ B[:, strip]`` over all of K. Each
rank receives the same data as under SUMMA, and keeps ``lookahead + 1`` strip
buffers of K x width (SUMMA's panel buffers are width x N: the same for square
products). Why: on the H200, float32 GEMMs over half of K ran 3 % slower than
over all of it, while cutting the columns cost nothing (docs/benchmarks.md).

The strips' order, widths and GEMMs do not depend on the lookahead, so neither
do the bits; they differ from SUMMA's panels' (another summation order). With
direct copies (ipc) the first strip is multiplied piece by piece, a rank's own
rows first, to hide the opening of the peers' blocks.

Measured on 2 H200s at N = 32768 (docs/benchmarks.md, "Measurements behind
the defaults"): float32
104.0 TFLOP/s against 102.1 for row-major panels, but 107.2 for panels whose A
is read column-major (:mod:`summa.execution.transpose`), and in TF32 and float16 strips
lose (their first GEMMs cannot hide the ipc set-up): so they stay an option.
"""

from __future__ import annotations

import time

from ..runtime.faults import inject
from ..runtime.watchdog import watch

__all__ = ["strip_bounds", "multiply_strips"]

def strip_bounds(n: int, width: int, head_pieces: int = 1) -> list[tuple[int, int]]:
    """Column ranges ``[s0, s1)`` covering ``[0, n)``: strips of `width`, the
    first one cut in `head_pieces` (its broadcasts are the pipeline's fill)."""
    width = max(1, int(width))
    cuts = list(range(0, n, width)) + [n]
    bounds = list(zip(cuts[:-1], cuts[1:]))
    if bounds and head_pieces > 1:
        s0, s1 = bounds[0]
        inner = [s0 + (s1 - s0) * i // head_pieces for i in range(head_pieces + 1)]
        head = [(a, b) for a, b in zip(inner[:-1], inner[1:]) if b > a]
        bounds = head + bounds[1:]
    return bounds


def multiply_strips(call, strips, marks, extra) -> None:
    """``C += alpha * A @ B`` strip by strip, `lookahead` strips' broadcasts in
    flight during each GEMM; GEMM marks go to `marks`, the broadcaster's
    connection to `extra`. `call` (:class:`summa.execution.steps.Call`, a
    prepared call of :func:`summa.execution.algorithm.summa`) gives alpha, A,
    B, C, the lookahead, precision and progress, and `col_bc`, which
    broadcasts along the grid column (every rank of it); ``call.direct[1]``:
    it copies straight from the owners' exported blocks (ipc)."""
    _Strips(call, strips, marks).run(extra)


class _Strips:
    """One multiply's strips: their buffers, B's pieces and the GEMMs
    (see :func:`multiply_strips`)."""

    def __init__(self, call, strips, marks):
        self.call, self.strips, self.marks = call, strips, marks
        self.direct, C, B = call.direct[1], call.C, call.B
        self.grid, self.backend = C.grid, C.backend
        self.k, self.depth = B.shape[0], call.lookahead + 1
        width = max((s1 - s0 for s0, s1 in strips), default=0)
        self.bufs = [C.backend.xp.empty(self.k * width, dtype=C.dtype)
                     for _ in range(min(self.depth, len(strips)))]
        # Where each rank's rows of B go in a strip: (root, global rows, its local rows).
        self.pieces = [(r, g0, g1, l0) for r in range(self.grid.shape[0])
                       for g0, g1, l0 in B.layout.rows.segments(r)]
        self.slot_free = [None] * len(self.bufs)
        # Direct copies: the first strip goes piece by piece, this rank's own rows
        # first, whose GEMM is queued before the (collective, 10-20 ms for large
        # blocks) opening of the peers' blocks and so hides it.
        self.split_first = self.direct and bool(strips)

    def run(self, extra) -> None:
        col_bc, direct = self.call.col_bc, self.direct
        if self.split_first:
            self._first_own_rows()
        if direct:
            t0 = time.perf_counter()
            col_bc.connect()
            extra["connect_seconds"] = time.perf_counter() - t0
            extra["opened_blocks"] = col_bc.opened_blocks
        try:
            self._strips()
        except BaseException:
            if direct:
                col_bc.release_local()  # the peers may be gone: no barrier
            raise
        if direct:
            t0 = time.perf_counter()
            col_bc.release()
            extra["release_seconds"] = time.perf_counter() - t0

    def _multiply(self, a, b, c) -> None:
        self.marks.append(self.backend.timing_mark())
        self.backend.gemm(self.call.alpha, a, b, c, precision=self.call.precision,
                          scheme=self.call.scheme)
        self.marks.append(self.backend.timing_mark())

    def _first_own_rows(self) -> None:
        """The first strip's GEMMs of this rank's own rows of B, where they lie."""
        (s0, s1), A, B, C = self.strips[0], self.call.A, self.call.B, self.call.C
        for root, g0, g1, l0 in self.pieces:
            if root == self.grid.row:
                self._multiply(A.local[:, g0:g1], B.local[l0:l0 + g1 - g0, s0:s1],
                               C.local[:, s0:s1])

    def _start(self, i: int) -> tuple:
        """Strip i's pieces on their way into its slot: ``(buffer, pending)``."""
        (s0, s1), slot, k = self.strips[i], i % self.depth, self.k
        buf = self.bufs[slot][: k * (s1 - s0)].reshape(k, s1 - s0)
        pending = []
        for j, (root, g0, g1, l0) in enumerate(self.pieces):
            view = buf[g0:g1]
            # Its own rows: for its GEMM, and the send buffer of paired broadcasts;
            # not where the first strip's own rows were multiplied where they lie.
            if root == self.grid.row and not (i == 0 and self.split_first):
                view[...] = self.call.B.local[l0:l0 + g1 - g0, s0:s1]
            if self.direct:
                pending.append(self.call.col_bc.iget(view, root, slice(l0, l0 + g1 - g0),
                                                     slice(s0, s1), after=self.slot_free[slot]))
            else:
                # A staging slot of its own for every piece: the pieces of one
                # strip are in flight together (sharing one gave wrong products
                # through host-staged MPI).
                pending.append(self.call.col_bc.ibcast(view, root,
                                                       slot * len(self.pieces) + j))
        return buf, pending

    def _strips(self) -> None:
        strips, depth, progress = self.strips, self.depth, self.call.progress
        A, C = self.call.A, self.call.C
        inflight = {i: self._start(i) for i in range(min(depth, len(strips)))}
        for i, (s0, s1) in enumerate(strips):
            buf, pending = inflight.pop(i)
            if i == 1:
                inject("summa")
            self._wait(i, pending)
            if i == 0 and self.split_first:  # the peers' rows (its own went first)
                for root, g0, g1, _ in self.pieces:
                    if root != self.grid.row:
                        self._multiply(A.local[:, g0:g1], buf[g0:g1], C.local[:, s0:s1])
            else:
                self._multiply(A.local, buf, C.local[:, s0:s1])
            if self.direct:
                self.slot_free[i % depth] = self.backend.record_event()
            if progress is not None:
                progress(i + 1, len(strips))
            if i + depth < len(strips):
                # Into the slot just read: on the GPU it waits for that GEMM
                # (compute stream, or the event above for direct copies).
                inflight[i + depth] = self._start(i + depth)

    def _wait(self, i: int, pending: list) -> None:
        s0, s1 = self.strips[i]
        for (root, g0, g1, _), p in zip(self.pieces, pending):
            with watch(f"the broadcast of B's rows {g0}:{g1}, columns {s0}:{s1} from "
                       f"grid row {root} along grid column {self.grid.col}"):
                p.wait()
