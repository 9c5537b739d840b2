"""What a job leaves behind: its processes and the shared-memory files they
held. Other engineers' runs may add and remove files in /dev/shm at the same
time, so nothing here compares whole listings: a job's files are the ones its
own processes mapped (MPI's segments) or named after their pids (summa's)."""

from __future__ import annotations

import atexit
import functools
import gc
import os
import shutil
import signal
import subprocess
import tempfile
import time

from pathlib import Path

import pytest

from summa.host import shared as host
from summa.runtime.cleanup import MPI_SEGMENT_PREFIXES, descendants, mapped_segments
from summa.runtime.watchdog import SIGNAL_THREAD

#: Where MPI libraries keep their named shared memory.
SEGMENT_DIR = "/dev/shm"


def job_pids(root: int) -> list[int]:
    """Process `root` and its live descendants (a launcher starts its ranks in
    sessions of their own, so a session or group would not find them)."""
    return [root] + descendants(root)


def wait_for_handlers(proc, ranks: int, seconds: float = 60) -> None:
    """Until `ranks` processes of `proc`'s session run summa's signal thread
    (:data:`summa.runtime.watchdog.SIGNAL_THREAD`, by its kernel name): a handler for
    SIGTERM alone is not summa's while Open MPI's ``MPI_Init`` runs."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and proc.poll() is None:
        if sum(handles_signals(pid) for pid in job_pids(proc.pid)) >= ranks:
            return
        time.sleep(0.01)
    pytest.fail(f"the job did not start (status {proc.poll()})")


def handles_signals(pid: int) -> bool:
    """Does `pid` run summa's signal thread?"""
    try:
        return any(Path(task, "comm").read_text().strip() == SIGNAL_THREAD
                   for task in Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return False


def held_files(pids) -> set[str]:
    """Shared-memory files processes `pids` hold: MPI's segments they map and
    summa's shared arrays named after them (:func:`summa.host.shared.named`)."""
    held = {path for pid in pids for path in mapped_segments(pid)}
    try:
        names = os.listdir(host.shm_dir())
    except OSError:
        names = []
    held |= {os.path.join(host.shm_dir(), n) for n in names for pid in pids
             if n.startswith(f"summa-{pid}-")}
    return held


def existing(paths) -> list[str]:
    return sorted(p for p in paths if os.path.exists(p))


def interrupt(proc, seconds: float = 30) -> tuple[str, float]:
    """Ctrl-C (SIGINT) to `proc`, which prints a line when it takes it: that
    line, stripped, and the seconds until it came; then `proc`'s end. A
    signal not taken within `seconds` gives ``("", inf)`` (the test fails,
    it does not hang)."""
    import selectors
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout=seconds):
            return "", float("inf")
    line = proc.stdout.readline()
    took = time.monotonic() - t0
    proc.communicate(timeout=30)
    return line.strip(), took


def wait_gone(pids, seconds: float) -> list[int]:
    """`pids` still alive after up to `seconds` (zombies count as gone)."""
    from summa.runtime.cleanup import process_alive
    deadline = time.monotonic() + seconds
    while True:
        alive = [p for p in pids if process_alive(p)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.02)


class private_folders:
    """A shared-memory folder and a temporary folder of this test session's
    own, named in SUMMA_SHM_DIR and TMPDIR for it and every process it starts
    (summa's shared arrays, the pool's sockets, outputs), and the MPI
    segments that existed when it began."""

    def __init__(self):
        self.shm = tempfile.mkdtemp(prefix="summa-tests-", dir=_shm_root())
        self.tmp = tempfile.mkdtemp(prefix="summa-tests-")
        os.environ["SUMMA_SHM_DIR"], os.environ["TMPDIR"] = self.shm, self.tmp
        tempfile.tempdir = None  # asked again: TMPDIR
        self.segments = set(mpi_segments())
        # a run that ends before its session does (a usage error) removes them
        # at exit; the session's end checks them first (a forked child: not its own)
        atexit.register(self._remove_in, os.getpid())

    def _remove_in(self, pid: int) -> None:
        if os.getpid() == pid:
            self.remove()

    def left(self) -> list[str]:
        """What is in the two folders now (pytest's own folders aside)."""
        found = [os.path.join(self.shm, n) for n in os.listdir(self.shm)]
        return found + [os.path.join(self.tmp, n) for n in os.listdir(self.tmp)
                        if not n.startswith("pytest-of-")]

    def remove(self) -> None:
        shutil.rmtree(self.shm, ignore_errors=True)
        shutil.rmtree(self.tmp, ignore_errors=True)


