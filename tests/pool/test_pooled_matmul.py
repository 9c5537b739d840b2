"""summa.Matmul in a plain Python process: where summa.matmul would run on the
pool of workers, the Matmul lives in them (summa.pool.PooledMatmul, the
"open", "execute" and "free" commands of summa/pool/worker.py; the owner's
side in summa/pool/calls.py), planned once and kept between executions.
Serial tests only: under a launcher nothing is spawned
(tests/planning/test_planner.py covers Matmul on the ranks of comm)."""

import gc
import warnings
from dataclasses import replace

import numpy as np
import pytest
from mpi4py import MPI

import summa
from helpers import gemm_scaled_error, random_array
from summa import pool
from summa.pool import calls, launch

pytestmark = pytest.mark.skipif(pool.launched(), reason="under a launcher nothing is spawned")

#: How every pooled Matmul here is made: two CPU workers, panels narrow enough
#: for several per product (a fault injected "before the second panel" is reached).
POOLED = dict(workers=2, backend="numpy", panel_width=4)


@pytest.fixture
def commands(monkeypatch):
    """The kinds of the commands this process sends its pools, in order."""
    sent = []
    real = launch.Pool.run

    def run(self, kind, spec, *args, **kwargs):
        sent.append(kind)
        return real(self, kind, spec, *args, **kwargs)
    monkeypatch.setattr(launch.Pool, "run", run)
    return sent


def _operands(rng, m=60, n=30, k=40):
    return random_array(rng, (m, k), "float64"), random_array(rng, (k, n), "float64")


def test_a_pooled_matmul_is_planned_once_in_the_workers_and_executed_many_times(rng,
                                                                               commands):
    """The workers make the Matmul (m.plan is the Plan each execution runs:
    on their 2 ranks), and every execution, of the operands given at first,
    of new ones, of changed values, into `out`, runs that one Matmul: no
    second "open"."""
    a, b = _operands(rng)
    with summa.Matmul(a, b, alpha=2.0, **POOLED) as m:
        assert m._pooled is not None and m.plan.ranks == 2
        assert "plan: 60 x 30 x 40 float64 on 2 ranks" in str(m.plan)
        planned = m.plan
        a2, b2 = _operands(rng)
        out = np.full((60, 30), np.nan)
        # (a Fortran-ordered A is read as it lies: the plan run with its storage)
        runs = [((), a, b, planned), ((a2, b2), a2, b2, planned),
                ((np.asfortranarray(a2), b), a2, b, replace(planned, storage=("cols", "rows")))]
        for executions, (given, x, y, ran) in enumerate(runs, 1):
            c = m.execute(*given)
            assert isinstance(c, np.ndarray) and gemm_scaled_error(c, x, y, alpha=2.0) <= 1
            assert m.stats.extra["plan"] == ran.as_dict() and m.plan is planned
            assert m.stats.extra["worker_executions"] == executions  # one worker-side Matmul
            # reading this process's arrays where the plan was made for that (out of core)
            assert m.stats.extra["pool_reads_caller"] is m.plan.out_of_core
        a[...] = a2  # new values in the arrays given at first: placed again
        assert m.execute(out=out) is out and gemm_scaled_error(out, a2, b, alpha=2.0) <= 1
        assert m.stats.extra["worker_executions"] == 4
    assert commands == ["open"] + ["execute"] * 4 + ["free"]


def test_bad_input_is_refused_as_without_the_pool_before_it_is_asked(rng, commands):
    a, b = _operands(rng)
    pool.close()
    with pytest.raises(ValueError, match="inner dimensions differ"):
        summa.Matmul(a, a, **POOLED)
    with pytest.raises(ValueError, match="2-D"):
        summa.Matmul(a[None], b, **POOLED)
    with pytest.raises(TypeError, match="unexpected keyword argument"):
        summa.Matmul(a, b, stats=None, **POOLED)
    assert launch.slot.pool is None and commands == []  # nothing launched
    with summa.Matmul(a, b, **POOLED) as m:
        running = launch.slot.pool
        with pytest.raises(ValueError, match="planned 60x30x40 float64"):
            m.execute(b.T.copy(), a.T.copy())
        with pytest.raises(ValueError, match="must pass the array b"):
            m.execute(a)
        with pytest.raises(ValueError, match=r"out is \(30, 60\) float64"):
            m.execute(out=np.empty((30, 60)))
        assert launch.slot.pool is running and commands == ["open"]  # none reached it
        assert gemm_scaled_error(m.execute(), a, b) <= 1


