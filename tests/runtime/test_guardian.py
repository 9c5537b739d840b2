"""A process's guardian (summa/runtime/guardian.py): once the process has
died, however it died, its MPI files, the CUDA driver's and summa's named
after it are gone, and MPI's files it made that nobody holds; those a live
peer holds stay. It is in a session of its own, and it ends with its
process."""

import glob
import mmap
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from summa.runtime import guardian
from summa.runtime.cleanup import MPI_SEGMENT_PREFIXES, descendants, process_alive
from summa.runtime.mpi import launched

pytestmark = pytest.mark.skipif(
    launched() or not os.path.isdir(guardian.SHM_DIR),
    reason="the processes started here would take the launcher's variables; no /dev/shm")

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


#: The environment of a process a launcher started, as summa tells it (a
#: Slurm step's variable alone: its MPI still starts alone, as a singleton).
LAUNCHED = {"SLURM_STEP_ID": "0"}


def _caller(env=None):
    """A started :data:`CALLER`, its pid and its guardians' (one); skipped
    where its MPI is not MPICH (whose file is named after the process)."""
    proc = _start(CALLER, env=env)
    version = proc.stdout.readline()
    if not version.startswith("MPICH"):
        proc.kill()
        proc.communicate()
        pytest.skip(f"the file named after the process is MPICH's, not {version.strip()!r}'s")
    pid = int(proc.stdout.readline())
    return proc, pid, _guardians(pid)


@pytest.mark.parametrize("env", [None, LAUNCHED], ids=["plain", "launched"])
@pytest.mark.parametrize("how", ["process", "group"])
def test_a_killed_process_s_mpi_file_is_removed_by_its_guardian(how, env):
    """SIGKILL, to the process or to its whole process group (the guardian is
    in neither), a plain process's or a launcher's rank's: its MPICH file is
    gone a moment later, and so is its guardian."""
    proc, pid, guardians = _caller(env)
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


#: A process that starts the guardian script itself (no summa imported) with
#: the MPI prefixes of its first argument, tells it the lines of the others,
#: says its pid and its guardian's, then opens each file named on its stdin
#: (saying so) and holds them.
SLEEPER = """
import os, subprocess, sys, time
guard = subprocess.Popen([sys.executable, "-I", "-S", sys.argv[1], str(os.getpid()),
                          repr(time.time()), *sys.argv[2].split()], stdin=subprocess.PIPE,
                         start_new_session=True)
guard.stdin.write("".join(line + "\\n" for line in sys.argv[3:]).encode())
guard.stdin.flush()
print(os.getpid(), guard.pid, flush=True)
held = []
for line in sys.stdin:
    held.append(open(line.strip(), "rb"))
    print("held", flush=True)
time.sleep(60)
"""


def _sleeper(*told: str, prefixes=MPI_SEGMENT_PREFIXES):
    """A started :data:`SLEEPER` telling `told`, its pid and its guardian's."""
    proc = _start(SLEEPER, guardian.__file__, " ".join(prefixes), *told)
    pid, guard = map(int, proc.stdout.readline().split())
    return proc, pid, guard


def _hold(proc: subprocess.Popen, path: Path) -> None:
    """Have :data:`SLEEPER` `proc` hold `path` open."""
    proc.stdin.write(f"{path}\n")
    proc.stdin.flush()
    assert proc.stdout.readline().strip() == "held"


def _kill(proc: subprocess.Popen, guard: int) -> None:
    """Kill `proc` and wait for its guardian `guard` to end."""
    proc.kill()
    proc.communicate()
    assert _until(lambda: not process_alive(guard))


def _made(path: Path) -> Path:
    """`path`, made empty now."""
    path.write_bytes(b"")
    return path


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
    proc, pid, guard = _sleeper(str(told), prefixes=())
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


def test_a_launched_rank_s_guardian_removes_the_cuda_and_summa_files_named_after_it(tmp_path):
    """Told summa's shared folder: the CUDA driver's files of the dead
    process's events in /dev/shm and summa's files named after it in the
    folder go; those of other pids (one that begins alike) stay."""
    proc, pid, guard = _sleeper(guardian.SHARED + str(tmp_path))
    cuda = Path(guardian.SHM_DIR, f"cuda.shm.0.{pid:x}.0")
    cuda_other = Path(guardian.SHM_DIR, f"cuda.shm.0.{pid:x}0.0")
    own, other = tmp_path / f"summa-{pid}-a.shared", tmp_path / f"summa-{pid}0-a.shared"
    try:
        for path in (cuda, cuda_other, own, other):
            _made(path)
        _kill(proc, guard)
        assert not cuda.exists() and not own.exists()
        assert cuda_other.exists() and other.exists()
    finally:
        proc.kill()
        proc.communicate()
        for path in (cuda, cuda_other):
            path.unlink(missing_ok=True)


