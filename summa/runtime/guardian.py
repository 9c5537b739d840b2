"""A small process that removes a process's shared-memory files once it has died.

MPI's files in /dev/shm are removed only by ``MPI_Finalize``, and the CUDA
driver's files of interprocess events never: a process killed by SIGKILL
leaves them until reboot (a launcher kills the ranks it finds inside MPI
calls so, and the proxies of an mpiexec that died of SIGPIPE, its output's
reader gone, ``| head``, kill every rank so; a plain process, which starts
MPI alone, is killed so by its user).
:func:`start` runs this file as a script, before MPI starts where it can, in
a session of its own (a Ctrl-C or a signal to the caller's process group
misses it), with Python alone (``-I -S``: not summa, not site packages, up
in a few tens of milliseconds). It sleeps until its parent ends, however it
ends; then it removes the parent's files and exits. After a normal exit it
finds them gone already.

Run as ``python -I -S guardian.py PID [SINCE [PREFIX ...]]``: the parent's
pid, the time it started the guardian (:func:`time.time`) and how the MPI's
shared-memory files begin (summa's list, passed by :func:`start`: this
script cannot import the package). On its stdin the parent tells it more,
one line each (:func:`tell`, :func:`tell_shared_dir`):

``/an/absolute/path``
    a file the parent's MPI made (its mapped segments once MPI started);
``shared:/an/absolute/folder``
    a folder of summa's shared files: those named after the parent there
    (``summa-<pid>-*``) are the parent's.

Once the parent has died it removes:

* MPICH's files named after the parent (``mpich_shm_<pid in hex>_*``: a
  plain process's) and the CUDA driver's files of its events
  (``cuda.shm.<n>.<pid in hex>.<n>``), in /dev/shm;
* summa's files named after the parent in each told folder;
* each told path, and each file in /dev/shm whose name begins with a
  PREFIX or UCX's (:data:`UCX_PREFIX`), made since SINCE (less
  :data:`SLACK`) and owned by this user (:func:`_made_since`): a segment
  MPI made after it told its paths (another communicator's, made when first
  used) or one a kill stranded as it was made. Of these, only the files no
  live process holds open or maps go: the ranks of a job on a node share
  their segments, so a rank's guardian leaves those its live peers use, and
  the last one's removes them (:func:`_held`).

Only the standard library here, and nothing read from summa's settings.
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

__all__ = ["start", "tell", "tell_shared_dir", "SHM_DIR", "POLL", "UCX_PREFIX",
           "SHARED", "SLACK"]

#: Where MPI and the CUDA driver put their files (their own choice: not
#: ``SUMMA_SHM_DIR``).
SHM_DIR = "/dev/shm"

#: Seconds between looks at the parent where the kernel has no pidfd.
POLL = 0.2

#: How UCX's shared-memory files begin (MPICH's ch4:ucx): named at random,
#: not after the process, and unlinked a few milliseconds after they are
#: made (their users reach them through ``/proc/<pid>/fd``), milliseconds in
#: which a kill strands one.
UCX_PREFIX = "ucx_shm_posix_"

#: How a told line naming a folder of summa's shared files begins.
SHARED = "shared:"

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


def start(prefixes=()) -> None:
    """Start this process's guardian, where it has none yet (a forked child
    starts its own). `prefixes`: how the MPI's shared-memory files begin
    (those made since now that nobody holds are removed at the death). A
    guardian that cannot start is done without: the caller's work goes on."""
    with _slot.lock:  # two threads' first uses of MPI start one
        if _slot.owner == os.getpid():
            return
        _slot.owner, _slot.process = os.getpid(), None
        try:
            _slot.process = subprocess.Popen(
                [sys.executable, "-I", "-S", os.path.abspath(__file__), str(os.getpid()),
                 repr(time.time()), *prefixes],
                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                start_new_session=True)
        except (OSError, ValueError, subprocess.SubprocessError):
            pass


def tell(paths) -> None:
    """Have this process's guardian remove `paths` too (absolute paths of
    shared-memory files MPI made) once this process has died and no other
    process holds them. The caller chooses them: the guardian removes
    whatever it is told that nobody holds."""
    _send(path for path in paths if os.path.isabs(path))


def tell_shared_dir(folder: str) -> None:
    """Have this process's guardian remove summa's shared files named after
    this process (``summa-<pid>-*``) in `folder` once this process has died."""
    _send([SHARED + os.path.abspath(folder)])


def _send(lines) -> None:
    """Write `lines` to this process's guardian, one a line (those holding a
    line break are dropped); nothing where it has none."""
    process = _slot.process
    if process is None or _slot.owner != os.getpid() or process.stdin is None:
        return
    text = "".join(f"{line}\n" for line in lines if "\n" not in line)
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
    """The lines read from stdin (paths, and folders marked :data:`SHARED`)."""

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


def _made_since(since: float, prefixes) -> list[str]:
    """The files in :data:`SHM_DIR` whose names begin with one of `prefixes`,
    made since `since` (the time the parent started this guardian) and owned
    by this user. (A file whose maker died between making and mapping it, or
    between making and unlinking it, as UCX does within milliseconds, is
    among them: nobody else names it.)"""
    made = []
    for name in _names(SHM_DIR):
        if not name.startswith(tuple(prefixes)):
            continue
        path = os.path.join(SHM_DIR, name)
        try:
            stat = os.stat(path)
        except OSError:
            continue
        if stat.st_uid == os.getuid() and stat.st_ctime >= since - SLACK:
            made.append(path)
    return made


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


def _named_after(pid: int, told: list[str]) -> list[str]:
    """The files named after process `pid`: MPICH's and the CUDA driver's in
    :data:`SHM_DIR`, summa's in each folder `told`."""
    mark = f"{pid:x}"
    found = glob.glob(os.path.join(SHM_DIR, f"mpich_shm_{mark}_*"))
    found += [os.path.join(SHM_DIR, name) for name in _names(SHM_DIR)
              if name.startswith("cuda.shm.") and name.split(".")[3:4] == [mark]]
    for folder in {line[len(SHARED):] for line in told if line.startswith(SHARED)}:
        found += [os.path.join(folder, name) for name in _names(folder)
                  if name.startswith(f"summa-{pid}-")]
    return found


def _names(folder: str) -> list[str]:
    """The names in `folder` ([] where it cannot be read)."""
    try:
        return os.listdir(folder)
    except OSError:
        return []


def _remove(pid: int, told: list[str], since: float, prefixes=()) -> None:
    """Remove the files named after process `pid` (:func:`_named_after`),
    and the `told` paths and those MPI or UCX made since `since` that no
    process holds (those gone already are skipped)."""
    segments = [*{line for line in told if not line.startswith(SHARED)},
                *_made_since(since, (UCX_PREFIX, *prefixes))]
    held = _held() if segments else set()
    for path in _named_after(pid, told) + [path for path in segments if path not in held]:
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
        prefixes = argv[2:]
        told = _wait(pid)
    except Exception:  # noqa: BLE001 -- unsure its parent ended: remove nothing
        return 0
    try:
        _remove(pid, told, since, prefixes)
    except Exception:  # noqa: BLE001 -- nobody reads a guardian's errors
        pass
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