def _shm_root() -> str:
    """Where a session's shared-memory folder goes: TESTS_SHM_ROOT (a test of
    the harness, which must tell its child's folder from other runs'), else
    /dev/shm where there is one, else the temporary folder."""
    asked = os.environ.get("TESTS_SHM_ROOT")
    if asked:
        return asked
    return SEGMENT_DIR if os.path.isdir(SEGMENT_DIR) else tempfile.gettempdir()


def mpi_segments() -> list[str]:
    """MPI's named shared-memory files on this machine, whoever's."""
    try:
        names = os.listdir(SEGMENT_DIR)
    except OSError:
        return []
    return [os.path.join(SEGMENT_DIR, n) for n in names if n.startswith(MPI_SEGMENT_PREFIXES)]


#: How Open MPI's session folders in TMPDIR begin.
OPEN_MPI_SESSIONS = ("ompi.", "prte.")

#: Seconds an MPI segment must have lived to be called stranded (one just
#: made may not be mapped yet).
SETTLE_SECONDS = 2.0


def stranded(before, settle: float = SETTLE_SECONDS) -> list[str]:
    """MPI segments made since `before` (a set of paths) that no live process
    maps and that are `settle` seconds old (one just made may not be mapped
    yet): left by jobs whose ranks were killed."""
    new = [p for p in mpi_segments() if p not in before]
    if not new:
        return []
    mapped = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            mapped.update(mapped_segments(entry))
    now = time.time()
    out = []
    for path in new:
        try:
            if path not in mapped and now - os.stat(path).st_mtime > settle:
                out.append(path)
        except OSError:
            pass
    return out


def _mtime(path: str) -> float:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return 0.0


def finish(folders: private_folders) -> list[str]:
    """End of a session: remove the MPI segments its killed jobs stranded,
    the session's folders, and return what was left in them."""
    from summa import pool
    from summa.runtime.cleanup import remove_segments
    pool.close()  # a test's pool is stopped at exit otherwise: after this check
    # A named shared array that is garbage in a reference cycle (an exception's
    # traceback holds its frames) takes its file with it when collected, here or
    # at exit: collected first, so that what is left is what outlives its array.
    gc.collect()
    time.sleep(0.5)  # a job ended just now may still be removing its files
    # segments made in the last seconds settle first (a short run's, test_remote's
    # owners killed at its end, were left in /dev/shm)
    youngest = max((_mtime(p) for p in mpi_segments() if p not in folders.segments), default=0.0)
    time.sleep(max(0.0, SETTLE_SECONDS + 0.1 - (time.time() - youngest)))
    remove_segments(stranded(folders.segments, SETTLE_SECONDS))
    for name in os.listdir(folders.tmp):
        # Open MPI's launcher keeps a session folder in TMPDIR (ompi.HOST.UID) and
        # removes it at its end; one a test killed (SIGKILL) could not
        if name.startswith(OPEN_MPI_SESSIONS):
            shutil.rmtree(os.path.join(folders.tmp, name), ignore_errors=True)
    left = folders.left()
    folders.remove()
    return left


@functools.lru_cache(maxsize=None)
def launcher_is_open_mpi(launcher: str) -> bool:
    """Is `launcher` (a path or command name) Open MPI's mpirun? It forwards
    SIGINT to the ranks as SIGTERM, some of its versions report status 1
    for a job whose ranks ended non-zero, whatever their status, and once
    stopped itself it exits non-zero whatever its ranks did."""
    try:
        done = subprocess.run([launcher, "--version"], capture_output=True, text=True,
                              timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "Open MPI" in done.stdout or "OpenRTE" in done.stdout
