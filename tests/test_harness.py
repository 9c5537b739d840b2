"""The MPI test runs' own behaviour (tests/conftest.py), run as a job of
their own: a failing test aborts the whole job, and leaves nothing behind."""

import os
import signal
import subprocess
import sys
import time

import pytest

from leftovers import SETTLE_SECONDS, mpi_segments, stranded
from test_cli import ROOT, mpiexec

#: The start of a test file the jobs below run: each rank records its
#: private folders in a file beside it (in files: an abort or a signal may
#: end a rank before the launcher forwards its output), read back by
#: :func:`_recorded_folders`.
RECORDING = '''
import os
import time
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def record_folders(comm):
    with open(os.path.join(HERE, f"folders.{comm.rank}"), "w") as fh:
        fh.write(os.environ["SUMMA_SHM_DIR"] + "\\n" + os.environ["TMPDIR"])
'''

FAILING = RECORDING + '''

@pytest.mark.mpi(min_size=2)
def test_fails_on_the_last_rank(comm):
    record_folders(comm)
    comm.Barrier()
    assert comm.rank != comm.size - 1, "the last rank fails"
'''


def _recorded_folders(folder) -> list[str]:
    """Every rank's private folders, as :data:`RECORDING` wrote them."""
    return [f for path in folder.glob("folders.*") for f in path.read_text().split()]


def test_a_failing_mpi_test_aborts_the_job_and_leaves_nothing(tmp_path):
    """A failing rank ends the job at once (no rank waits in a collective of
    the next test), with a failing status, and every rank's private folders and
    MPI's shared memory are gone: the ranks the abort kills cannot remove
    them themselves."""
    (tmp_path / "test_failing.py").write_text(FAILING)
    before = set(mpi_segments())
    # (the caller's path kept: on a machine without a package index pytest-mpi
    # may be there only, as on the GPU node)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [str(ROOT / "tests"), str(ROOT), os.environ.get("PYTHONPATH")])))
    t0 = time.monotonic()
    proc = subprocess.run(mpiexec() + ["-n", "2", sys.executable, "-m", "pytest", "-q",
                                       "-p", "conftest", "--with-mpi", "-m", "mpi",
                                       "-p", "no:cacheprovider", "--rootdir", str(tmp_path),
                                       str(tmp_path / "test_failing.py")],
                          env=env, capture_output=True, text=True, timeout=120)
    took = time.monotonic() - t0
    folders = _recorded_folders(tmp_path)
    # (its "[rank 1] FAILED" report is not asserted: a launcher that kills the
    # job may drop what a rank wrote just before)
    assert proc.returncode != 0, (proc.stdout, proc.stderr)
    assert len(folders) == 4 and took < 60, (folders, took)
    assert [f for f in folders if os.path.exists(f)] == []
    time.sleep(SETTLE_SECONDS + 0.2)
    assert stranded(before) == []


def test_a_run_that_ends_before_its_session_leaves_no_folder(tmp_path):
    """pytest ended by a usage error never reaches the session's end, where
    the private folders are checked and removed: they go at exit all the same.
    (The child's shared-memory folder goes under a root of this test's own:
    other runs on the machine make and remove theirs in /dev/shm meanwhile.)"""
    shm = tmp_path / "shm"
    shm.mkdir()
    env = dict(os.environ, TMPDIR=str(tmp_path), TESTS_SHM_ROOT=str(shm),
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "tests"), str(ROOT),
                                                        os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "conftest",
                           "--no-such-option", "-p", "no:cacheprovider",
                           "--rootdir", str(tmp_path), str(tmp_path)],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 4, (proc.stdout, proc.stderr)  # pytest's usage error
    assert os.listdir(shm) == []
    assert [n for n in os.listdir(tmp_path) if n.startswith("summa-tests-")] == []


WAITING = RECORDING + '''

@pytest.mark.mpi(min_size=2)
def test_waits_for_a_signal(comm):
    record_folders(comm)
    comm.Barrier()  # (MPI's shared memory mapped by now)
    open(os.path.join(HERE, f"ready.{comm.rank}"), "w").close()
    if comm.rank == 0:
        time.sleep(120)  # in Python
    comm.Barrier()  # the others inside MPI
'''


@pytest.mark.parametrize("sig,group", [(signal.SIGTERM, False), (signal.SIGINT, True)],
                         ids=["SIGTERM to ./run", "Ctrl-C to its group"])
def test_a_signal_to_run_test_stops_its_tests_and_leaves_nothing(tmp_path, sig, group):
    """SIGTERM to ./run alone (timeout(1), a batch system), or SIGINT to its
    whole process group (a terminal's Ctrl-C), reaches the test job it
    runs, which ends at once, one rank asleep in Python and one inside MPI;
    ./run ends by the signal, and no process of the job, no private folder,
    no folder of ./run's own and no MPI segment is left."""
    from leftovers import job_pids, wait_gone
    (tmp_path / "test_waiting.py").write_text(WAITING)
    before = set(mpi_segments())
    env = dict(os.environ, SUMMA_PYTHON=sys.executable, TEST_SERIAL="0", TEST_RANKS="2",
               MPIEXEC=" ".join(mpiexec()), TMPDIR=str(tmp_path),
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "tests"),
                                                        os.environ.get("PYTHONPATH")])))
    env.pop("TESTS_SHM_ROOT", None)
    proc = subprocess.Popen([str(ROOT / "run"), "test", "-p", "conftest", "-p",
                             "no:cacheprovider", "--rootdir", str(tmp_path),
                             str(tmp_path / "test_waiting.py")],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    deadline = time.monotonic() + 90
    while len(list(tmp_path.glob("ready.*"))) < 2:
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.1)
    pids = job_pids(proc.pid)
    t0 = time.monotonic()
    os.killpg(proc.pid, sig) if group else proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    took = time.monotonic() - t0
    name = signal.Signals(sig).name
    assert proc.returncode == -sig and f"stopped by {name}" in err, (proc.returncode, out, err)
    assert took < 20 and wait_gone(pids, 5) == [], (took, pids)
    folders = _recorded_folders(tmp_path)
    assert len(folders) == 4 and [f for f in folders if os.path.exists(f)] == []
    assert [n for n in os.listdir(tmp_path) if n.startswith("summa-")] == []
    time.sleep(SETTLE_SECONDS + 0.2)
    assert stranded(before) == []
