"""summa.device.account: the device memory an execution draws, against its
plan's peak. The GPU's allocator hook on a stand-in for CuPy's pools (what
is drawn, given back, kept, and the two failures); NumPy's device traced
through real multiplies on this run's ranks, in memory and out of core, and
a plan counted short caught on every rank."""

import contextlib
import sys
import types

import numpy as np
import pytest

from summa import options
from summa.device import account
from summa.device.account import Account, DeviceMemoryError, Overdrawn, give_back_cached
from summa.execution.algorithm import SummaStats

GIB = 2 ** 30


class _Pool:
    """CuPy's MemoryPool as the account uses it: blocks by pointer, a
    limit of raw memory under which malloc fails."""

    def __init__(self, gpu):
        self.gpu, self.used, self.cached, self.emptied = gpu, {}, 0, 0

    def malloc(self, nbytes):
        if self.gpu.raw < nbytes:
            raise self.gpu.OutOfMemoryError(f"out of memory allocating {nbytes} bytes")
        self.gpu.raw -= nbytes
        self.gpu.next += 1
        pointer = types.SimpleNamespace(ptr=self.gpu.next, device_id=0, nbytes=nbytes)
        self.used[pointer.ptr] = nbytes
        return pointer

    def free_bytes(self):
        return self.cached

    def free_all_blocks(self):
        self.gpu.raw += self.cached
        self.cached = 0
        self.emptied += 1


class _FakeGpu(types.ModuleType):
    """Just enough of the ``cupy`` module for the account: pools, the
    allocator hook, memGetInfo, UnownedMemory and MemoryPointer."""

    def __init__(self, raw: int):
        super().__init__("cupy")
        self.raw, self.next, self.allocator = raw, 0, None
        self.OutOfMemoryError = type("OutOfMemoryError", (MemoryError,), {})
        self.default = _Pool(self)
        memory = types.SimpleNamespace(
            OutOfMemoryError=self.OutOfMemoryError, MemoryPool=lambda: _Pool(self),
            UnownedMemory=lambda ptr, size, owner, device: types.SimpleNamespace(
                ptr=ptr, size=size, owner=owner),
            MemoryPointer=lambda mem, offset: types.SimpleNamespace(mem=mem))
        runtime = types.SimpleNamespace(memGetInfo=lambda: (self.raw, 80 * GIB))
        self.cuda = types.SimpleNamespace(memory=memory, MemoryPool=memory.MemoryPool,
                                          runtime=runtime, using_allocator=self._using,
                                          Device=lambda device: contextlib.nullcontext())

    def get_default_memory_pool(self):
        return self.default

    def _using(self, malloc):
        gpu = self

        class _Scope:
            def __enter__(self):
                gpu.allocator = malloc

            def __exit__(self, *exc):
                gpu.allocator = None
        return _Scope()


class _Backend:
    is_gpu, device = True, 3

    def __init__(self, gpu):
        self.gpu = self.xp = gpu

    def memory_free(self):
        return self.gpu.raw


@pytest.fixture
def gpu(monkeypatch):
    fake = _FakeGpu(10 * GIB)
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setattr(account, "_last_key", {})
    return fake


