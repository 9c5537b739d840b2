"""One plain Python process, several ranks: summa.matmul spawns a pool of
workers (summa/pool/launch.py, summa/pool/calls.py, summa/pool/worker.py). Serial tests only:
under a launcher nothing is spawned (test_multiply covers that path)."""

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import summa
from helpers import gemm_scaled_error, random_array
from leftovers import (existing, held_files, interrupt, job_pids, launcher_is_open_mpi,
                       wait_for_handlers, wait_gone)
from summa.host import shared as host, remote
from summa import pool
from summa.pool import launch
from summa.runtime.cleanup import process_alive

pytestmark = pytest.mark.skipif(pool.launched(), reason="under a launcher nothing is spawned")


def _shared_files():
    return sorted(f for f in os.listdir(host.shm_dir()) if f.startswith("summa-"))


@pytest.mark.parametrize("workers", [1, 2, 3, 6])
def test_a_pool_multiplies_within_the_gauge_and_leaves_the_arrays_alone(rng, workers):
    a, b = random_array(rng, (61, 47), "float64"), random_array(rng, (47, 38), "float64")
    a0, b0 = a.copy(), b.copy()
    c = summa.matmul(a, b, workers=workers, backend="numpy", panel_width=8)
    assert gemm_scaled_error(c, a, b) <= 1
    assert np.array_equal(a, a0) and np.array_equal(b, b0)
    out = np.empty((38, 61))
    assert summa.matmul(b, a, trans_a="T", trans_b="T", workers=workers, backend="numpy",
                        out=out) is out
    assert gemm_scaled_error(out, b, a, trans_a="T", trans_b="T") <= 1


def test_a_pool_multiplies_a_stack_by_one_matmul_it_keeps(rng):
    """A stack's products run on the pool's workers, one Matmul planned there
    for every pair, each product into its place."""
    a, b = random_array(rng, (3, 29, 17), "float64"), random_array(rng, (17, 23), "float64")
    c = summa.matmul(a, b, workers=2, backend="numpy", panel_width=4)
    assert c.shape == (3, 29, 23)
    assert max(gemm_scaled_error(c[i], a[i], b) for i in range(3)) <= 1


def test_a_pool_multiplies_integers_exactly_into_an_out_of_theirs(rng):
    a = rng.integers(-99, 99, (61, 47))
    b = rng.integers(-99, 99, (47, 38)).astype(np.int16)
    out = np.empty((61, 38), np.int64)
    assert summa.matmul(a, b, workers=2, backend="numpy", out=out) is out
    assert np.array_equal(out, a @ b)


def test_arrays_made_shared_are_not_copied(rng, monkeypatch):
    a = host.empty((40, 30), "float32")
    b = host.empty((30, 20), "float32")
    a[...] = random_array(rng, a.shape, "float32")
    b[...] = random_array(rng, b.shape, "float32")
    out = host.empty((40, 20), "float32")
    copies = []
    real = host.named
    monkeypatch.setattr(host, "named", lambda *x: copies.append(x) or real(*x))
    assert summa.matmul(a, b, workers=2, backend="numpy", out=out) is out
    assert copies == []  # no copy of A or B, the product in place
    assert gemm_scaled_error(np.asarray(out), np.asarray(a), np.asarray(b)) <= 1


@pytest.mark.parametrize("action,match", [("raise", "worker rank 1 failed: RuntimeError: "
                                                    "injected fault in summa on rank 1"),
                                          ("ioerror", "worker rank 1 failed: OSError: "),
                                          ("kill", r"worker rank \d \(pid \d+\) died")])
def test_a_failing_worker_ends_the_call_with_one_error_and_the_pool_starts_anew(
        rng, monkeypatch, action, match):
    a, b = random_array(rng, (50, 40), "float64"), random_array(rng, (40, 30), "float64")
    summa.matmul(a, b, workers=3, backend="numpy")  # a pool to break
    before = dict(launch.slot.pool.pids)
    held = held_files([*before.values(), *launch.slot.pool.parents])
    assert held  # MPI's shared memory: a killed worker cannot remove it, the caller does
    monkeypatch.setenv("SUMMA_INJECT_FAULT", f"summa:1:{action}")
    with pytest.raises(pool.WorkerError, match=match):
        summa.matmul(a, b, workers=3, backend="numpy", out_of_core=True, panel_width=4)
    assert launch.slot.pool is None
    assert not [p for p in before.values() if process_alive(p)]  # no worker left running
    assert existing(held) == []
    monkeypatch.delenv("SUMMA_INJECT_FAULT")
    c = summa.matmul(a, b, workers=3, backend="numpy")
    assert gemm_scaled_error(c, a, b) <= 1


