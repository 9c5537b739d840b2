"""A small process that removes a plain process's MPI files once it has died.

A process not started by a launcher starts MPI as a singleton, and MPICH
then makes ``/dev/shm/mpich_shm_<pid in hex>_0``, which it removes only in
``MPI_Finalize``: a process killed by SIGKILL leaves it until reboot (so does
a pool's caller killed before its workers, which remove its files, were
launched). :func:`start` runs this file as a script, before MPI starts, in a
session of its own (a Ctrl-C or a signal to the caller's process group misses
it), with Python alone (``-I -S``: not summa, not site packages, up in a few
tens of milliseconds). It sleeps until its parent ends, however it ends; then
it removes the parent's MPICH files by their name, every path the parent
told it on its stdin (:func:`tell`: the files MPI mapped, for MPIs that name
them otherwise) and UCX's files that the death stranded (:func:`_stranded`),
and exits. After a normal exit it finds them gone already.

Only the standard library here, and nothing read from summa's settings: the
script cannot import the package.
"""

from __future__ import annotations

import glob
import os
import select
import signal
import subprocess
import sys
import threading
import time

__all__ = ["start", "tell", "SHM_DIR", "POLL", "UCX_PREFIX", "SLACK"]

#: Where MPICH puts its files (its own choice: not ``SUMMA_SHM_DIR``).
SHM_DIR = "/dev/shm"

#: Seconds between looks at the parent where the kernel has no pidfd.
POLL = 0.2

#: How UCX's shared-memory files begin (MPICH's ch4:ucx): named at random,
#: not after the process, and unlinked a few milliseconds after they are
#: made (their users reach them through ``/proc/<pid>/fd``), milliseconds in
#: which a kill strands one.
UCX_PREFIX = "ucx_shm_posix_"

#: Seconds before the guardian's start that a file it may take for its
#: parent's was made: file times are coarser than the clock.
SLACK = 0.1


class _Slot:
    """This process's guardian (one per process, started by :func:`start`).

    Attributes
    ----------
    process : subprocess.Popen or None
        The guardian, kept: a Popen dropped while its process runs warns.
    owner : int or None
        The pid that started it: a forked child inherits the slot, not the
        guardian, which watches its parent only.
    lock : threading.Lock
        Held while one is started.
    """

    def __init__(self):
        self.process: subprocess.Popen | None = None
        self.owner: int | None = None
        self.lock = threading.Lock()


_slot = _Slot()


def start() -> None:
    """Start this process's guardian, where it has none yet (a forked child
    starts its own). A guardian that cannot start is done without: the
    caller's work goes on."""
    with _slot.lock:  # two threads' first uses of MPI start one
        if _slot.owner == os.getpid():
            return
        _slot.owner, _slot.process = os.getpid(), None
        try:
            _slot.process = subprocess.Popen(
                [sys.executable, "-I", "-S", os.path.abspath(__file__), str(os.getpid()),
                 repr(time.time())],
                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                start_new_session=True)
        except (OSError, ValueError, subprocess.SubprocessError):
            pass


def tell(paths) -> None:
    """Have this process's guardian remove `paths` too (absolute paths of
    shared-memory files MPI made) once this process has died. The caller
    chooses them: the guardian removes whatever it is told."""
    process = _slot.process
    if process is None or _slot.owner != os.getpid() or process.stdin is None:
        return
    text = "".join(f"{path}\n" for path in paths if os.path.isabs(path) and "\n" not in path)
    try:
        process.stdin.write(text.encode())
        process.stdin.flush()
    except (OSError, ValueError):  # the guardian ended: nobody to tell
        pass


# ---------------------------------------------------------------------------
# The guardian itself (run as a script).


def _watch(pid: int):
    """A descriptor readable once process `pid` has ended (a pidfd), None
    where the kernel has none (then :func:`_gone` is polled), or False where
    it has ended already."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    except (AttributeError, OSError):
        return None
    # opened before the parent was seen alive: the pid is still the parent's
    return False if _gone(pid) else fd


def _gone(pid: int) -> bool:
    """Has this guardian's parent `pid` ended (it is then adopted by
    another)?"""
    return os.getppid() != pid


class _Told:
    """The paths read from stdin, one a line."""

    def __init__(self):
        self.paths: list[str] = []
        self._pending = b""

    def read(self) -> bool:
        """Read what stdin holds now; False at its end (or where it has
        nothing more to read without waiting)."""
        try:
            chunk = os.read(0, 65536)
        except OSError:  # nothing more now (non-blocking), or no stdin
            return False
        *lines, self._pending = (self._pending + chunk).split(b"\n")
        self.paths += [line.decode(errors="surrogateescape") for line in lines if line]
        return bool(chunk)


def _wait(pid: int) -> list[str]:
    """Sleep until parent `pid` ends; the paths it told on stdin (one a
    line; its end of the pipe closed is not its end), those it wrote just
    before its end included."""
    watch = _watch(pid)
    told, reading = _Told(), True
    while watch is not False:
        waits = ([watch] if watch is not None else []) + ([0] if reading else [])
        ready = select.select(waits, [], [], None if watch is not None else POLL)[0]
        if (watch is not None and watch in ready) or _gone(pid):
            break
        if 0 in ready:
            reading = told.read()
    if reading:  # what is left in the pipe, without waiting for more
        try:
            os.set_blocking(0, False)
        except OSError:
            return told.paths
        while told.read():
            pass
    return told.paths


def _stranded(since: float) -> list[str]:
    """UCX's files made since `since` (the time its parent started this
    guardian, before MPI) that no process holds open or maps: its parent
    died between making one and unlinking it. (A live process holds its
    file from the moment it makes it.)"""
    made = []
    for path in glob.glob(os.path.join(SHM_DIR, UCX_PREFIX + "*")):
        try:
            stat = os.stat(path)
        except OSError:
            continue
        if stat.st_uid == os.getuid() and stat.st_ctime >= since - SLACK:
            made.append(path)
    return [path for path in made if path not in _held()] if made else []


def _held() -> set[str]:
    """The paths every process this one may look at holds open or maps."""
    held = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            for fd in os.listdir(f"/proc/{entry}/fd"):
                try:
                    held.add(os.readlink(f"/proc/{entry}/fd/{fd}"))
                except OSError:
                    pass
            with open(f"/proc/{entry}/maps") as fh:
                held.update(line.rstrip("\n").split(None, 5)[-1] for line in fh)
        except OSError:  # ended meanwhile, or another user's
            continue
    return held


def _remove(pid: int, told: list[str], since: float) -> None:
    """Remove MPICH's files of process `pid`, the `told` paths and UCX's
    files stranded since `since` (those gone already are skipped)."""
    mpich = glob.glob(os.path.join(SHM_DIR, f"mpich_shm_{pid:x}_*"))
    for path in mpich + told + _stranded(since):
        try:
            os.unlink(path)
        except OSError:
            pass


def _main(argv: list[str]) -> int:
    # a stop meant for the caller's job is not the guardian's: it ends after its parent
    for stop in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(stop, signal.SIG_IGN)
    try:
        pid = int(argv[0])
        since = float(argv[1]) if len(argv) > 1 else time.time()
        told = _wait(pid)
    except Exception:  # noqa: BLE001 -- unsure its parent ended: remove nothing
        return 0
    try:
        _remove(pid, told, since)
    except Exception:  # noqa: BLE001 -- nobody reads a guardian's errors
        pass
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
