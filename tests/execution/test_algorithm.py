"""SUMMA against a float64 NumPy reference, on every grid, shape, dtype and op."""

import numpy as np
import pytest
from mpi4py import MPI

import summa.execution.algorithm as algorithm
from helpers import gemm_scaled_error, random_array
from leftovers import interrupt
from summa.execution.algorithm import SummaStats, gemm, summa
from summa.api.multiply import matmul
from summa.transports.comm import choose_comm
from summa.distribution.grid import ProcessGrid
from summa.distribution.layout import panel_schedule
from summa.distribution.matrix import DistMatrix
from summa.planning.distributed import plan_distributed
from summa.planning.request import PlanRequest
from summa.planning.schedule import HEAD_PIECES, fetched

#: Each test's subject is the process grid's shape: ./run test runs them on every
#: rank count (the others on a few: pyproject.toml's markers).
pytestmark = pytest.mark.grid

GRIDS = ["auto", "row", "col"]
# (M, N, K): square, uneven, primes, smaller than any grid, K = 1, empty-ish
SHAPES = [(24, 24, 24), (37, 23, 41), (13, 7, 29), (2, 3, 1), (1, 1, 5), (5, 1, 2), (61, 2, 3)]


def make_grid(comm, which):
    p = comm.Get_size()
    return ProcessGrid(comm, {"auto": None, "row": (1, p), "col": (p, 1)}[which])


def distribute(x, grid, backend, block=None):
    return DistMatrix.from_global(x, grid, backend, block=block)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("which", GRIDS)
@pytest.mark.parametrize("shape", SHAPES)
def test_matmul_every_dtype(comm, backend, rng, which, shape):
    m, n, k = shape
    with make_grid(comm, which) as grid:
        for dtype in backend.dtypes:
            a, b = random_array(rng, (m, k), dtype), random_array(rng, (k, n), dtype)
            C = matmul(distribute(a, grid, backend), distribute(b, grid, backend), panel_width=4)
            c = C.gather()
            if comm.rank == 0:
                assert c.shape == (m, n) and c.dtype == dtype
                assert gemm_scaled_error(c, a, b) <= 1, dtype


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("trans_a", ["N", "T", "H"])
@pytest.mark.parametrize("trans_b", ["N", "T", "H"])
@pytest.mark.parametrize("dtype", ["float64", "complex64"])
def test_gemm_ops_alpha_beta(comm, backend, rng, trans_a, trans_b, dtype):
    m, n, k = 19, 11, 14
    alpha, beta = (1.5 - 0.5j, 0.25 + 1j) if dtype.startswith("complex") else (-1.5, 0.75)
    a = random_array(rng, (m, k) if trans_a == "N" else (k, m), dtype)
    b = random_array(rng, (k, n) if trans_b == "N" else (n, k), dtype)
    c0 = random_array(rng, (m, n), dtype)
    with make_grid(comm, "auto") as grid:
        C = distribute(c0, grid, backend)
        out = gemm(distribute(a, grid, backend), distribute(b, grid, backend), C,
                   alpha=alpha, beta=beta, trans_a=trans_a, trans_b=trans_b, panel_width=3)
        assert out is C
        c = C.gather()
    if comm.rank == 0:
        assert gemm_scaled_error(c, a, b, c0, alpha, beta, trans_a, trans_b) <= 1


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("which", GRIDS)
@pytest.mark.parametrize("block", [(1, 1), (3, 2), (4, 7)])
@pytest.mark.parametrize("trans_a", ["N", "T"])
def test_block_cyclic_layouts(comm, backend, rng, which, block, trans_a):
    m, n, k = 23, 17, 31
    a = random_array(rng, (m, k) if trans_a == "N" else (k, m), "float64")
    b = random_array(rng, (k, n), "float64")
    with make_grid(comm, which) as grid:
        A, B = distribute(a, grid, backend, block), distribute(b, grid, backend, block)
        for width in (1, 5, 100):  # panel width independent of the block size
            c = gemm(A, B, trans_a=trans_a, panel_width=width).gather()
            if comm.rank == 0:
                assert gemm_scaled_error(c, a, b, trans_a=trans_a) <= 1