def _dead_child():
    """A child process that has ended and is not yet reaped: its pid stays
    taken (a signal to it is harmless) and it no longer counts as running."""
    child = subprocess.Popen([sys.executable, "-c", ""])
    while process_alive(child.pid):
        time.sleep(0.01)
    return child


def test_a_worker_found_dead_is_the_cause_even_when_another_reports_first(rng, monkeypatch):
    """A worker killed mid-call leaves the others an MPI error, which one of
    them may report before this process has seen the death (the dead one's
    connection not yet ended, the launcher still running): the call's error
    names the dead worker as the cause, and the report after it. Here the
    dead worker is a stand-in the pool is told of, and rank 1 fails at once."""
    a, b = random_array(rng, (50, 40), "float64"), random_array(rng, (40, 30), "float64")
    summa.matmul(a, b, workers=2, backend="numpy")
    dead = _dead_child()
    try:
        launch.slot.pool.pids[2] = dead.pid
        monkeypatch.setenv("SUMMA_INJECT_FAULT", "summa:1:raise")
        with pytest.raises(pool.WorkerError, match=rf"^worker rank 2 \(pid {dead.pid}\) died; "
                                                   r".*\nthen worker rank 1 failed: RuntimeError: "
                                                   r"injected fault"):
            summa.matmul(a, b, workers=2, backend="numpy", out_of_core=True, panel_width=4)
    finally:
        dead.wait()
    assert launch.slot.pool is None


def test_a_worker_whose_mpi_call_failed_waits_briefly_for_the_peer_behind_it(monkeypatch):
    """A peer's sockets close a moment before it shows as dead: a worker
    whose MPI call failed looks for a dead peer for a while before it
    reports; its own errors it reports at once."""
    from multiprocessing import Pipe

    from mpi4py import MPI

    from summa.pool import worker
    monkeypatch.setattr(worker, "DEATH_GRACE", 30.0)  # the peer dies well within it
    try:
        raise RuntimeError("the multiply failed") from MPI.Exception(MPI.ERR_OTHER)
    except RuntimeError as exc:
        from_mpi = exc
    ours, theirs = Pipe()
    dying = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])
    try:
        peers = {0: os.getpid(), 1: dying.pid}
        t0 = time.monotonic()
        worker._report(theirs, 0, peers, RuntimeError("its own fault"))
        assert ours.recv()[-1] == []  # else it would have waited for the death: [1]
        worker._report(theirs, 0, peers, from_mpi)
        assert ours.recv()[-1] == [1] and time.monotonic() - t0 < worker.DEATH_GRACE
    finally:
        dying.wait()


def test_of_errors_read_together_the_one_sent_first_counts():
    """A worker that fails reports, then ends; the launcher then ends the
    others, and one may report an MPI error, finding the first dead, before
    this process has read the first report: both are read together, and the
    first one sent is the call's error, not a death."""
    stand_in = object.__new__(launch.Pool)
    stand_in.pids = {0: 100, 1: 101}
    first = ("error", 1, "RuntimeError", "its own fault", "", [])
    then = ("error", 0, "Exception", "See the MPI_ERROR field", "", [1])
    for reports in ([then, first], [first, then]):
        error = stand_in._failure(reports)
        assert str(error).startswith("worker rank 1 failed: RuntimeError: its own fault"), error
    death = str(stand_in._failure([then])).split("\n")
    assert death[0].startswith("worker rank 1 (pid 101) died; ") and \
        death[1].startswith("then worker rank 0 failed: Exception: See the MPI_ERROR"), death


def test_bad_input_is_a_value_error_before_anything_is_spawned(rng):
    a = random_array(rng, (5, 4), "float64")
    pool.close()
    with pytest.raises(ValueError, match="inner dimensions"):
        summa.matmul(a, a, workers=2, backend="numpy")
    assert launch.slot.pool is None
    with pytest.raises(ValueError, match="at least one worker"):
        summa.matmul(a, a.T, workers=0, backend="numpy")


