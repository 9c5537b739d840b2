"""Test set-up shared by the serial and the MPI runs.

Under ``--with-mpi`` every test phase ends with a vote among the ranks (on a
private communicator). A failure anywhere is printed once, by the lowest failing
rank, and the whole job is aborted: a rank that failed must not leave the others
waiting in a collective of the next test. A failing rank whose peers never
arrive (they are stuck in a collective it skipped) reports after a grace period
and aborts the job itself.
"""

from __future__ import annotations

import functools
import os
import signal
import sys
import time

import numpy as np
import pytest

# The tests mirror the package's folders (tests/device/test_staging.py ...), and
# test files take helpers from one another by module name (``from test_cli
# import job``): every folder of tests/ goes on the path, where pytest's prepend
# mode puts a test file's own folder there only once it collects that file.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path += [entry.path for entry in sorted(os.scandir(_HERE), key=lambda e: e.name)
             if entry.is_dir() and entry.name.isidentifier() and not entry.name.startswith("_")
             and entry.path not in sys.path]

# summa.matmul in a plain process (not under mpirun) starts a pool of one
# worker per 8 cores on CPUs: tests of the in-process path must not (on the
# 16-core GPU machine a monkeypatched ProcessGrid saw nothing). The pool's own
# tests ask for their workers.
os.environ.setdefault("SUMMA_WORKERS", "1")

# On GPUs every run's device allocations are held to its plan's peak: a
# draw past it raises (summa.device.account.Overdrawn), so a miscount is a
# failing test, never an out-of-memory error on a user's GPU. (On CPUs the
# check traces host memory: the suites that ask for it set it themselves.)
if os.environ.get("SUMMA_TEST_BACKEND") == "cupy":
    os.environ.setdefault("SUMMA_MEMORY_CHECK", "1")

# Everything this session and the jobs it starts put in shared memory and
# temporary folders goes to folders of its own (other people's runs may share
# the machine): at the end each must be empty (tests/leftovers.py).
from leftovers import private_folders  # noqa: E402

_private = private_folders()

#: Seconds a failing rank waits for its peers before aborting on its own.
FAILURE_GRACE_SECONDS = 20.0
_ctl = None
#: Every rank's private folders (under --with-mpi): the rank that aborts the
#: job removes them, as the others are killed before their session's end.
_job_folders: list = []


def _mpi_mode(config) -> bool:
    return bool(config.getoption("--with-mpi", default=False))


def pytest_addoption(parser):
    parser.addoption("--soak-calls", type=int, default=30,
                     help="calls of the pool soak test (test_pool.py; 500 by hand)")


def pytest_sessionfinish(session, exitstatus):
    """Fail the run where it left files in shared memory or the temporary
    folder; remove MPI's segments stranded by the jobs whose ranks the fault
    tests kill (SIGKILL: no one can remove them)."""
    from leftovers import finish
    if _ctl is not None and _ctl.Get_rank() != 0:
        _private.remove()
        return
    left = finish(_private)
    if left:
        sys.stderr.write(f"\nthe test run left {len(left)} file(s) behind: {left}\n")
        if session.exitstatus == 0:
            session.exitstatus = 1


def pytest_configure(config):
    global _ctl
    if _mpi_mode(config):
        from summa.runtime.mpi import load
        MPI = load()  # as summa starts MPI: its guardian first, for a rank killed inside MPI
        from summa.device.backend import share_cpu_cores
        from summa.distribution.grid import node_rank
        _ctl = MPI.COMM_WORLD.Dup()
        share_cpu_cores(node_rank(MPI.COMM_WORLD)[1])
        _job_folders.extend(_ctl.allgather((_private.shm, _private.tmp)))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if _ctl is None or _ctl.Get_size() == 1:
        return
    from mpi4py import MPI
    rank, size = _ctl.Get_rank(), _ctl.Get_size()
    send = np.array([rank if report.failed else size], dtype=np.int64)
    first = np.empty_like(send)
    request = _ctl.Iallreduce(send, first, op=MPI.MIN)
    deadline = time.monotonic() + (FAILURE_GRACE_SECONDS if report.failed else 1e9)
    while not request.Test():
        if time.monotonic() > deadline:
            _report_and_abort(report, rank, "the other ranks did not reach the end of this phase")
        time.sleep(0.001)
    if first[0] == size:
        return
    if first[0] == rank:
        _report_and_abort(report, rank, "")
    time.sleep(10)  # let the lowest failing rank print before it aborts the job
    _abort()