@pytest.mark.mpi(min_size=1)
def test_beta_zero_ignores_nan_and_beta_one_accumulates(comm, backend, rng):
    a, b = random_array(rng, (9, 6), "float64"), random_array(rng, (6, 8), "float64")
    c0 = random_array(rng, (9, 8), "float64")
    with make_grid(comm, "auto") as grid:
        A, B = distribute(a, grid, backend), distribute(b, grid, backend)
        C = distribute(np.full((9, 8), np.nan) if comm.rank == 0 else None, grid, backend)
        c = gemm(A, B, C, beta=0.0).gather()
        C1 = distribute(c0, grid, backend)
        c1 = gemm(A, B, C1, beta=1.0).gather()
    if comm.rank == 0:
        assert gemm_scaled_error(c, a, b) <= 1
        assert gemm_scaled_error(c1, a, b, c0, 1.0, 1.0) <= 1


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("which", GRIDS)
def test_lookahead_depth_gives_identical_bits(comm, backend, which):
    with make_grid(comm, which) as grid:
        A = DistMatrix.random((40, 33), "float32", grid, backend, seed=3)
        B = DistMatrix.random((33, 29), "float32", grid, backend, seed=4)
        results = [matmul(A, B, panel_width=4, lookahead=la).gather() for la in (0, 1, 2, 5)]
        again = matmul(A, B, panel_width=4, lookahead=1).gather()
    if comm.rank == 0:
        for r in results[1:] + [again]:
            assert np.array_equal(r, results[0])


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("k", [16, 11, 40, 12])
@pytest.mark.parametrize("lookahead", [0, 1, 3])
def test_own_panels_go_first_where_every_receive_starts_at_once(comm, rng, monkeypatch, k,
                                                               lookahead):
    """On a grid column (P x 1) a rank holds its B rows' panels: it multiplies
    them first when lookahead is on and it receives at most two panels, next
    to each other in the common order (all their broadcasts then start at
    once); otherwise in the common order. The product is right either way,
    and the same bits for every lookahead >= 1."""
    from summa.planning.schedule import OWN_FIRST_RECEIVES
    from summa.device.backend import get_backend
    backend = get_backend("numpy")
    a, b = random_array(rng, (9, k), "float64"), random_array(rng, (k, 7), "float64")
    with make_grid(comm, "col") as grid:
        A, B = distribute(a, grid, backend), distribute(b, grid, backend)
        panels = panel_schedule(A.layout.cols, B.layout.rows, 4)
        own = [q.b_root == grid.row for q in panels]
        seen = []
        real_gemm = backend.gemm
        monkeypatch.setattr(backend, "gemm", lambda alpha, x, y, *rest, **kw: (
            seen.append(np.shares_memory(y, B.local)), real_gemm(alpha, x, y, *rest, **kw))[1])
        c = matmul(A, B, panel_width=4, lookahead=lookahead).gather()
        monkeypatch.setattr(backend, "gemm", real_gemm)
        again = matmul(A, B, panel_width=4, lookahead=5).gather()
    received = [i for i, mine in enumerate(own) if not mine]
    adjacent = len(received) < 2 or received[1] - received[0] == 1
    stats = SummaStats()
    with make_grid(comm, "col") as grid:
        matmul(distribute(a, grid, backend), distribute(b, grid, backend), panel_width=4,
               lookahead=lookahead, stats=stats)
    if lookahead >= 1 and 0 < len(received) <= OWN_FIRST_RECEIVES and adjacent:
        assert seen == sorted(own, reverse=True)  # own panels, then the received ones
        assert stats.extra["own_first"] is True
    else:
        assert seen == own  # the common order
        assert stats.extra["own_first"] is False
    if comm.rank == 0:
        assert gemm_scaled_error(c, a, b) <= 1
        if lookahead >= 1:
            assert np.array_equal(c, again)


@pytest.mark.mpi(min_size=2)
def test_prepare_leaves_the_multiply_nothing_to_set_up(comm, backend, rng):
    """``prepare`` makes the broadcasters of the plan the planner settled
    (an "auto" width measured there), so the multiply that follows (timed by
    ``summa multiply``) does neither."""
    from summa.execution.algorithm import prepare
    from summa.execution.transpose import PanelsOfA
    a, b = random_array(rng, (40, 36), "float64"), random_array(rng, (36, 28), "float64")
    with make_grid(comm, "auto") as grid:
        A, B = distribute(a, grid, backend), distribute(b, grid, backend)
        C = DistMatrix.zeros((40, 28), "float64", grid, backend)
        assert not grid.resources
        plan, _ = plan_distributed(A, B, C, PlanRequest(panel_width="auto"),
                                   panels_of_a=PanelsOfA)
        prepare(plan, A, B, C)
        made = dict(grid.resources)
        assert made  # the broadcasters
        stats = SummaStats()
        gemm(A, B, C, panel_width="auto", stats=stats)
        assert grid.resources == made
        assert stats.extra["panel_width_measured"] is False
        c = C.gather()
    if comm.rank == 0:
        assert gemm_scaled_error(c, a, b) <= 1