def test_a_worker_that_does_not_answer_ends_the_call_after_the_timeout(rng, monkeypatch):
    a = random_array(rng, (40, 40), "float64")
    monkeypatch.setenv("SUMMA_INJECT_FAULT", "summa:0:hang")
    monkeypatch.setenv("SUMMA_TIMEOUT", "2")
    # the owner's 2 s may run out first, or the waiting workers' own watchdogs (the
    # same SUMMA_TIMEOUT) may end the job first: either way one error, nothing hangs
    with pytest.raises(pool.WorkerError, match=r"did not answer in 2 s|died"):
        summa.matmul(a, a, workers=2, backend="numpy", out_of_core=True, panel_width=4)
    assert launch.slot.pool is None


def test_many_calls_leave_no_processes_files_or_memory_behind(rng):
    """100 calls: the same workers, no shared file left, and neither this
    process's memory nor any worker's grows (a communicator, a block or a
    map kept per call would show in their resident sizes)."""
    a, b = random_array(rng, (64, 64), "float64"), random_array(rng, (64, 64), "float64")
    for _ in range(5):  # allocators and caches settle
        summa.matmul(a, b, workers=2, backend="numpy")
    pids, files = dict(launch.slot.pool.pids), _shared_files()
    before = {pid: _resident(pid) for pid in [os.getpid(), *pids.values()]}
    for _ in range(100):
        c = summa.matmul(a, b, workers=2, backend="numpy")
        del c
    assert launch.slot.pool.pids == pids and _shared_files() == files
    grown = {pid: _resident(pid) - rss for pid, rss in before.items()}
    assert all(g < 16 << 20 for g in grown.values()), grown


def _resident(pid: int) -> int:
    """Bytes of `pid`'s resident memory (Linux)."""
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) << 10 for line in f if line.startswith("VmRSS:"))


def _cpu_seconds(pid: int) -> float:
    """User and system CPU seconds process `pid` has used (Linux)."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_an_idle_pool_sleeps_and_wakes_at_once(rng):
    """Between calls the workers, their launcher and its proxies use no CPU
    (MPI's blocking calls poll: a worker waiting in one took a core), and
    the first call after idling is as quick as one right after another."""
    a, b = random_array(rng, (64, 64), "float64"), random_array(rng, (64, 64), "float64")
    summa.matmul(a, b, workers=2, backend="numpy")
    warm = min(_timed(summa.matmul, a, b, workers=2, backend="numpy") for _ in range(3))
    job = [launch.slot.pool.proc.pid, *launch.slot.pool.pids.values(), *launch.slot.pool.parents]
    before, t0 = {pid: _cpu_seconds(pid) for pid in job}, time.monotonic()
    time.sleep(3)
    share = {pid: (_cpu_seconds(pid) - used) / (time.monotonic() - t0)
             for pid, used in before.items()}
    assert max(share.values()) < 0.05, share  # of one core; measured 0.0 over 10 s
    after_idle = _timed(summa.matmul, a, b, workers=2, backend="numpy")
    assert after_idle < warm + 0.5, (after_idle, warm)


def _timed(f, *args, **kwargs) -> float:
    t0 = time.perf_counter()
    f(*args, **kwargs)
    return time.perf_counter() - t0


_CALLER = textwrap.dedent("""
    import os, sys, numpy as np, summa
    from summa.pool import launch
    how = sys.argv[1]
    a = np.ones((90, 90))
    summa.matmul(a, a, workers=2, backend="numpy")
    if how == "hang":  # the call never ends: the signal finds it waiting
        os.environ["SUMMA_INJECT_FAULT"] = "summa:1:hang"
    os.environ["SUMMA_IN_PLACE"] = "0"  # copies in shared memory, files to leave behind
    print("calling", flush=True)
    try:
        while True:
            summa.matmul(a, a, workers=2, backend="numpy", out_of_core=True, panel_width=8)
    except KeyboardInterrupt:
        print("interrupted", launch.slot.pool is None or how == "loop", flush=True)
""")


def _caller(tmp_path, how: str):
    """A plain process that calls summa.matmul on a pool until stopped; it
    says "calling" once the pool is up."""
    script = tmp_path / "caller.py"
    script.write_text(_CALLER)
    # (faulthandler: a crash of the caller says where, on the test's stderr)
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(summa.__file__)),
               PYTHONFAULTHANDLER="1")
    env.pop("SUMMA_INJECT_FAULT", None)
    proc = subprocess.Popen([sys.executable, str(script), how], stdout=subprocess.PIPE,
                            text=True, env=env)
    assert proc.stdout.readline().strip() == "calling"
    return proc


@pytest.mark.parametrize("how", ["hang", "loop"])
def test_ctrl_c_raises_keyboard_interrupt_at_once_and_leaves_nothing(tmp_path, how):
    """Ctrl-C at a random moment of a call (or between calls): KeyboardInterrupt
    in the caller within seconds, with the workers gone and none of their
    shared memory or the caller's shared copies left."""
    proc = _caller(tmp_path, how)
    try:
        time.sleep(np.random.default_rng().uniform(0.2, 1.5))
        job = [p for p in job_pids(proc.pid) if p != proc.pid]
        held = held_files(job + [proc.pid])
        line, took = interrupt(proc)
    finally:
        proc.kill()
    assert line == "interrupted True" and took < 5, (line, took, proc.returncode)
    assert wait_gone(job, 5) == [] and existing(held) == []


def test_a_killed_caller_is_noticed_by_its_workers_which_clean_up(tmp_path):
    """The caller killed in the middle of a call (the workers busy, or hung):
    they end within seconds, removing its shared copies and MPI's memory."""
    proc = _caller(tmp_path, "hang")
    time.sleep(np.random.default_rng().uniform(0.2, 1.5))
    job = [p for p in job_pids(proc.pid) if p != proc.pid]
    held = held_files(job + [proc.pid])
    assert any(os.path.basename(f).startswith(f"summa-{proc.pid}-") for f in held), held
    proc.kill()
    proc.communicate()
    assert wait_gone(job, 10) == [], [p for p in job if process_alive(p)]
    assert existing(held) == []


def _multiply_without_mpirun(folder, option: str, **env) -> subprocess.CompletedProcess:
    """``python -m summa multiply`` of `folder`'s A.npy and B.npy into C.npy,
    started without a launcher (it starts its own ranks), with `option` and
    the environment's variables `env` besides."""
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(summa.__file__)), **env)
    return subprocess.run([sys.executable, "-m", "summa", "multiply", str(folder / "A.npy"),
                           str(folder / "B.npy"), "-o", str(folder / "C.npy"), "--backend",
                           "numpy", option], capture_output=True, text=True, env=env,
                          timeout=120)