def test_free_and_the_with_block_free_the_workers_matmul(rng, commands):
    """free() frees the Matmul in the workers at once (each command's record
    counts the Matmuls they hold); one dropped unfreed is freed before
    their next command; after free, execute raises."""
    a, b = _operands(rng)
    kept = summa.Matmul(a, b, **POOLED)
    with summa.Matmul(b.T.copy(), a.T.copy(), **POOLED) as m:
        m.execute()
        assert m.stats.extra["worker_matmuls_open"] == 2
    assert "freed" in repr(m) and commands[-1] == "free"
    with pytest.raises(RuntimeError, match="freed"):
        m.execute()
    m.free()  # twice: nothing more
    kept.execute()
    assert kept.stats.extra["worker_matmuls_open"] == 1
    dropped = summa.Matmul(a, b, **POOLED)
    del dropped
    gc.collect()
    kept.execute()
    assert kept.stats.extra["worker_matmuls_open"] == 1
    kept.free()
    assert commands.count("free") == 2


@pytest.mark.parametrize("action,match", [("raise", "worker rank 1 failed: RuntimeError: "
                                                    "injected fault in summa on rank 1"),
                                          ("kill", r"worker rank \d \(pid \d+\) died")])
def test_a_pool_started_anew_opens_the_matmul_again(rng, monkeypatch, commands, action,
                                                    match):
    """A worker that fails ends the execution with the pool's WorkerError;
    the next execution opens the Matmul again in the new pool (the same
    plan) and runs it."""
    a, b = _operands(rng)
    with summa.Matmul(a, b, **POOLED) as m:
        planned = m.plan
        m.execute()
        broken = launch.slot.pool
        monkeypatch.setenv("SUMMA_INJECT_FAULT", f"summa:1:{action}")
        with pytest.raises(pool.WorkerError, match=match):
            m.execute()
        assert launch.slot.pool is None and broken.proc.poll() is not None
        monkeypatch.delenv("SUMMA_INJECT_FAULT")
        c = m.execute()
        assert gemm_scaled_error(c, a, b) <= 1 and m.plan == planned
        assert launch.slot.pool not in (None, broken)
        assert m.stats.extra["worker_executions"] == 1  # a new Matmul in the new pool
        assert commands == ["open", "execute", "execute", "open", "execute"]
        m.execute()
        assert m.stats.extra["worker_executions"] == 2


def test_a_pool_stopped_ends_cleanly_and_the_next_execution_opens_the_matmul_again(
        rng, commands):
    """Stopping the pool (another size asked for, or at exit) with a Matmul
    open in its workers ends them cleanly (they free it first: the test
    below); the next execution opens the Matmul again in this process's pool."""
    a, b = _operands(rng)
    m = summa.Matmul(a, b, **POOLED)
    stopped = launch.slot.pool
    summa.matmul(a, b, workers=3, backend="numpy")  # another size: the pool of 2 stops
    assert stopped.proc.returncode == 0
    assert gemm_scaled_error(m.execute(), a, b) <= 1
    assert launch.slot.pool.size == 2 and commands == ["open", "matmul", "open", "execute"]
    m.free()


def test_a_matmul_off_the_pool_runs_here_as_before(rng):
    """One worker, or a communicator given: the Matmul runs on the ranks of
    comm (this process), as without a pool."""
    a, b = _operands(rng)
    for options in (dict(workers=1), dict(workers=2, comm=MPI.COMM_SELF)):
        with summa.Matmul(a, b, backend="numpy", **options) as m:
            assert m._pooled is None and m._product is not None and m.plan.ranks == 1
            assert gemm_scaled_error(m.execute(), a, b) <= 1