@pytest.mark.mpi(min_size=1)
def test_stats_are_filled(comm, backend):
    with make_grid(comm, "auto") as grid:
        A = DistMatrix.random((32, 32), "float64", grid, backend, seed=1)
        B = DistMatrix.random((32, 32), "float64", grid, backend, seed=2)
        stats = SummaStats()
        gemm(A, B, panel_width=8, stats=stats)
        steps = len(panel_schedule(A.layout.cols, B.layout.rows, 8))
    # one rank multiplies in a single GEMM (panel by panel where A is read
    # transposed: float64 on GPUs); more ranks step through the panels,
    # on GPUs the first in HEAD_PIECES where some rank would wait for it, i.e.
    # not every rank multiplies its own panels first (products this small use
    # paired broadcasts; on 2 x 1 both ranks hold half of B's rows)
    assert steps >= 4
    own_first_everywhere = comm.allreduce(stats.extra.get("own_first", False), op=MPI.LAND)
    if comm.Get_size() > 1 and backend.name == "cupy" and not own_first_everywhere:
        steps += HEAD_PIECES - 1
    one_rank = steps if stats.extra["transposed_a"] else 1
    assert stats.panels == (one_rank if comm.Get_size() == 1 else steps)
    assert stats.panel_width == 8
    assert stats.seconds > 0 and 0 <= stats.compute <= stats.seconds
    assert stats.wait == pytest.approx(stats.seconds - stats.compute)
    from summa.transports.comm import choose_comm
    # on GPUs of one node, small blocks are copied directly (they stay open)
    assert stats.comm in ("mpi", choose_comm("auto", backend)) + (
        ("ipc",) if backend.name == "cupy" and comm.Get_size() > 1 else ())


@pytest.mark.mpi(min_size=1)
def test_errors_raise_on_every_rank_before_communicating(comm, backend):
    with make_grid(comm, "auto") as grid:
        A = DistMatrix.random((6, 5), "float64", grid, backend, seed=1)
        B = DistMatrix.random((4, 7), "float64", grid, backend, seed=2)
        B5 = DistMatrix.random((5, 7), "float64", grid, backend, seed=2)
        B32 = DistMatrix.random((5, 7), "float32", grid, backend, seed=2)
        with pytest.raises(ValueError, match="inner dimensions"):
            matmul(A, B)
        with pytest.raises(ValueError, match="dtypes differ"):
            matmul(A, B32)
        with pytest.raises(ValueError, match="C is 3x3"):
            gemm(A, B5, DistMatrix.zeros((3, 3), "float64", grid, backend))
        with pytest.raises(ValueError, match="trans_a"):
            gemm(A, B5, trans_a="X")
        with pytest.raises(ValueError, match="panel width"):
            matmul(A, B5, panel_width=0)
        with pytest.raises(ValueError, match="lookahead"):
            matmul(A, B5, lookahead=-1)
        with pytest.raises(ValueError, match="communication mode"):
            matmul(A, B5, broadcaster="carrier-pigeon")
        with pytest.raises(ValueError, match="alpha=.* is complex"):
            gemm(A, B5, alpha=1j)
        with pytest.raises(ValueError, match="tf32 applies to"):
            matmul(A, B5, precision="tf32")
        with pytest.raises(ValueError, match="precision must be"):
            matmul(A, B5, precision="fp8")
        if backend.name == "numpy":
            A32 = DistMatrix.random((6, 5), "float32", grid, backend, seed=1)
            with pytest.raises(ValueError, match="tf32 needs the cupy backend"):
                matmul(A32, B32, precision="tf32")
            with pytest.raises(ValueError, match="fp64-int8 needs the cupy backend"):
                matmul(A, B5, precision="fp64-int8")
        A32 = DistMatrix.random((6, 5), "float32", grid, backend, seed=1)
        with pytest.raises(ValueError, match="fp64-int8 emulates float64"):
            matmul(A32, B32, precision="fp64-int8")
        cyclic = DistMatrix.random((6, 5), "float64", grid, backend, seed=1, block=(2, 2))
        with pytest.raises(ValueError, match="distributed as"):
            gemm(cyclic, B5, DistMatrix.zeros((6, 7), "float64", grid, backend))
        with ProcessGrid(comm) as other:
            B_other = DistMatrix.random((5, 7), "float64", other, backend, seed=2)
            with pytest.raises(ValueError, match="same ProcessGrid"):
                matmul(A, B_other)
        elsewhere = DistMatrix(grid, B5.layout, B5.local, backend)
        elsewhere.backend = type("Other", (), {"name": "elsewhere"})()
        with pytest.raises(ValueError, match="same backend"):
            matmul(A, elsewhere)
        # low-level entry point checks the same things
        with pytest.raises(ValueError, match="inner dimensions"):
            summa(1.0, A, B, 0.0, DistMatrix.zeros((6, 7), "float64", grid, backend))