def test_the_multiply_command_without_mpirun_runs_on_every_worker(tmp_path):
    rng = np.random.default_rng()
    a, b = rng.uniform(-1, 1, (30, 20)), rng.uniform(-1, 1, (20, 25))
    np.save(tmp_path / "A.npy", a)
    np.save(tmp_path / "B.npy", b)
    p = _multiply_without_mpirun(tmp_path, "--check", SUMMA_WORKERS="3")
    assert p.returncode == 0, p.stderr
    assert "summa multiply: 3 ranks" in p.stdout
    assert gemm_scaled_error(np.load(tmp_path / "C.npy"), a, b) <= 1


#: A launcher that, as Open MPI's mpirun does, prints a banner after its job
#: where any rank exited non-zero.
_REPORTING_LAUNCHER = """#!/bin/sh
$REAL_MPIEXEC "$@"  # a command with its arguments (Open MPI's: mpirun --oversubscribe ...)
status=$?
if [ $status -ne 0 ]; then
    printf -- '-----\\nPrimary job terminated normally, but 1 process returned\\n-----\\n' >&2
fi
exit $status
"""


def test_the_multiply_command_without_mpirun_fails_in_its_own_words_alone(tmp_path):
    """A job the command starts by itself that fails as its ranks agree (bad
    input: status 2) ends with the command's own line and status: its ranks
    tell the command and end well, so a launcher that reports ranks ending
    non-zero has nothing to add."""
    launcher = tmp_path / "mpiexec"
    launcher.write_text(_REPORTING_LAUNCHER)
    launcher.chmod(0o755)
    rng = np.random.default_rng()
    np.save(tmp_path / "A.npy", rng.uniform(-1, 1, (30, 20)))
    np.save(tmp_path / "B.npy", rng.uniform(-1, 1, (21, 25)))  # (K does not match)
    p = _multiply_without_mpirun(tmp_path, "--quiet", SUMMA_WORKERS="2", MPIEXEC=str(launcher),
                                 REAL_MPIEXEC=" ".join(launch.mpiexec_command()))
    assert p.returncode == 2, p.stderr
    assert p.stderr.count("\n") == 1 and p.stderr.startswith("summa: error: "), p.stderr
    assert not (tmp_path / "C.npy").exists()