def _report_and_abort(report, rank: int, why: str) -> None:
    lines = [f"\n[rank {rank}] FAILED {report.nodeid} ({report.when})"
             + (f": {why}" if why else ""), report.longreprtext, ""]
    sys.stderr.write("\n".join(lines))
    sys.stderr.flush()
    _abort()


def _abort() -> None:
    """Abort the job, first removing what its ranks hold in shared memory
    and temporary folders on this node (every rank's private folders, MPI's
    segments): an aborted rank ends without its session's clean-up, and
    each failed run left them in /dev/shm."""
    import shutil
    from summa.runtime.cleanup import mapped_segments, remove_segments
    for folder in (f for pair in _job_folders for f in pair):
        shutil.rmtree(folder, ignore_errors=True)
    remove_segments(mapped_segments())
    _ctl.Abort(1)


def pytest_collection_finish(session):
    """End on SIGTERM (./run forwarding one, a batch system's), and under
    MPI on SIGINT too (a Ctrl-C: pytest's own ending waited in a collective
    for ranks already gone, until timeout(1) killed the job), without
    leaving anything behind: this rank's private folders, the MPI library's
    shared memory it maps and the CUDA driver's files of its events go first
    (the signal's default action stranded them in /dev/shm). Set after
    collection: importing the test modules starts MPI, whose start may set a
    handler of its own."""
    for signum in (signal.SIGTERM, signal.SIGINT) if _ctl is not None else (signal.SIGTERM,):
        signal.signal(signum, _end_on_signal)


def _end_on_signal(signum, frame) -> None:
    from summa.runtime.cleanup import hard_exit
    _private.remove()
    hard_exit(128 + signum)


# -- fixtures ----------------------------------------------------------------------------

@pytest.fixture(scope="session")
def comm():
    from mpi4py import MPI
    return MPI.COMM_WORLD


@pytest.fixture(scope="session")
def backend():
    """The backend under test: NumPy unless SUMMA_TEST_BACKEND=cupy (GPU runs)."""
    from summa.device.backend import cupy_available, get_backend
    name = os.environ.get("SUMMA_TEST_BACKEND", "numpy")
    if name == "cupy" and not cupy_available():
        pytest.skip("SUMMA_TEST_BACKEND=cupy but no GPU is visible")
    from mpi4py import MPI
    from summa.distribution.grid import node_rank
    return get_backend(name, node_rank(MPI.COMM_WORLD)[0])


@pytest.fixture(autouse=True)
def _rank_gpu_current():
    """Each test starts on its rank's GPU: a test that made a backend of
    another GPU (a sub-communicator's local rank, ``get_backend("cupy")``)
    made that one current, and tests that queue work themselves (a
    broadcaster's ibcast) queue it on the current GPU."""
    if os.environ.get("SUMMA_TEST_BACKEND") == "cupy":
        import cupy
        cupy.cuda.Device(_rank_gpu()).use()
    yield


@functools.cache
def _rank_gpu() -> int:
    """This rank's GPU, as the backend fixture binds it (asked once: a
    collective, made in the first test, which every rank runs)."""
    import cupy
    from mpi4py import MPI
    from summa.distribution.grid import node_rank
    return node_rank(MPI.COMM_WORLD)[0] % cupy.cuda.runtime.getDeviceCount()


@pytest.fixture
def folder(comm):
    """A temporary folder shared by all ranks (removed by rank 0 at the end)."""
    import shutil
    import tempfile
    from pathlib import Path
    path = comm.bcast(tempfile.mkdtemp(prefix="summa-test-") if comm.rank == 0 else None)
    yield Path(path)
    comm.Barrier()
    if comm.rank == 0:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def rng():
    """Fresh random data for every test (seeded from the OS, shared by all ranks)."""
    from mpi4py import MPI
    seed = MPI.COMM_WORLD.bcast(int(np.random.SeedSequence().entropy % 2**63), root=0)
    return np.random.default_rng(seed)
