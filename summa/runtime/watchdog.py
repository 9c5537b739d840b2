"""Never hang: a watchdog for steps that wait on other ranks, and signal handling.

The code marks each step that waits on other ranks with :func:`watch`
("the broadcast of A panel 37 from grid column 4 along grid row 1"). While a
:class:`Watchdog` is running, a thread checks about once a second whether the
current step has lasted longer than the timeout; if so it says which rank
waited how long for what, and aborts the whole job. Without a running watchdog
(the library default) :func:`watch` costs a few attribute writes.

:func:`handle_signals` makes SIGINT and SIGTERM stop a rank promptly even
while it is blocked inside MPI or CUDA: a thread of its own wakes on them,
removes the temporary output files and ends the process.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
import time
from contextlib import contextmanager

from .mpi import MPI, guard
from .. import options
from . import cleanup

__all__ = ["Watchdog", "watch", "handle_signals", "STOPPING", "wait_if_stopping",
           "timeout_from_env", "EXIT_TIMEOUT"]

EXIT_TIMEOUT = 124


class _Slot:
    """Where the running :class:`Watchdog` is held: module state, because a
    process runs one at a time and :func:`watch` must find it from any code
    below it, where nothing passes it along. One object whose attribute is
    set, not a name rebound with ``global``.

    Attributes
    ----------
    active : Watchdog or None
        The running watchdog, if any.
    """

    def __init__(self):
        self.active: Watchdog | None = None


_slot = _Slot()


@contextmanager
def watch(description: str):
    """Mark the enclosed code as one step that may wait on other ranks."""
    dog = _slot.active
    if dog is None:
        yield
        return
    previous = dog._step
    dog._step = (description, time.monotonic())
    try:
        yield
    finally:
        dog._step = previous


def timeout_from_env(default: float | None = None) -> float | None:
    """``SUMMA_TIMEOUT`` of the current options (:func:`summa.options.current`)
    in seconds: unset gives `default`, 0 gives None (no watchdog)."""
    value = options.current().timeout
    if value is None:
        return default
    return value or None


class Watchdog:
    """Abort the job when one step waits longer than `timeout` seconds.

    Parameters
    ----------
    timeout : float
        Longest a step may take.
    comm : MPI.Comm
        Used to name this rank and to abort the job.
    """

    def __init__(self, timeout: float, comm: MPI.Comm | None = None):
        if timeout <= 0:
            raise ValueError(f"watchdog timeout must be > 0, got {timeout}")
        self.timeout = float(timeout)
        self.comm = MPI.COMM_WORLD if comm is None else comm
        self._step = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="summa-watchdog", daemon=True)

    def __enter__(self) -> "Watchdog":
        _slot.active = self
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        _slot.active = None
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        poll = min(1.0, self.timeout / 4)
        while not self._stop.wait(poll):
            step = self._step
            if step is None:
                continue
            description, since = step
            waited = time.monotonic() - since
            if waited > self.timeout:
                _die(f"summa: rank {self.comm.Get_rank()} waited {waited:.0f} s for "
                     f"{description} (timeout {self.timeout:g} s); aborting the job",
                     self.comm, EXIT_TIMEOUT)


def _die(message: str, comm: MPI.Comm, status: int, settle=(0.5, 1.0),
         abort: bool = True) -> None:
    """Print `message`, remove temporary outputs and MPI's shared memory and
    end the job from any thread: with `abort` and several ranks by
    ``MPI_Abort`` (where MPI allows it from this thread), else this process
    alone (:func:`summa.runtime.cleanup.hard_exit`), and the launcher ends the other
    ranks as for any rank that exits non-zero without finalizing."""
    cleanup.remove_temporary_files()  # looked up now: a test replaces it
    if message:
        sys.stderr.write(message + "\n")
        sys.stderr.flush()
    if comm.Get_size() > 1:
        # `settle` seconds (rank 0's, the others'): for the launcher to forward
        # the message, and, as rank 0 holds the temporary outputs, for it to
        # remove them before another rank's exit makes the launcher end the job.
        time.sleep(settle[0] if comm.Get_rank() == 0 else settle[1])
        if abort and MPI.Query_thread() == MPI.THREAD_MULTIPLE:
            cleanup.remove_segments(cleanup.mapped_segments())
            # Should MPI_Abort itself block (from this thread, beside a main
            # thread inside MPI), faulthandler's own thread, which needs no
            # GIL, prints where every thread is and exits this process: the
            # launcher then ends the rest; a watchdog that hangs would be none.
            import faulthandler
            faulthandler.dump_traceback_later(ABORT_GRACE, exit=True)
            comm.Abort(status)
    cleanup.hard_exit(status)


#: Seconds MPI_Abort may take before the process ends itself (:func:`_die`).
ABORT_GRACE = 10.0


#: Set once a SIGINT/SIGTERM is being handled: the process is ending with its
#: status, and the main thread must not end it first with another one.
STOPPING = threading.Event()


def wait_if_stopping() -> None:
    """Block for good where a signal is ending this process (the signal
    thread exits it with 128 + the signal number); return at once otherwise.
    For the main thread, so that an error raised by the stop itself (an output
    removed under it) cannot end the process first with another status."""
    while STOPPING.is_set():
        time.sleep(1.0)


def handle_signals(comm: MPI.Comm | None = None, announce: bool = True,
                   told=None) -> None:
    """Stop promptly on SIGINT/SIGTERM, even inside a blocking MPI, BLAS or
    CUDA call.

    Whichever thread the signal lands on, Python's C-level handler writes its
    number to a wake-up pipe; a daemon thread blocked on that pipe then
    ignores copies of the signal for :data:`REPEAT_GRACE` seconds and gives
    both signals back their default action after that (a second one ends the
    process at once, whatever this one is waiting on), removes temporary
    output files and
    MPI's shared memory, and ends the process with status 128 + signal number
    without running exit handlers (:func:`summa.runtime.cleanup.hard_exit`).
    (Python-level handlers would wait for the main thread to leave MPI.)
    Both signals are unblocked in the calling thread last (a job summa
    launches starts with them blocked: :mod:`summa.pool.job`).
    Without `announce`, no word on stderr. `told`, where given, takes that
    status and gives the one to exit with (a job whose parent hears how it
    ended otherwise: :func:`summa.__main__._told`). Call once, from the main
    thread.
    """
    comm = MPI.COMM_WORLD if comm is None else comm
    told = told or (lambda status: status)
    guard()  # MPI has started: its files, noted, are its guardian's should it be killed
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: None)  # the thread below does the work

    def wait_for_signal():
        _name_thread(SIGNAL_THREAD)
        signum = os.read(read_end, 1)[0]
        STOPPING.set()
        # The same signal often comes twice at once: to the process group and
        # again from a launcher or Open MPI's singleton helper that forwards it.
        # Those copies are ignored for a moment; a later one ends the process.
        _set_action(_SIG_IGN, signal.SIGINT, signal.SIGTERM)
        later = threading.Timer(REPEAT_GRACE, _set_action,
                                (_SIG_DFL, signal.SIGINT, signal.SIGTERM))
        later.daemon = True
        later.start()
        name = signal.Signals(signum).name
        # Well under a second: a batch system's SIGTERM precedes its SIGKILL by
        # a few seconds, and a signal reaches every rank, rank 0 among them.
        _die(f"summa: rank {comm.Get_rank()}: received {name}; stopping" if announce else "",
             comm, told(128 + signum), settle=(0.1, 0.4), abort=False)

    threading.Thread(target=wait_for_signal, name=SIGNAL_THREAD, daemon=True).start()
    atexit.register(_ignore_stops)
    # A process summa launched (the pool's workers, a multiply run without
    # mpirun) starts with both blocked, so that a stop during its start waits
    # for the clean-up above: taken now, should one have come.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, (signal.SIGINT, signal.SIGTERM))


def _ignore_stops() -> None:
    """Ignore SIGINT and SIGTERM from the start of a normal exit: the work is
    done, and Python's finalization gives a handled signal back its default
    action before ``MPI_Finalize`` runs (mpi4py's, among the very last exit
    functions), so a stop then killed the rank, and the launcher printed
    "BAD TERMINATION ... Interrupt (signal 2)" after the command's summary.
    Python leaves an ignored signal ignored. (A finalization that hangs is
    the launcher's or the pool's to kill.)"""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)


#: The signal thread's name, also the kernel's (``/proc/PID/task/*/comm``,
#: ``top -H``): a process with it handles SIGINT/SIGTERM as above. A handler
#: for SIGTERM alone says nothing: Open MPI's start (``MPI_Init``) sets one
#: of its own, whose default action a signal in that window meets.
SIGNAL_THREAD = "summa-signals"


def _name_thread(name: str) -> None:
    """Give the calling thread `name` in the kernel's view (Linux; a no-op
    elsewhere)."""
    import ctypes
    try:
        ctypes.CDLL(None, use_errno=True).prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):
        pass


#: Seconds after a first SIGINT/SIGTERM during which more of them are ignored
#: (copies of the first); after that a second one ends the process at once.
REPEAT_GRACE = 0.25
_SIG_DFL, _SIG_IGN = 0, 1


def _set_action(action: int, *signums) -> None:
    """Give `signums` the C-level `action` (``_SIG_DFL``: end the process;
    ``_SIG_IGN``), from any thread: Python's ``signal.signal`` works only in
    the main thread, which may be inside a GEMM or MPI for a long time."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    libc.signal.restype = ctypes.c_void_p
    libc.signal.argtypes = (ctypes.c_int, ctypes.c_void_p)
    for signum in signums:
        libc.signal(int(signum), action)