def test_npy_files_mapped_by_the_caller_are_not_copied(rng, monkeypatch, tmp_path):
    """Arrays from ``np.load(path, mmap_mode="r")`` reach the workers as the
    file itself (each maps it read-only): no copy into shared memory."""
    a0 = random_array(rng, (50, 30), "float64")
    b0 = random_array(rng, (30, 40), "float64")
    np.save(tmp_path / "A.npy", a0)
    np.save(tmp_path / "B.npy", b0)
    a = np.load(tmp_path / "A.npy", mmap_mode="r")
    b = np.load(tmp_path / "B.npy", mmap_mode="r")
    assert host.file_map(a) is not None and host.file_map(a[1:]) is None  # a view: copied
    copies = []
    real = host.named
    monkeypatch.setattr(host, "named", lambda *x: copies.append(x) or real(*x))
    stats = summa.SummaStats()
    c = summa.matmul(a, b, workers=2, backend="numpy", stats=stats)
    # no copy at all where the workers write into this process (summa.host.remote),
    # else the product alone
    assert copies == ([] if stats.extra["pool_reads_caller"]
                      else [((50, 40), np.dtype("float64"))])
    assert gemm_scaled_error(np.asarray(c), a0, b0) <= 1
    # and each worker multiplies it where it lies: mapped alike on every rank
    from mpi4py import MPI

    from summa.host.blocks import mapped_everywhere
    path, offset = host.file_map(a)
    assert mapped_everywhere(host.attach_file(path, offset, a.shape, a.dtype), MPI.COMM_SELF)


def test_no_room_for_the_copies_says_how_to_need_none(rng, monkeypatch):
    """The workers are launched before the arrays are copied (they start
    meanwhile); a copy that cannot be made ends the call with the hint, and
    the workers launched for it with it; the next call starts anew."""
    a = random_array(rng, (30, 20), "float64")
    pool.close()
    launched = []
    real = launch.Pool
    monkeypatch.setattr(launch, "Pool", lambda *x: launched.append(real(*x)) or launched[-1])
    with monkeypatch.context() as m:
        m.setattr(host, "_room", lambda nbytes: False)
        m.setenv("SUMMA_IN_PLACE", "0")  # copies, not reads of this process
        with pytest.raises(ValueError, match=r"has less than .* free for a shared array.*"
                                             r"summa\.host\.empty.*mmap_mode"):
            summa.matmul(a, a.T.copy(), workers=2, backend="numpy")
    assert launch.slot.pool is None and launched[0].proc.poll() is not None  # no job left
    c = summa.matmul(a, a.T.copy(), workers=2, backend="numpy")
    assert gemm_scaled_error(np.asarray(c), a, a.T.copy()) <= 1


def test_the_workers_read_and_write_the_callers_own_arrays(rng, monkeypatch):
    """Where the system lets them (summa.host.remote), the workers read A and B
    where the caller holds them and write the product into the caller's
    array (`out`, or a new one): nothing in shared memory; the caller's
    arrays are left alone; transposed and Fortran-ordered operands too (the
    rows of their transposes, as they lie); strided views are copied."""
    a, b = random_array(rng, (70, 33), "float64"), random_array(rng, (33, 45), "float64")
    a0, b0 = a.copy(), b.copy()
    copies = []
    real = host.named
    monkeypatch.setattr(host, "named", lambda *x: copies.append(x) or real(*x))
    stats = summa.SummaStats()
    c = summa.matmul(a, b, workers=2, backend="numpy", panel_width=8, stats=stats)
    if not stats.extra["pool_reads_caller"]:
        pytest.skip("this system does not let a process read another's memory")
    assert copies == [] and type(c) is np.ndarray and host.shared_name(c) is None
    assert gemm_scaled_error(c, a, b) <= 1
    assert np.array_equal(a, a0) and np.array_equal(b, b0)
    out = np.full((70, 45), np.nan)
    assert summa.matmul(a, b, workers=3, backend="numpy", out=out) is out
    assert gemm_scaled_error(out, a, b) <= 1 and copies == []
    bt, af = b.T.copy(), np.asfortranarray(a)
    c = summa.matmul(af, bt, trans_b="T", workers=2, backend="numpy")
    assert copies == [] and gemm_scaled_error(c, a, bt, trans_b="T") <= 1
    c = summa.matmul(a[::2], b, workers=2, backend="numpy")
    assert copies == [((35, 33), np.dtype("float64"))]  # strided: a copy for the workers
    assert gemm_scaled_error(c, a[::2], b) <= 1