class WindowReader:
    """Test double of a direct broadcaster (as ``ipc`` is on GPUs), on the NumPy
    backend: at connect every rank takes a copy of its peers' blocks (as ipc
    maps them; portable, unlike MPI windows, which Open MPI 4.1 refused on the
    GPU machine), and receivers then copy panels out of them with no message.
    Records the calls the SUMMA loop makes."""

    name = "window"
    reads_blocks = True

    def __init__(self, comm, calls, refuse=False):
        self.comm, self.calls, self.blocks, self.refuse = comm, calls, None, refuse

    def export(self, block):
        self.calls.append("export")
        self.block = np.ascontiguousarray(block)
        assert self.block is block  # the loop hands over the stored block itself
        return not self.refuse

    def connect(self):
        self.calls.append("connect")
        self.blocks = self.comm.allgather(self.block)
        self.opened_blocks = self.comm.Get_size() - 1

    def iget(self, buf, root, rows, cols, after=None):
        self.calls.append("iget")
        if self.comm.rank != root and buf.size:
            buf[...] = self.blocks[root][rows, cols]
        return _Done()

    def ibcast(self, buf, root, slot=0, ready=None, own=False):
        if self.comm.Get_size() > 1:  # a grid row/column of one has nothing to move
            self.calls.append("ibcast")
            self.comm.Bcast(buf, root)  # paired, as NCCL's
        return _Done()

    def release(self):
        self.calls.append("release")
        self.comm.Barrier()
        self.release_local()

    def release_local(self):
        self.blocks = None

    def take_seconds(self):
        return 0.0


def use_window_readers(grid, backend, monkeypatch):
    """Make every multiply on `grid` use :class:`WindowReader` broadcasters;
    return them, the calls they record, and for each GEMM of `backend` how
    many calls came before it."""
    calls, gemms = [], []
    readers = (WindowReader(grid.row_comm, calls), WindowReader(grid.col_comm, calls))
    # (the executor makes the broadcasters the plan names)
    monkeypatch.setattr(algorithm, "grid_broadcasters", lambda *args, **kwargs: readers)
    real_gemm = backend.gemm
    monkeypatch.setattr(backend, "gemm", lambda *a, **kw: (gemms.append(len(calls)),
                                                           real_gemm(*a, **kw))[1])
    return readers, calls, gemms


class _Done:
    def settle(self):
        pass

    def wait(self):
        pass


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("which", GRIDS)
@pytest.mark.parametrize("lookahead", [0, 1, 3])
@pytest.mark.parametrize("shape", [(37, 23, 41), (2, 3, 1), (16, 16, 64)])
def test_direct_reads_match_reference_and_hide_the_connect(comm, rng, which, lookahead, shape,
                                                           monkeypatch):
    """A broadcaster that reads the roots' blocks (ipc) lets each rank take its
    own panels first and open the peers' blocks once, after its first GEMM."""
    from summa.device.backend import get_backend
    backend = get_backend("numpy")
    m, n, k = shape
    with make_grid(comm, which) as grid:
        readers, calls, gemms = use_window_readers(grid, backend, monkeypatch)
        a, b = random_array(rng, (m, k), "float64"), random_array(rng, (k, n), "float64")
        A, B = distribute(a, grid, backend), distribute(b, grid, backend)
        stats = SummaStats()
        C = gemm(A, B, panel_width=4, lookahead=lookahead, stats=stats)
        c = C.gather()
        if comm.rank == 0:
            assert gemm_scaled_error(c, a, b) <= 1
        direct = [bc.comm.Get_size() > 1 for bc in readers]
        assert calls.count("connect") == sum(direct) == calls.count("release")
        if any(direct):  # the peers' blocks each reader opened
            assert stats.extra["opened_blocks"] == sum(bc.comm.Get_size() - 1
                                                       for bc, on in zip(readers, direct) if on)
        own = [p for p in panel_schedule(A.layout.cols, B.layout.rows, 4)
               if not fetched(p, (grid.row, grid.col), direct)]
        if own and gemms and "connect" in calls:
            # the rank's own panels are all multiplied before anything is fetched
            first_connect = calls.index("connect")
            assert sum(g <= first_connect for g in gemms) >= len(own)