def _mpi_file(tag: str, prefix: str = "mpich_shm_") -> Path:
    """A file named like MPI's shared memory, unique to this test process
    (not like a pid's: ``test`` is no hex)."""
    return Path(guardian.SHM_DIR, f"{prefix}test{os.getpid()}{tag}_0")


def test_the_ranks_guardians_remove_mpi_files_nobody_holds_the_last_one_those_peers_held(
        tmp_path):
    """Two ranks of a job, killed one after the other. The first's guardian
    removes MPI's files made since it started that no process holds (any
    MPI's prefix), but leaves those its live peer holds, told or not, and
    one the test holds; the last one's removes those its peer held. Files
    made before either started, and the test's, stay. (The file made before
    has a prefix of this test's own: another process's guardian, ending
    meanwhile, may take an MPI's.)"""
    own_prefix = f"summa_test{os.getpid()}_"
    prefixes = (*MPI_SEGMENT_PREFIXES, own_prefix)
    before = _made(_mpi_file("before", own_prefix))
    time.sleep(2 * guardian.SLACK + 0.05)
    told = tmp_path / "mpich_shm_told_0"
    first, _, first_guard = _sleeper(str(told), prefixes=prefixes)
    last, _, last_guard = _sleeper(str(told), prefixes=prefixes)
    stranded = [_made(_mpi_file("stranded", prefix)) for prefix in MPI_SEGMENT_PREFIXES]
    shared, mine = _made(_mpi_file("shared")), _made(_mpi_file("mine"))
    _made(told)
    try:
        for path in (shared, told):
            _hold(last, path)
        with open(mine, "rb"):
            _kill(first, first_guard)
            assert [p for p in stranded if p.exists()] == []
            assert shared.exists() and told.exists() and mine.exists()
            _kill(last, last_guard)
            assert not shared.exists() and not told.exists()
            assert mine.exists() and before.exists()
    finally:
        for proc in (first, last):
            proc.kill()
            proc.communicate()
        for path in (before, shared, mine, *stranded):
            path.unlink(missing_ok=True)


def test_a_killed_process_s_guardian_removes_the_files_it_was_told_of(tmp_path):
    """A process killed with SIGKILL removes nothing: its guardian (started
    and told by :func:`summa.runtime.mpi.guard`, as once MPI has started)
    removes the MPI file it mapped, the CUDA driver's and summa's named
    after it (in ``SUMMA_SHM_DIR``), and not an MPI file made before it
    started that it did not map."""
    seg, other = _made(_mpi_file("g")), _made(_mpi_file("h"))
    seg.write_bytes(b"\0" * mmap.PAGESIZE)
    time.sleep(2 * guardian.SLACK + 0.05)
    script = textwrap.dedent(f"""
        import mmap, os, time
        from summa.runtime.mpi import guard
        f = open({str(seg)!r}, "r+b")
        m = mmap.mmap(f.fileno(), 0)
        for name in (f"/dev/shm/cuda.shm.0.{{os.getpid():x}}.1",
                     f"{tmp_path}/summa-{{os.getpid()}}-a.shared"):
            open(name, "w").close()
        guard()
        print("ready", flush=True)
        time.sleep(60)
    """)
    proc = _start(script, env={"SUMMA_SHM_DIR": str(tmp_path)})
    files = [seg, Path(f"/dev/shm/cuda.shm.0.{proc.pid:x}.1"),
             tmp_path / f"summa-{proc.pid}-a.shared"]
    try:
        assert proc.stdout.readline().strip() == "ready"
        assert all(f.exists() for f in files) and len(_guardians(proc.pid)) == 1
        proc.kill()
        proc.communicate()
        assert _until(lambda: not any(f.exists() for f in files)), files
        assert other.exists()
    finally:
        proc.kill()
        proc.communicate()
        for f in [*files, other]:
            f.unlink(missing_ok=True)