def test_workers_that_may_not_read_the_caller_get_copies(rng, monkeypatch):
    """A pool whose workers cannot read this process answers so once; the
    call is made again with copies, and the pool remembers."""
    a, b = random_array(rng, (40, 20), "float64"), random_array(rng, (20, 30), "float64")
    pool.close()
    monkeypatch.setattr(remote, "allowed", lambda: True)  # the caller would ...
    monkeypatch.setenv("SUMMA_IN_PLACE", "0")  # ... but the workers are told no
    stats = summa.SummaStats()
    c = summa.matmul(a, b, workers=2, backend="numpy", stats=stats)
    assert gemm_scaled_error(np.asarray(c), a, b) <= 1
    assert stats.extra["pool_reads_caller"] is False and launch.slot.pool.remote is False
    c = summa.matmul(b.T.copy(), a.T.copy(), workers=2, backend="numpy", stats=stats)
    assert gemm_scaled_error(np.asarray(c), b.T, a.T) <= 1


def test_a_pool_started_ahead_is_the_one_the_first_call_uses(rng, monkeypatch):
    pool.close()
    launched = []
    real = launch.Pool
    monkeypatch.setattr(launch, "Pool", lambda *x: launched.append(real(*x)) or launched[-1])
    assert pool.start(workers=2, backend="numpy") == 2 and len(launched) == 1
    a, b = random_array(rng, (30, 20), "float64"), random_array(rng, (20, 25), "float64")
    c = summa.matmul(a, b, workers=2, backend="numpy")
    assert len(launched) == 1 and gemm_scaled_error(np.asarray(c), a, b) <= 1
    assert pool.start(workers=1, backend="numpy") == 1  # one worker: nothing to start
    monkeypatch.setenv("PMI_RANK", "0")  # under a launcher: nothing either
    assert pool.start(workers=3, backend="numpy") == 1 and len(launched) == 1


def test_soak_random_calls_interrupts_and_killed_workers_leave_nothing(rng, monkeypatch,
                                                                        request):
    """``--soak-calls`` calls of random shapes, some interrupted by Ctrl-C at a
    random moment and some losing a worker: each ends as it should, and no
    process, shared file, MPI segment, folder or memory accumulates."""
    calls = request.config.getoption("--soak-calls")
    summa.matmul(np.ones((8, 8)), np.ones((8, 8)), workers=2, backend="numpy")
    processes, rss = len(job_pids(os.getpid())), _resident(os.getpid())
    segments, outcomes = set(), {"done": 0, "interrupted": 0, "worker died": 0}
    for _ in range(calls):
        if launch.slot.pool is not None:
            segments |= launch.slot.pool.segments
        outcomes[_one_soak_call(rng, monkeypatch)] += 1
    summa.matmul(np.ones((8, 8)), np.ones((8, 8)), workers=2, backend="numpy")
    current = launch.slot.pool.segments
    assert len(job_pids(os.getpid())) == processes, outcomes
    assert existing(segments - current) == [], outcomes
    assert [f for f in _shared_files() if f.startswith(f"summa-{os.getpid()}-")] == []
    folders = [f for f in os.listdir(os.path.dirname(launch.slot.pool._folder))
               if f.startswith("summa-pool-")]
    assert folders == [os.path.basename(launch.slot.pool._folder)]
    assert _resident(os.getpid()) - rss < 64 << 20, outcomes
    assert outcomes["done"] > 0