def test_auto_takes_direct_copies_only_where_own_gemms_hide_the_connect():
    """Opening the peers' blocks (~2 ms up to 256 MiB, ~20 ms above) must hide
    behind the GEMMs of a rank's own panels; the slowest rank decides for all."""
    from types import SimpleNamespace

    from summa.planning.selection import OPEN_SECONDS, connect_seconds, _hides_connect
    from summa.distribution.layout import Distribution

    def decide(n, dtype, precision=None, others=float("inf"), dirs=(True, True)):
        grid = SimpleNamespace(row=0, col=0, shape=(2, 1), comm=SimpleNamespace(
            allreduce=lambda value, op: min(value, others)))
        panels = panel_schedule(Distribution(n, 1), Distribution(n, 2), 4096)
        block = (n // 2) * n * np.dtype(dtype).itemsize  # A's and B's blocks on a 2x1 grid
        return _hides_connect(panels, grid, (n // 2, n), dtype, precision, (2 * block, block),
                              dirs)

    # own half of K on one rank of a 2x1 grid: 2 (n/2) n (n/2) flops; one B block opened
    assert decide(32768, "float64") and decide(32768, "float16")
    assert decide(16384, "float64") and decide(16384, "float32")
    assert decide(16384, "float16")  # 256 MiB opens in ~1 ms; its own GEMMs take ~3 ms
    assert not decide(16384, "float32", "tf32")  # 512 MiB: ~10-20 ms against 5 ms of GEMMs
    assert not decide(8192, "float16")
    assert decide(8192, "float16", dirs=(True, False))  # no column blocks to open: nothing to hide
    assert not decide(32768, "float64", others=-1e-3)  # another rank's GEMMs are too short
    shape = (3, 4)  # 3 A blocks of the row, 2 B blocks of the column
    assert connect_seconds(shape, 1 << 30, 1 << 20) == pytest.approx(
        3 * OPEN_SECONDS["large"] + 2 * OPEN_SECONDS["small"])
    # rows within nodes, columns across them: only the row's A blocks open
    assert connect_seconds(shape, 1 << 30, 1 << 20, (True, False)) == pytest.approx(
        3 * OPEN_SECONDS["large"])


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("which", GRIDS)
def test_prepare_opens_the_peers_blocks_for_direct_copies(comm, rng, which, monkeypatch):
    """``prepare`` (the set-up ahead of a timed multiply) exports, opens and
    releases the blocks a direct broadcaster reads, so that those kept open
    cost the multiply nothing; the multiply is still right."""
    from summa.execution.algorithm import prepare
    from summa.device.backend import get_backend
    backend = get_backend("numpy")
    with make_grid(comm, which) as grid:
        readers, calls, _ = use_window_readers(grid, backend, monkeypatch)
        a, b = random_array(rng, (20, 30), "float64"), random_array(rng, (30, 10), "float64")
        A, B = distribute(a, grid, backend), distribute(b, grid, backend)
        C = DistMatrix.zeros((20, 10), "float64", grid, backend)
        plan, _ = plan_distributed(A, B, C, PlanRequest(panel_width=4))
        prepare(plan, A, B, C)
        d = sum(bc.comm.Get_size() > 1 for bc in readers)
        assert calls == ["export"] * d + ["connect"] * d + ["release"] * d
        gemm(A, B, C, panel_width=4)
        c = C.gather()
        if comm.rank == 0:
            assert gemm_scaled_error(c, a, b) <= 1


def test_auto_copies_directly_where_the_blocks_stay_open(monkeypatch):
    """Blocks small enough to stay open at their readers after a multiply
    (summa.transports.ipc.keeps_open) take direct copies whether or not the first
    multiply hides opening them; in the directions that copy directly only,
    and only where every rank's blocks are."""
    from types import SimpleNamespace

    import summa.transports.ipc as ipc
    from summa.planning.selection import _stay_open

    monkeypatch.setattr(ipc, "keeps_open", lambda b, backend: b.nbytes <= 1000)
    others = [True]
    grid = SimpleNamespace(comm=SimpleNamespace(allreduce=lambda value, op: value and others[0]))
    small, big = np.ones(10), np.ones(1000)
    assert _stay_open(grid, None, (small, small), (True, True))
    assert not _stay_open(grid, None, (big, small), (True, True))
    assert not _stay_open(grid, None, (small, big), (True, True))
    assert _stay_open(grid, None, (small, big), (True, False))  # B's blocks are not read directly
    assert _stay_open(grid, None, (big, big), (False, False))
    others[0] = False
    assert not _stay_open(grid, None, (small, small), (True, True))  # another rank's are too large


@pytest.mark.parametrize("shape, read", [((2, 1), (False, True)), ((1, 2), (True, False)),
                                         ((2, 2), (True, True))])
def test_only_blocks_with_readers_must_stay_open(monkeypatch, shape, read):
    """A grid row (column) of one rank has no reader for its A (B) blocks:
    their size does not keep auto from copying the other direction's."""
    from types import SimpleNamespace

    import summa.planning.selection as selection

    asked = []
    monkeypatch.setattr(selection, "_stay_open",
                        lambda grid, backend, blocks, dirs: asked.append(dirs) or True)
    grid = SimpleNamespace(size=4, shape=shape, within_nodes=lambda: (True, True))
    local = SimpleNamespace(nbytes=8, shape=(1, 1))
    C = SimpleNamespace(grid=grid, backend=SimpleNamespace(name="cupy", is_gpu=True, supports_ipc=True), local=local,
                        dtype="float32")
    A = B = SimpleNamespace(local=local)
    assert selection.direct_copies_pay(A, B, C, [], "auto", None) is True
    assert asked == [read]


def test_blocks_stay_open_up_to_a_share_of_device_memory(monkeypatch):
    import types

    import summa.transports.ipc as ipc
    total = 141 << 30
    backend = types.SimpleNamespace(memory_total=lambda: total)
    limit = int(total * ipc.KEEP_OPEN_SHARE)
    assert ipc.keeps_open(types.SimpleNamespace(nbytes=limit), backend)
    assert not ipc.keeps_open(types.SimpleNamespace(nbytes=limit + 1), backend)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("which", GRIDS)
@pytest.mark.parametrize("lookahead", [0, 1, 2])
@pytest.mark.parametrize("reads", ["rows", "columns"])
def test_direct_reads_in_one_direction_and_paired_broadcasts_in_the_other(comm, rng, which,
                                                                         lookahead, reads,
                                                                         monkeypatch):
    """Grids whose rows lie within nodes but whose columns span them read row
    panels directly (ipc) and broadcast column panels in pairs (NCCL): ranks
    of one column then reorder their panels alike, so the pairs still match."""
    from summa.device.backend import get_backend
    from summa.transports.broadcasters import make_broadcaster
    backend = get_backend("numpy")
    a, b = random_array(rng, (37, 45), "float64"), random_array(rng, (45, 23), "float64")
    with make_grid(comm, which) as grid:
        calls = []
        if reads == "rows":
            pair = (WindowReader(grid.row_comm, calls), make_broadcaster("mpi", grid.col_comm,
                                                                         backend))
        else:
            pair = (make_broadcaster("mpi", grid.row_comm, backend),
                    WindowReader(grid.col_comm, calls))
        monkeypatch.setattr(algorithm, "grid_broadcasters", lambda *args, **kwargs: pair)
        A, B = distribute(a, grid, backend), distribute(b, grid, backend)
        c = matmul(A, B, panel_width=4, lookahead=lookahead).gather()
        again = matmul(A, B, panel_width=4, lookahead=lookahead).gather()
    if comm.rank == 0:
        assert gemm_scaled_error(c, a, b) <= 1
        assert np.array_equal(c, again)


@pytest.mark.mpi(min_size=2)
def test_a_block_that_cannot_be_exported_means_paired_broadcasts_everywhere(comm, rng,
                                                                            monkeypatch):
    """If any rank cannot export its block, every rank falls back to paired
    broadcasts in one common order (no rank waits for a read that never comes)."""
    from summa.device.backend import get_backend
    backend = get_backend("numpy")
    with make_grid(comm, "col") as grid:
        calls = []
        readers = (WindowReader(grid.row_comm, calls),
                   WindowReader(grid.col_comm, calls, refuse=comm.rank == 1))
        monkeypatch.setattr(algorithm, "grid_broadcasters", lambda *args, **kwargs: readers)
        a, b = random_array(rng, (29, 43), "float64"), random_array(rng, (43, 31), "float64")
        c = matmul(distribute(a, grid, backend), distribute(b, grid, backend),
                   panel_width=4).gather()
        if comm.rank == 0:
            assert gemm_scaled_error(c, a, b) <= 1
        assert "connect" not in calls and "iget" not in calls and "ibcast" in calls


@pytest.mark.mpi(min_size=2)
def test_auto_ipc_falls_back_per_direction_when_a_self_test_fails(comm, monkeypatch):
    """`auto` tries ipc on one node; a self-test failing in one grid column (raised on
    all its ranks) sends that direction, on every rank, back to the usual choice,
    frees what was made for it, and is remembered."""
    import summa.planning.selection as selection
    from types import SimpleNamespace

    made, freed = [], []

    def fake_make(kind, c, backend, check=False):
        made.append(kind)
        if c.Get_size() > 1 and c is grid.col_comm:
            raise RuntimeError("ipc broadcaster: self-test failed")
        return SimpleNamespace(free=lambda: freed.append(kind), name=kind)

    def failing_make(kind, c, backend, check=False):
        made.append(kind)
        raise RuntimeError("ipc broadcaster: self-test failed")

    monkeypatch.setattr(selection, "make_broadcaster", fake_make)
    monkeypatch.setattr(selection, "_devices_distinct", lambda grid, backend: True)
    backend = SimpleNamespace(name="cupy", is_gpu=True, supports_ipc=True, device=0)
    with make_grid(comm, "col") as grid:  # P x 1: the columns hold every rank
        pair = selection._auto_ipc(grid, backend)
        assert made == ["ipc", "ipc"] and freed == []
        assert pair.row is not None and pair.col is None  # rows keep ipc (size 1 here)
        assert selection._auto_ipc(grid, backend) is pair and len(made) == 2  # remembered
    monkeypatch.setattr(selection, "make_broadcaster", failing_make)
    with make_grid(comm, "col") as grid:  # every self-test fails: nothing kept
        assert selection._auto_ipc(grid, backend) is None
        assert selection._auto_ipc(grid, backend) is None and len(made) == 4  # remembered


@pytest.mark.mpi(min_size=2)
def test_auto_ipc_only_in_directions_within_nodes(comm, monkeypatch):
    """Grid rows on one node each, columns across nodes: ipc for the rows only,
    the usual broadcasters for the columns; nothing is tried across nodes."""
    import summa.planning.selection as selection
    from types import SimpleNamespace

    tried = []

    def fake_make(kind, c, backend, check=False):
        tried.append((kind, c.Get_size()))
        return SimpleNamespace(free=lambda: None, name=kind)

    monkeypatch.setattr(selection, "make_broadcaster", fake_make)
    monkeypatch.setattr(selection, "_devices_distinct", lambda grid, backend: True)
    backend = SimpleNamespace(name="cupy", is_gpu=True, supports_ipc=True, device=0)
    with make_grid(comm, "col") as grid:
        grid.node = 100 + grid.row  # one rank per node: each column spans nodes
        pair = selection._auto_ipc(grid, backend)
        assert tried == [("ipc", 1)]  # the rows (one rank each here), not the columns
        assert pair.row is not None and pair.col is None
        row, col = selection.grid_broadcasters(grid, "auto", backend)
        assert row is pair.row and col.name == choose_comm("auto", backend)
    with make_grid(comm, "col") as grid:
        grid.node = 100  # all on one node: both directions
        tried.clear()
        pair = selection._auto_ipc(grid, backend)
        assert [k for k, _ in tried] == ["ipc", "ipc"] and None not in (pair.row, pair.col)


class _SummedProducts:
    """A stand-in for panel_sums.PanelSums on the CPU: sums each panel
    product it is given and applies them once, as the pipeline's product
    hook takes them (the GPU's own test checks the INT8 arithmetic)."""

    def __init__(self, m, n, dtype, xp=np):
        self.total, self.terms, self.finished = xp.zeros((m, n), dtype), 0, 0

    def add(self, a, b):
        self.total += a @ b
        self.terms += a.shape[1]

    def finish(self, alpha, c, beta=0.0):
        self.finished += 1
        c[...] = alpha * self.total + beta * c


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("which", GRIDS)
@pytest.mark.parametrize("shape", [(37, 23, 41), (13, 7, 29), (5, 1, 2)])
def test_a_grid_with_panel_sums_gives_every_panel_to_them_and_folds_once(
        comm, backend, rng, monkeypatch, which, shape):
    """Where a rank's panel products are summed and C folded once (fp64-int8
    on a grid), every panel of its K reaches the sums, no GEMM of the
    pipeline touches C, and the one fold applies alpha onto beta C: the
    product is SUMMA's, on any grid and block layout (the wiring, on the CPU)."""
    from summa.execution import steps
    m, n, k = shape
    made = []

    def sums(call, *args):
        C = call.C
        made.append(_SummedProducts(*C.local.shape, C.dtype, C.backend.xp))
        return made[-1]
    monkeypatch.setattr(steps, "_panel_sums", sums)
    with make_grid(comm, which) as grid:
        a, b = random_array(rng, (m, k), "float64"), random_array(rng, (k, n), "float64")
        c0 = random_array(rng, (m, n), "float64")
        A, B = distribute(a, grid, backend, block=(3, 2)), distribute(b, grid, backend, block=(2, 3))
        C = distribute(c0, grid, backend, block=(3, 3))
        gemms = []
        real = type(backend).gemm
        monkeypatch.setattr(type(backend), "gemm",
                            lambda self, *x, **y: (gemms.append(1), real(self, *x, **y)))
        summa(2.0, A, B, -0.5, C, panel_width=4)
        c = C.gather()
        if comm.rank == 0:
            assert gemm_scaled_error(c, a, b, alpha=2.0, beta=-0.5, c0=c0) <= 1
    (s,) = made
    assert s.finished == 1 and s.terms == k  # every rank's sums see all of K
    assert gemms == []


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("which", GRIDS)
@pytest.mark.parametrize("lookahead", [0, 1, 2, 5])
@pytest.mark.parametrize("k, block", [(16, None), (11, None), (41, (3, 2))])
def test_the_loop_adds_the_schedules_products_bit_for_bit(comm, rng, which, lookahead, k,
                                                           block):
    """Every rank's C block is, bit for bit, beta C plus its panels' products
    added one at a time in its schedule's GEMM order (a plain loop over the
    global operands here): the loop adds no step, drops none, keeps the order
    and the operands."""
    from summa.device.backend import get_backend
    from summa.execution.pipeline import in_place_parts
    from summa.planning.schedule import make_schedule, order_panels
    backend = get_backend("numpy")
    m, n, alpha, beta = 23, 17, -1.5, 0.75
    a, b, c0 = comm.bcast([random_array(rng, shape, "float64")
                           for shape in ((m, k), (k, n), (m, n))])
    with make_grid(comm, which) as grid:
        A, B = distribute(a, grid, backend, block), distribute(b, grid, backend, block)
        C = distribute(c0, grid, backend, block)
        summa(alpha, A, B, beta, C, panel_width=4, lookahead=lookahead)
        me, direct = (grid.row, grid.col), (False, False)  # host MPI broadcasts pair up
        panels = order_panels(panel_schedule(A.layout.cols, B.layout.rows, 4), me, direct, False)
        order = make_schedule(panels, me, direct, in_place_parts(panels, grid, A, B, direct),
                              lookahead).order
        rows = C.layout.rows.global_indices(grid.row)
        cols = C.layout.cols.global_indices(grid.col)
        expect = c0[np.ix_(rows, cols)] * beta
        for i in order:
            ks = np.arange(panels[i].k0, panels[i].k1)
            backend.gemm(alpha, a[np.ix_(rows, ks)], b[np.ix_(ks, cols)], expect)
        assert np.array_equal(C.local, expect)
        if lookahead >= 1:  # own panels first where they are: the same bits at every depth
            assert order == make_schedule(panels, me, direct,
                                          in_place_parts(panels, grid, A, B, direct), 7).order


# -- Ctrl-C in a one-rank multiply -------------------------------------------------------

def test_one_rank_cpu_steps_are_row_strips_each_a_bounded_gemm_over_all_of_k():
    from summa.execution.steps import (ONE_RANK_GEMM_FLOPS, ONE_RANK_MIN_ROWS, RowStrip,
                                       one_rank_steps)
    from summa.distribution.layout import Panel
    k, n = 20000, 5000
    panels = [Panel(k0, min(k0 + 256, k), 0, k0, 0, k0) for k0 in range(0, k, 256)]
    steps = one_rank_steps(panels, (6000, n), "numpy", k)
    assert len(steps) > 1 and all(isinstance(s, RowStrip) for s in steps)
    assert steps[0].r0 == 0 and steps[-1].r1 == 6000
    assert all(a.r1 == b.r0 for a, b in zip(steps, steps[1:]))
    assert all(2 * (s.r1 - s.r0) * n * k <= max(ONE_RANK_GEMM_FLOPS,
                                                2 * ONE_RANK_MIN_ROWS * n * k) for s in steps)
    assert all(s.r1 - s.r0 >= ONE_RANK_MIN_ROWS for s in steps[:-1])
    assert one_rank_steps(panels, (64, 64), "numpy", k) == [RowStrip(0, 64)]  # small: one GEMM
    assert one_rank_steps(panels, (6000, 6000), "cupy", k) == panels[:1]  # GPUs queue them
    assert one_rank_steps([], (6000, 6000), "numpy", 0) == []


def test_a_large_one_rank_cpu_product_runs_in_strips_into_c_and_stays_right(monkeypatch, rng):
    from summa.execution import steps
    monkeypatch.setattr(steps, "ONE_RANK_GEMM_FLOPS", 2 * 8 * 30 * 300)
    monkeypatch.setattr(steps, "ONE_RANK_MIN_ROWS", 4)
    from mpi4py import MPI
    a, b = random_array(rng, (40, 300), "float64"), random_array(rng, (300, 30), "float64")
    stats, out = SummaStats(), np.full((40, 30), np.nan)
    c = matmul(a, b, comm=MPI.COMM_SELF, backend="numpy", panel_width=16, stats=stats, out=out)
    assert c is out and stats.panels == len(range(0, 40, 8))
    assert gemm_scaled_error(c, a, b) <= 1


def test_ctrl_c_interrupts_a_one_rank_multiply_between_gemms(tmp_path):
    """SIGINT at a random moment of summa.matmul in a plain process (one CPU
    rank): KeyboardInterrupt within one step's GEMM, not the whole product's."""
    import subprocess
    import sys
    import textwrap
    import time
    script = tmp_path / "one_rank.py"
    script.write_text(textwrap.dedent("""
        import time, numpy as np, summa
        from summa.execution import steps
        steps.ONE_RANK_GEMM_FLOPS = 2**30  # steps of ~0.02-0.2 s on two cores
        a, b = np.ones((1000, 8192)), np.ones((8192, 1000))
        print("calling", flush=True)
        try:
            while True:
                summa.matmul(a, b, workers=1)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
    """))
    import os
    from pathlib import Path
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]),
               SUMMA_WORKERS="1")
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                            env=env)
    try:
        assert proc.stdout.readline().strip() == "calling"
        time.sleep(np.random.default_rng().uniform(0.2, 1.5))
        line, took = interrupt(proc)
    finally:
        proc.kill()
    assert line == "interrupted" and proc.returncode == 0
    assert took < 5, took  # measured 0.1-0.3 s; one GEMM of it all took ~1 s unloaded