def test_workers_that_may_not_read_the_caller_plan_and_execute_on_copies(rng, monkeypatch):
    """A pool whose workers cannot read this process says so at the opening,
    which is asked again with copies in shared memory: the Matmul is planned
    for them (in memory: nothing forces it out of core) and each execution
    ships copies too. Opened again in a pool that may read this process, it
    is planned as before."""
    from summa.host import remote
    a, b = _operands(rng)
    pool.close()
    monkeypatch.setattr(remote, "allowed", lambda: True)  # the caller would ...
    monkeypatch.setenv("SUMMA_IN_PLACE", "0")  # ... but the workers are told no
    with summa.Matmul(a, b, **POOLED) as m:
        planned = m.plan
        assert not planned.out_of_core and launch.slot.pool.remote is False
        for x in (a, random_array(rng, a.shape, "float64")):
            assert gemm_scaled_error(m.execute(x, b), x, b) <= 1
            assert m.stats.extra["pool_reads_caller"] is False
            assert m.stats.extra["plan"] == m.plan.as_dict()
        # opened again in a pool that may read this process: planned as before
        monkeypatch.delenv("SUMMA_IN_PLACE")
        pool.close()
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no word of another plan
            assert gemm_scaled_error(m.execute(), a, b) <= 1
        assert m.plan == planned and m.stats.extra["plan"] == planned.as_dict()


class _Owner:
    """The owner's end of a worker's connection, in this process: the
    commands it sends, the answers it gets."""

    def __init__(self, commands):
        self.commands, self.answers = list(commands), []

    def recv(self):
        return self.commands.pop(0)

    def send(self, message):
        self.answers.append(message)


def test_a_worker_keeps_no_operands_and_frees_its_matmuls_at_stop(rng, monkeypatch):
    """A worker's loop (here on this process alone): an opened Matmul (its
    planned product, summa.execution.arrays.ArrayProduct) keeps no map of
    the operands (they come with each execution), and the command to stop
    frees every one still held before the worker ends."""
    from summa.execution.arrays import ArrayProduct
    from summa.pool import worker
    a, b = _operands(rng)
    with summa.Matmul(a, b, comm=MPI.COMM_SELF, backend="numpy") as here:
        expected = here.plan
    freed = []
    real = ArrayProduct.free
    monkeypatch.setattr(ArrayProduct, "free", lambda self: freed.append(self) or real(self))
    call = calls._Call("open", a, b, None, None, a.dtype, dict(backend="numpy"), {"id": 7})
    # (kept: the shared copies, alive until the worker is done)
    parts, _, kept = calls._operands(a, b, None, None, a.dtype, False, touch=False)
    owner = _Owner([("open", calls._spec(call, parts, False), {}, []), ("stop",)])
    worker.serve(owner, MPI.COMM_SELF, {})
    assert [answer[0] for answer in owner.answers] == ["done"]
    assert owner.answers[0][1]["plan"] == expected
    assert len(freed) == 1 and freed[0].grid is None
    assert not any(isinstance(x, np.ndarray) for x in vars(freed[0]).values())


def test_a_pool_started_anew_that_plans_otherwise_runs_its_plan_and_says_so(rng,
                                                                          monkeypatch):
    """Opened again (here after the pool was closed), the Matmul is planned
    again; where that plan differs (on GPUs: other free memory), m.plan is
    the new one, which the workers run, with a RuntimeWarning."""
    a, b = _operands(rng)
    real = launch.Pool.run

    def run(self, kind, spec, *args, **kwargs):  # the workers' answer, as another pool's
        record = real(self, kind, spec, *args, **kwargs)
        if kind == "open" and reopened:
            record["plan"] = replace(record["plan"], lookahead=2)
        return record
    monkeypatch.setattr(launch.Pool, "run", run)
    reopened = False
    pool.close()
    with summa.Matmul(a, b, **POOLED) as m:
        planned = m.plan
        pool.close()
        reopened = True
        with pytest.warns(RuntimeWarning, match="planned this Matmul otherwise"):
            c = m.execute()
        assert m.plan == replace(planned, lookahead=2) and gemm_scaled_error(c, a, b) <= 1
