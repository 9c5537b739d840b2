"""What a process leaves behind when it ends abruptly, and how to end it.

Temporary outputs of this process not yet renamed into place, so that a
signal, the watchdog or an aborting rank can remove them before the process
ends; the named shared memory of the MPI library, which the library removes
only in ``MPI_Finalize`` (a job that ends otherwise strands it in /dev/shm
until reboot); the CUDA driver's files for interprocess events, which it
never removes; and :func:`hard_exit`, which ends the process without running
exit handlers that wait on library threads. A process killed outright
removes nothing itself: its guardian does (:mod:`summa.runtime.guardian`).
No imports of summa's own: the I/O, the watchdog, the pool and the entry
point all reach it.
"""

from __future__ import annotations

import _thread
import atexit
import functools
import os
import secrets
import signal
import sys
import threading
import time
import weakref

__all__ = ["temporary_files", "new_temporary_file", "remove_temporary_files",
           "MPI_SEGMENT_PREFIXES", "mapped_segments", "held_segments", "note_segments",
           "remove_segments",
           "cuda_ipc_files", "descendants",
           "remove_cuda_ipc_files_at_exit", "hard_exit", "end_job", "process_alive", "finalize",
           "raises_ctrl_c"]

#: Paths this process removes where it ends abruptly (:func:`hard_exit`):
#: unfinished outputs, shared-memory files not yet unlinked (a set: safe to
#: change from any thread).
temporary_files: set = set()

#: How the shared-memory files of the MPIs we run on begin (MPICH 4-5:
#: ``mpich_shm_<world>_<node>``, ``mpich_vci_...``; Open MPI 4: ``vader_segment.``;
#: Open MPI 5: ``sm_segment.``).
MPI_SEGMENT_PREFIXES = ("mpich_shm_", "mpich_vci_", "vader_segment.", "sm_segment.")


#: Set once this process is ending by :func:`hard_exit`: a file made after
#: its clean-up began removes itself (:func:`new_temporary_file`).
_ending = threading.Event()


def new_temporary_file(folder: str, prefix: str, suffix: str) -> tuple[int, str]:
    """``(fd, path)`` of a new empty file in `folder` (private, opened for
    reading and writing), in :data:`temporary_files` from before it exists:
    a signal's clean-up on another thread (:func:`hard_exit`) finds it
    whenever it comes. (``tempfile.mkstemp`` first, then the set, left a
    window in which the process ended with the file unnamed: an output
    stranded beside the test of a signal at a random time.)"""
    while True:
        path = os.path.join(folder, f"{prefix}{secrets.token_hex(6)}{suffix}")
        temporary_files.add(path)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            temporary_files.discard(path)
            continue
        except BaseException:
            temporary_files.discard(path)
            raise
        if _ending.is_set():  # the clean-up may have passed before the file was there
            os.close(fd)
            os.unlink(path)
            threading.Event().wait()  # the ending thread exits the process
        return fd, path


def remove_temporary_files() -> None:
    """Delete this process's :data:`temporary_files` (safe from any thread)."""
    for path in list(temporary_files):
        try:
            os.unlink(path)
        except OSError:
            pass
        temporary_files.discard(path)


def _remove_temporary_files_at_exit(owner: int = os.getpid()) -> None:
    """At a normal exit, what is still in :data:`temporary_files`: a file
    whose owner never took it (a Ctrl-C between its making and its
    finalizer, :func:`summa.host.shared.named`). Not in a forked child,
    which inherited the set but not the files' ownership."""
    if os.getpid() == owner:
        remove_temporary_files()


atexit.register(_remove_temporary_files_at_exit)


def mapped_segments(pid: int | str = "self",
                    prefixes: tuple = MPI_SEGMENT_PREFIXES) -> list[str]:
    """Paths of the named shared-memory files process `pid` maps whose names
    begin with one of `prefixes` (the MPI library's by default); [] where its
    maps cannot be read (it has ended, or is not ours)."""
    found = []
    try:
        with open(f"/proc/{pid}/maps") as fh:
            for line in fh:
                path = line.rstrip("\n").split(None, 5)[-1]
                if path.startswith("/") and os.path.basename(path).startswith(prefixes) \
                        and path not in found and not path.endswith("(deleted)"):
                    found.append(path)
    except OSError:
        pass
    return found


def held_segments(pid: int, prefixes: tuple = MPI_SEGMENT_PREFIXES) -> list[str]:
    """:func:`mapped_segments` of process `pid` and those it has open but
    not yet mapped (MPI's start opens its file, sizes it, then maps it: a
    process stopped in between holds it only as a descriptor)."""
    found = mapped_segments(pid, prefixes)
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return found
    for fd in fds:
        try:
            path = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if os.path.basename(path).startswith(prefixes) and path not in found \
                and not path.endswith("(deleted)"):
            found.append(path)
    return found