def _one_soak_call(rng, monkeypatch) -> str:
    """One call of the soak: plain, interrupted, or with a worker killed."""
    m, n, k = (int(x) for x in rng.integers(1, 200, 3))
    k = max(k, 17)  # two panels at least, so that a fault in the loop is reached
    a, b = random_array(rng, (m, k), "float64"), random_array(rng, (k, n), "float64")
    event = rng.choice(["call", "interrupt", "kill"], p=[0.8, 0.1, 0.1])
    timer = None
    if event == "kill":
        monkeypatch.setenv("SUMMA_INJECT_FAULT", f"summa:{rng.integers(2)}:kill")
    elif event == "interrupt":
        timer = threading.Timer(rng.uniform(0, 0.3), signal.pthread_kill,
                                (threading.main_thread().ident, signal.SIGINT))
        timer.start()
    try:
        try:
            c = summa.matmul(a, b, workers=2, backend="numpy", out_of_core=True,
                             panel_width=8)
        finally:
            if timer is not None:
                timer.join()
                time.sleep(0.05)  # an interrupt that came late is taken in here
            monkeypatch.delenv("SUMMA_INJECT_FAULT", raising=False)
    except KeyboardInterrupt:
        assert event == "interrupt"
        return "interrupted"
    except pool.WorkerError as exc:
        assert event == "kill" and "died" in str(exc), exc
        return "worker died"
    assert event != "kill"
    assert gemm_scaled_error(c, a, b) <= 1
    return "done"


def test_ctrl_c_that_lands_in_a_finalizer_is_not_lost():
    """A pool call takes Ctrl-C as a flag: Python raises a signal's
    KeyboardInterrupt in whatever code runs next, and in a finalizer (such as
    a mapped file's) it is printed and dropped, which left a looping caller
    waiting for good; with the flag it is raised once the call returns."""
    import weakref

    from summa.pool.calls import _ctrl_c_as_flag

    class Held:
        pass

    with pytest.raises(KeyboardInterrupt):
        with _ctrl_c_as_flag() as interrupted:
            held = Held()
            weakref.finalize(held, os.kill, os.getpid(), signal.SIGINT)
            del held  # the finalizer runs, and the signal's handler within it
            assert interrupted.is_set()


def test_a_gpu_taken_in_a_worker_reaches_the_caller_as_summas_memory_error():
    """A worker whose GPU had no room (summa.DeviceMemoryError: memory taken
    after the call was planned) ends the call with the same one-line error
    in the caller, naming the worker, not a WorkerError's traceback."""
    import summa
    from summa.pool.launch import Pool
    pool = object.__new__(Pool)  # (_failure reads only the reports without a death)
    said = "GPU 1 has no room for 4.00 GiB more: the multiply held 8.00 GiB"
    exc = pool._failure([("error", 1, "DeviceMemoryError", said, "Traceback ...", [])])
    assert isinstance(exc, summa.DeviceMemoryError)
    assert str(exc) == f"worker rank 1: {said}"
    other = pool._failure([("error", 0, "RuntimeError", "boom", "Traceback ...", [])])
    assert not isinstance(other, MemoryError)


def test_ctrl_c_of_the_multiply_command_without_mpirun_leaves_its_launcher_nothing_to_report(
        tmp_path):
    """A Ctrl-C to the command stops the job it started by itself: its ranks
    tell the command how they ended and end well, so a launcher that reports
    ranks ending non-zero (MPICH's "BAD TERMINATION", where a rank ended
    before the launcher took the signal itself) has nothing to add; the
    command ends with the signal's status."""
    launcher = tmp_path / "mpiexec"
    launcher.write_text(_REPORTING_LAUNCHER)
    launcher.chmod(0o755)
    rng = np.random.default_rng()
    np.save(tmp_path / "A.npy", rng.uniform(-1, 1, (30, 20)))
    np.save(tmp_path / "B.npy", rng.uniform(-1, 1, (20, 25)))
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(summa.__file__)),
               SUMMA_WORKERS="2", MPIEXEC=str(launcher), SUMMA_INJECT_FAULT="summa:1:hang",
               REAL_MPIEXEC=" ".join(launch.mpiexec_command()))
    proc = subprocess.Popen([sys.executable, "-m", "summa", "multiply", str(tmp_path / "A.npy"),
                             str(tmp_path / "B.npy"), "-o", str(tmp_path / "C.npy"), "--backend",
                             "numpy", "--quiet"], stderr=subprocess.PIPE, text=True, env=env)
    try:
        wait_for_handlers(proc, 2)  # both ranks can take the stop
        proc.send_signal(signal.SIGINT)
        err = proc.communicate(timeout=60)[1]
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert "BAD TERMINATION" not in err, err
    if not launcher_is_open_mpi(launch.mpiexec_command()[0]):
        # Open MPI's mpirun, itself stopped, exits non-zero whatever its ranks
        # did (the GPU machine: nothing of its own printed); the stand-in's
        # banner then tells nothing about the ranks
        assert "Primary job" not in err, err
    assert not (tmp_path / "C.npy").exists()