def test_every_draw_is_counted_and_given_back_when_freed(gpu):
    acct = Account(4 * GIB, _Backend(gpu))
    with acct.drawing():
        a = gpu.allocator(GIB)
        b = gpu.allocator(2 * GIB)
        assert acct.held == 3 * GIB
        del a
        assert acct.held == 2 * GIB
        c = gpu.allocator(GIB // 2)
    assert gpu.allocator is None  # the caller's allocator again, outside
    assert acct.peak == 3 * GIB and acct.held == 2 * GIB + GIB // 2
    del b, c
    assert acct.held == 0
    assert acct.report() == {"device_planned": 4 * GIB, "device_peak": 3 * GIB}


def test_a_draw_past_the_plan_is_summas_miscount_where_strict(gpu):
    """Strict, a run that drew past its plan's peak (beyond CuPy's scalars)
    raises once it is over (not mid-run, where the other ranks would wait);
    lenient, the peak says by how much."""
    strict = Account(GIB, _Backend(gpu), strict=True)
    with pytest.raises(Overdrawn, match=r"drew 1\.50 GiB, more than its plan's peak of 1\.00"):
        with strict.drawing():
            kept = gpu.allocator(GIB // 2)
            passing = gpu.allocator(GIB)  # goes where the GPU has room
            assert strict.held == 3 * GIB // 2
            del passing
    del kept
    within = Account(GIB, _Backend(gpu), strict=True)
    with within.drawing():
        arrays = gpu.allocator(GIB)
        scalar = gpu.allocator(88)  # CuPy's scalars beside the plan's arrays
    assert within.peak == GIB + 88
    del arrays, scalar
    lenient = Account(GIB, _Backend(gpu))
    with lenient.drawing():
        held = gpu.allocator(2 * GIB)
    assert lenient.peak == 2 * GIB
    del held


def test_a_gpu_with_no_room_is_one_clear_memory_error(gpu):
    acct = Account(20 * GIB, _Backend(gpu), what="the multiply")
    with acct.drawing():
        held = gpu.allocator(8 * GIB)
        with pytest.raises(DeviceMemoryError) as caught:
            gpu.allocator(4 * GIB)  # 2 GiB left: another process took the rest
    message = str(caught.value)
    assert "GPU 3 has no room for 4.00 GiB more" in message
    assert "held 8.00 GiB of the 20.00 GiB it planned, 2.00 GiB free" in message
    assert not isinstance(caught.value, gpu.OutOfMemoryError)  # summa's, not CuPy's
    assert acct.held == 8 * GIB
    del held


def test_the_pool_gives_back_its_blocks_for_another_plan_and_keeps_a_plans_own(gpu):
    """A new plan starts as in a fresh process (the pool's unused blocks
    given back first); the same plan again finds its blocks cached."""
    pool = gpu.get_default_memory_pool()
    for key, emptied in (("a", 1), ("a", 1), ("b", 2), ("a", 3), (None, 4), (None, 5)):
        with Account(GIB, _Backend(gpu), key=key).drawing():
            pass
        assert pool.emptied == emptied, key


def test_a_run_short_of_room_gives_back_the_pools_cached_blocks(gpu):
    """What a failed run held and freed goes back to the GPU before it is
    planned again (the pool's cached blocks), and the next account, even of
    the same plan, starts from the emptied pool."""
    pool = gpu.get_default_memory_pool()
    with Account(GIB, _Backend(gpu), key="a").drawing():
        pass
    pool.cached, gpu.raw = 3 * GIB, 5 * GIB  # what the failed run freed, kept by the pool
    give_back_cached(_Backend(gpu))
    assert (pool.emptied, pool.cached, gpu.raw) == (2, 0, 8 * GIB)
    with Account(GIB, _Backend(gpu), key="a").drawing():
        pass
    assert pool.emptied == 3
    give_back_cached(types.SimpleNamespace(is_gpu=False))  # NumPy's device: nothing to do


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("kind", ["in memory", "out of core", "fortran", "op T", "complex64",
                                  "float32", "B by columns"])
def test_numpys_device_draws_no_more_than_the_plan(comm, kind):
    """On the NumPy backend (its device is host memory) every run's arrays
    stay within its plan's device and host peaks: tracemalloc's high-water
    mark, with SUMMA_MEMORY_CHECK, on the ranks of this run. "B by columns":
    a tall op(B) lying by columns, whose blocks a grid's ranks copy by rows
    while they hold them (two of B's blocks at once, more than C's)."""
    from summa.api.multiply import matmul_arrays
    rng = np.random.default_rng(int(comm.bcast(np.random.SeedSequence().entropy % 2**32)))
    dtype = {"complex64": np.complex64, "float32": np.float32}.get(kind, np.float64)
    m, n, k = (40, 900, 1500) if kind == "B by columns" else (1100, 900, 700)
    a, b = rng.random((m, k)).astype(dtype), rng.random((k, n)).astype(dtype)
    asked = {"out of core": dict(device_memory="3MiB"), "op T": dict(trans_a="T"),
             "B by columns": dict(trans_b="T")}.get(kind, {})
    if kind == "fortran":
        a = np.asfortranarray(a)
    if kind == "op T":
        a = np.ascontiguousarray(a.T)
    if kind == "B by columns":
        b = np.ascontiguousarray(b.T)
    stats = SummaStats()
    with options.set(memory_check=True):
        for _ in range(2):  # (the first may import modules: not judged)
            c = matmul_arrays(a if comm.rank == 0 else None, b if comm.rank == 0 else None,
                              comm, backend="numpy", stats=stats, **asked)
    if comm.rank == 0:
        ref = (a.T if kind == "op T" else a) @ (b.T if kind == "B by columns" else b)
        assert np.allclose(c, ref, rtol=1e-4)
        assert 0 < stats.extra["device_peak"] <= stats.extra["device_planned"] + \
            account.TRACED_SLACK


@pytest.mark.mpi(min_size=1)
def test_a_plan_counted_short_is_caught_on_every_rank(comm, monkeypatch):
    """The check can fail: where a rank's run holds a tenth more than its
    account's peak, Overdrawn is raised on every rank (none left waiting
    in a collective)."""
    from summa.api.multiply import matmul_arrays
    made = Account.of.__func__
    a = np.random.default_rng(1).random((1100, 700)) if comm.rank == 0 else None
    b = a.T.copy() if a is not None else None
    stats = SummaStats()
    with options.set(memory_check=True):
        for _ in range(2):  # (the first may import modules: not judged)
            matmul_arrays(a, b, comm, backend="numpy", stats=stats)
    held = stats.extra["device_peak"]  # this rank's

    def short(cls, plan, backend, what="the multiply", holding=0, result=0):
        acct = made(cls, plan, backend, what, holding, result)
        if comm.rank == comm.size - 1:  # one rank short: every rank hears of it
            acct.budget = held * 9 // 10 - account.TRACED_SLACK
        return acct
    monkeypatch.setattr(Account, "of", classmethod(short))
    with options.set(memory_check=True), pytest.raises(Overdrawn, match="counted short"):
        matmul_arrays(a, b, comm, backend="numpy")


#: A product on the ranks of a job whose rank FAILING runs out of memory at
#: its NTH GEMM (a draw the GPU had no room for, faked on NumPy's device).
_FAILING_JOB = """
import os, sys
import numpy as np
from mpi4py import MPI
from summa.device.account import DeviceMemoryError
from summa.device.numpy_backend import NumpyBackend
from summa.api.multiply import matmul_arrays
comm, calls, gemm = MPI.COMM_WORLD, [0], NumpyBackend.gemm
def failing(self, *args, **kwargs):
    calls[0] += 1
    if comm.rank == int(os.environ["FAILING"]) and calls[0] == int(os.environ["NTH"]):
        raise DeviceMemoryError("GPU 0 has no room for 1.0 MiB more")
    return gemm(self, *args, **kwargs)
NumpyBackend.gemm = failing
a = np.ones((300, 400)) if comm.rank == 0 else None
b = np.ones((400, 200)) if comm.rank == 0 else None
out = np.empty((300, 200)) if comm.rank == 0 and os.environ.get("WITH_OUT") else None
try:
    matmul_arrays(a, b, comm, backend="numpy", panel_width=16, out=out,
                  out_of_core=sys.argv[1] == "out of core", device_memory="256KiB")
except DeviceMemoryError as exc:
    print(f"rank {comm.rank} raised: {exc}", flush=True)
else:
    print(f"rank {comm.rank} done", flush=True)
"""


@pytest.mark.parametrize("where", ["in memory", "out of core"])
def test_a_rank_out_of_memory_mid_run_ends_the_job_with_its_line(tmp_path, where):
    """A draw that fails on one rank of two while the other waits for it in
    a broadcast ends the job (MPI_Abort) with that rank's one line: no rank
    left waiting. Alone, the rank plans again and goes on, with a warning
    (tests/execution/test_replan.py)."""
    from test_cli import job
    script = tmp_path / "failing.py"
    script.write_text(_FAILING_JOB)
    done = job(2, str(script), where, module=False, timeout=60, env={"FAILING": "1", "NTH": "3"})
    assert done.returncode != 0
    assert "summa: rank 1: GPU 0 has no room for 1.0 MiB more (the other ranks were " \
           "mid-multiply: aborting the job)" in done.stderr
    assert "raised" not in done.stdout
    # the root's out=: written where it lies out of core, gathered into once done in memory
    root = job(2, str(script), where, module=False, timeout=60,
               env={"FAILING": "0", "NTH": "3", "WITH_OUT": "1"})
    partly = "; out= may be partly written" if where == "out of core" else ""
    assert root.returncode != 0
    assert f"summa: rank 0: GPU 0 has no room for 1.0 MiB more{partly} (the other ranks" \
        in root.stderr, root.stderr
    alone = job(1, str(script), where, module=False, timeout=60, env={"FAILING": "0", "NTH": "1"})
    assert alone.returncode == 0 and "rank 0 done" in alone.stdout, alone.stderr
    assert "GPU 0 has no room for 1.0 MiB more; planned again" in alone.stderr