def descendants(pid: int) -> list[int]:
    """The live processes below process `pid` (children first), found by
    their parents in /proc: a launcher's ranks, which it starts in sessions
    of their own."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] not in ("Z", "X"):
            children.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = [], list(children.get(pid, []))
    while todo:
        child = todo.pop(0)
        found.append(child)
        todo.extend(children.get(child, []))
    return found


#: MPI's files this process mapped once MPI had started (:func:`note_segments`).
_noted_segments: set = set()


def note_segments() -> list[str]:
    """Note the MPI files this process maps now, for :func:`hard_exit`:
    an end that comes while ``MPI_Finalize`` runs may find them unmapped
    and not yet removed. Returns them (what its guardian is told too)."""
    segments = mapped_segments()
    _noted_segments.update(segments)
    return segments


def remove_segments(paths) -> None:
    """Unlink shared-memory files by path (those already gone are skipped).
    The processes that map them keep their memory until they end."""
    for path in paths:
        try:
            os.unlink(path)
        except OSError:
            pass


#: Where the CUDA driver puts its files for interprocess events (its own
#: choice: not ``SUMMA_SHM_DIR``, where summa's node-shared arrays go).
CUDA_SHM_DIR = "/dev/shm"


def cuda_ipc_files(pid: int | None = None) -> list[str]:
    """Paths of the files the CUDA driver made in /dev/shm for process
    `pid`'s (default: this one's) interprocess events,
    ``cuda.shm.<n>.<pid in hex>.<n>``. The driver removes them neither when
    the events are destroyed nor when the process ends (on the H200
    machine's driver: a two-rank job of ipc broadcasts left one per rank,
    test_ipc_broadcasts_leave_nothing_in_dev_shm)."""
    mark = f"{os.getpid() if pid is None else pid:x}"
    try:
        names = os.listdir(CUDA_SHM_DIR)
    except OSError:
        return []
    return [os.path.join(CUDA_SHM_DIR, name) for name in names
            if name.startswith("cuda.shm.") and name.split(".")[3:4] == [mark]]


@functools.lru_cache(maxsize=None)
def remove_cuda_ipc_files_at_exit() -> None:
    """Remove this process's :func:`cuda_ipc_files` when it exits (once
    asked, however often). The peers that opened its events keep their
    maps of the files; none opens one later, after its owner is gone."""
    atexit.register(lambda: remove_segments(cuda_ipc_files()))


def hard_exit(status: int) -> None:
    """Remove what this process would leave behind, then end it with `status`
    at once: no exit handlers, no ``MPI_Finalize`` or ``MPI_Abort`` (whose
    ``exit()`` joins BLAS threads that may be busy in the main thread's GEMM,
    and hung a one-rank job for good). Under a launcher the other ranks are
    ended by it, as for any rank that exits non-zero without finalizing.
    Temporary files go last, just before the end: one another thread makes
    meanwhile is named by then, or removes itself (:func:`new_temporary_file`)."""
    _ending.set()
    remove_segments({*mapped_segments(), *_noted_segments})
    remove_segments(cuda_ipc_files())
    remove_temporary_files()
    os._exit(status)


def end_job(comm, message: str, status: int) -> None:
    """Say `message` on stderr, remove the job's temporary outputs (an
    output being written in place goes with the job) and MPI's shared
    memory (``MPI_Abort`` leaves it in /dev/shm), then end every rank of
    `comm`'s job (``MPI_Abort``), the launcher given a moment to forward the
    message first."""
    print(message, file=sys.stderr, flush=True)
    remove_temporary_files()
    remove_segments(mapped_segments())
    time.sleep(0.5)
    comm.Abort(status)


def process_alive(pid: int) -> bool:
    """Is process `pid` running (a zombie, killed and not yet reaped, is not)?"""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def finalize(obj, func, *args) -> weakref.finalize:
    """``weakref.finalize(obj, func, *args)``, keeping a Ctrl-C that lands in
    `func`. Python prints an exception raised in a finalizer and drops it
    ("Exception ignored in: <finalize object>"), so a Ctrl-C that arrived
    while a shared copy's file was being removed was lost, and a caller
    looping over calls went on for good (test_pool's Ctrl-C test, ``loop``).
    Here it is raised again in the main thread once the finalizer returns;
    and where Python's own handler is in place, a Ctrl-C landing in
    ``weakref.finalize`` itself, before `func` starts (that test failed so
    in CI), is put off alike (:func:`_ctrl_c_outside_finalizers`).
    `func` should do its essential step first: the rest of it is skipped."""
    _keep_ctrl_c_out_of_finalizers()
    return weakref.finalize(obj, _keeping_ctrl_c, func, *args)


def _keeping_ctrl_c(func, *args) -> None:
    try:
        func(*args)
    except KeyboardInterrupt:
        _interrupt_again()


def _interrupt_again() -> None:
    """Ctrl-C again, from a thread a moment later: raised in a finalizer
    (interrupt_main from its own thread too) it would be lost."""
    again = threading.Timer(AGAIN_AFTER, _thread.interrupt_main)
    again.daemon = True
    again.start()


def _keep_ctrl_c_out_of_finalizers() -> None:
    """In the main thread, where Python's own SIGINT handler is in place,
    put :func:`_ctrl_c_outside_finalizers` instead (a handler of the
    caller's is left alone; elsewhere no handler can be set)."""
    if threading.current_thread() is threading.main_thread() and \
            signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _ctrl_c_outside_finalizers)


def _ctrl_c_outside_finalizers(signum, frame) -> None:
    """Python's SIGINT handler (KeyboardInterrupt where the signal finds
    the main thread), except in a finalizer (a ``weakref.finalize``
    callback or a ``__del__``), where the exception would be printed and
    lost: there Ctrl-C comes again a moment later."""
    while frame is not None:
        if frame.f_code in _FINALIZER_CODES or frame.f_code.co_name == "__del__":
            _interrupt_again()
            return
        frame = frame.f_back
    raise KeyboardInterrupt


_FINALIZER_CODES = frozenset({weakref.finalize.__call__.__code__, _keeping_ctrl_c.__code__})


def raises_ctrl_c(handler) -> bool:
    """Is `handler` (``signal.getsignal(signal.SIGINT)``) Python's own or
    the one summa puts in its place (:func:`finalize`): a Ctrl-C raises
    KeyboardInterrupt in the main thread?"""
    return handler is signal.default_int_handler or handler is _ctrl_c_outside_finalizers


#: Seconds after a finalizer caught a Ctrl-C that it is raised again (the
#: finalizer returns within microseconds: it removes a file, closes a map).
AGAIN_AFTER = 0.01
