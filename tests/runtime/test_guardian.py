"""A plain process's guardian (summa/runtime/guardian.py): once the process
has died, however it died, its MPI files are gone from /dev/shm; it is in a
session of its own, and it ends with its process."""

import glob
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from summa.runtime import guardian
from summa.runtime.cleanup import descendants, process_alive
from summa.runtime.mpi import launched

pytestmark = pytest.mark.skipif(launched() or not os.path.isdir(guardian.SHM_DIR),
                                reason="under a launcher no guardian starts; no /dev/shm")

ROOT = Path(__file__).resolve().parents[2]

#: A plain process that starts MPI through summa, says which MPI and its
#: pid, then waits for a line on stdin and exits.
CALLER = """
import os, sys
import summa
from summa.runtime.mpi import MPI
MPI.COMM_WORLD.Get_size()
print(MPI.Get_library_version().splitlines()[0], flush=True)
print(os.getpid(), flush=True)
sys.stdin.readline()
"""


def _start(code: str, *args: str, env=None) -> subprocess.Popen:
    """Run `code` in a plain Python with this checkout's summa, in a session
    of its own (its group is killed without the test's)."""
    full_env = dict(os.environ, PYTHONPATH=str(ROOT), **(env or {}))
    return subprocess.Popen([sys.executable, "-c", code, *args], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=full_env,
                            start_new_session=True)


def _guardians(pid: int) -> list[int]:
    """The guardians among process `pid`'s descendants."""
    found = []
    for child in descendants(pid):
        try:
            if "guardian.py" in Path(f"/proc/{child}/cmdline").read_text():
                found.append(child)
        except OSError:
            pass
    return found


def _mpich_files(pid: int) -> list[str]:
    return glob.glob(os.path.join(guardian.SHM_DIR, f"mpich_shm_{pid:x}_*"))


def _until(done, seconds: float = 10.0) -> bool:
    """Wait until `done()` holds (up to `seconds`); whether it does."""
    deadline = time.monotonic() + seconds
    while not done() and time.monotonic() < deadline:
        time.sleep(0.02)
    return done()


def _caller():
    """A started :data:`CALLER`, its pid and its guardians' (one); skipped
    where its MPI is not MPICH (whose file is named after the process)."""
    proc = _start(CALLER)
    version = proc.stdout.readline()
    if not version.startswith("MPICH"):
        proc.kill()
        proc.communicate()
        pytest.skip(f"the file named after the process is MPICH's, not {version.strip()!r}'s")
    pid = int(proc.stdout.readline())
    return proc, pid, _guardians(pid)


@pytest.mark.parametrize("how", ["process", "group"])
def test_a_killed_plain_process_s_mpi_file_is_removed_by_its_guardian(how):
    """SIGKILL, to the process or to its whole process group (the guardian is
    in neither): its MPICH file is gone a moment later, and so is its guardian."""
    proc, pid, guardians = _caller()
    try:
        assert len(guardians) == 1, "no guardian below the process"
        assert os.getsid(guardians[0]) != os.getsid(pid)
        assert os.getpgid(guardians[0]) != os.getpgid(pid)
        files = _mpich_files(pid)
        assert files, "MPICH made no file named after the process"
        if how == "group":
            os.killpg(pid, signal.SIGKILL)
        else:
            proc.kill()
        proc.communicate()
        assert _until(lambda: not any(os.path.exists(f) for f in files)), files
        assert _until(lambda: not process_alive(guardians[0]))
    finally:
        proc.kill()
        proc.communicate()
        for path in _mpich_files(pid):
            Path(path).unlink(missing_ok=True)


def test_a_process_that_ends_normally_leaves_no_guardian_and_no_file():
    proc, pid, guardians = _caller()
    proc.communicate("\n", timeout=60)
    assert proc.returncode == 0 and len(guardians) == 1
    assert _until(lambda: not process_alive(guardians[0]), 1.0)
    assert _mpich_files(pid) == []


#: A process that starts the guardian script itself (no summa imported), tells
#: it a path, says its pid and its guardian's and waits.
SLEEPER = """
import os, subprocess, sys, time
guard = subprocess.Popen([sys.executable, "-I", "-S", sys.argv[1], str(os.getpid()),
                          repr(time.time())], stdin=subprocess.PIPE, start_new_session=True)
guard.stdin.write((sys.argv[2] + "\\n").encode())
guard.stdin.flush()
print(os.getpid(), guard.pid, flush=True)
time.sleep(60)
"""


def _ucx_file(tag: str) -> Path:
    """A file named like UCX's shared memory, unique to this test process."""
    path = Path(guardian.SHM_DIR, f"{guardian.UCX_PREFIX}test{os.getpid()}{tag}")
    path.write_bytes(b"")
    return path


def test_the_guardian_removes_what_it_was_told_and_its_parent_s_files_only(tmp_path):
    """Killed at once after it told its guardian a path (read only after the
    death, then): the told path, MPICH's files named after the process and
    UCX's made since and held by nobody go; a file not told, MPICH's file of
    another pid that begins alike, and UCX's held by a live process or made
    before stay."""
    told, kept = tmp_path / "mpich_shm_told_0", tmp_path / "mpich_shm_kept_0"
    ucx_before = _ucx_file("before")
    time.sleep(2 * guardian.SLACK + 0.05)
    proc = _start(SLEEPER, guardian.__file__, str(told))
    pid, guard = map(int, proc.stdout.readline().split())
    own = Path(guardian.SHM_DIR, f"mpich_shm_{pid:x}_0")
    other = Path(guardian.SHM_DIR, f"mpich_shm_{pid:x}0_0")  # pid * 16 + 0 begins alike
    ucx_stranded, ucx_held = _ucx_file("stranded"), _ucx_file("held")
    try:
        for path in (told, kept, own, other):
            path.write_bytes(b"")
        with open(ucx_held, "rb"):
            proc.kill()
            proc.communicate()
            assert _until(lambda: not process_alive(guard))
        assert not told.exists() and not own.exists() and not ucx_stranded.exists()
        assert kept.exists() and other.exists() and ucx_held.exists() and ucx_before.exists()
    finally:
        proc.kill()
        proc.communicate()
        for path in (own, other, ucx_before, ucx_stranded, ucx_held):
            path.unlink(missing_ok=True)


def test_a_guardian_whose_parent_is_gone_before_it_started_cleans_up_at_once(tmp_path):
    """Its parent died before it got going (another process's pid here, of
    a process that is not its parent): it removes the files and ends."""
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    own = Path(guardian.SHM_DIR, f"mpich_shm_{sleeper.pid:x}_0")
    try:
        own.write_bytes(b"")
        done = subprocess.run([sys.executable, "-I", "-S", guardian.__file__, str(sleeper.pid)],
                              input="", timeout=10)
        assert done.returncode == 0 and not own.exists()
    finally:
        sleeper.kill()
        sleeper.wait()
        own.unlink(missing_ok=True)


def test_no_guardian_under_a_launcher():
    """A launcher's rank (here a Slurm step's variable alone) starts none."""
    proc = _start(CALLER, env={"SLURM_STEP_ID": "0"})
    try:
        proc.stdout.readline()
        assert _guardians(int(proc.stdout.readline())) == []
    finally:
        proc.communicate("\n", timeout=60)  # MPI_Finalize removes its file
