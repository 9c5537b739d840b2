"""Progress shown while a job runs.

:class:`JobProgress` is one line for a whole job of one or many
ranks: the phase, the bytes or flops every rank has done, the rate and the
time left, drawn by rank 0 (:class:`Display`) or sent to the pool's caller,
which draws it. The ranks add what they do to a :class:`Tally` held by rank
0, one-sided: nothing on the GEMM path waits for another rank."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time

import numpy as np

from .mpi import MPI

__all__ = ["JobProgress", "Tally", "Display", "Relay", "PHASES", "remaining",
           "display_mode", "reporting", "active", "relay_for"]


#: A job's phases, each one slot of the :class:`Tally` (``summa bench``
#: names its own: its generation, each run, its check).
PHASES = ("read", "multiply", "check", "write")
#: Processes whose stderr a rank's stderr is forwarded to (MPICH's hydra,
#: Open MPI's prte/orte, Slurm's step daemon).
_LAUNCHERS = ("mpiexec", "mpiexec.hydra", "mpirun", "hydra_pmi_proxy", "orted", "prted",
              "prterun", "orterun", "srun", "slurmstepd")


def _stderr_of(pid: int) -> tuple[str, str]:
    """``(name, where its stderr goes)`` of process `pid` (Linux /proc)."""
    with open(f"/proc/{pid}/comm") as fh:
        name = fh.read().strip()
    return name, os.readlink(f"/proc/{pid}/fd/2")


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as fh:
        return int(fh.read().rsplit(")", 1)[1].split()[1])


def launcher_on_terminal() -> bool:
    """Does this rank's stderr reach a terminal through its MPI launcher?
    A launched rank writes into a pipe its launcher forwards; the launcher
    (the first of its line not forwarding a pipe) may write to a terminal."""
    try:
        pid = _parent(os.getpid())
        for _ in range(4):  # rank -> proxy -> launcher, with a step to spare
            name, target = _stderr_of(pid)
            if name not in _LAUNCHERS:
                return False
            if target.startswith(("/dev/pts/", "/dev/tty")):
                return True
            pid = _parent(pid)
    except (OSError, ValueError, IndexError):
        pass
    return False


def _on_terminal(stream) -> bool:
    if getattr(stream, "isatty", lambda: False)():
        return True
    # a notebook's stderr redraws a line that ends in a carriage return
    return stream is sys.stderr and "ipykernel" in sys.modules or \
        stream is sys.stderr and launcher_on_terminal()


def display_mode(setting: str, stream=None) -> str:
    """``"bar"``, ``"lines"`` or ``"off"``: what the ``SUMMA_PROGRESS``
    `setting` means for `stream` (default stderr): auto is a bar on a
    terminal (this process's, or its launcher's), lines elsewhere."""
    if setting != "auto":
        return setting
    return "bar" if _on_terminal(sys.stderr if stream is None else stream) else "lines"


def remaining(done: float, total: float, elapsed: float, predicted: float | None):
    """Seconds a phase has left, or None where nothing tells.

    The plan's `predicted` seconds for the phase until the first counts
    come; then what the rate so far gives for the rest, blended with the
    prediction's rest while little has run (a first panel bears the
    start's costs) and alone from a quarter of the work on."""
    left_predicted = None if not predicted else max(0.0, predicted - elapsed)
    if done <= 0 or total <= 0 or elapsed <= 0:
        return left_predicted
    fraction = min(1.0, done / total)
    measured = elapsed * (1 - fraction) / fraction
    if left_predicted is None:
        return measured
    trust = min(1.0, fraction / 0.25)
    return trust * measured + (1 - trust) * left_predicted


def _amount(value: float, unit: str) -> str:
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.1f} {prefix}{unit}"
    return f"{value:.0f} {unit}"


def _seconds(s: float) -> str:
    s = int(round(s))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else \
        f"{s // 60}:{s % 60:02d}"


def progress_line(phase: dict, done: float, elapsed: float) -> str:
    """The line of `phase` (``name``, ``total``, ``unit``, ``predicted``)
    with `done` of its total after `elapsed` seconds."""
    total, unit = phase["total"], phase["unit"]
    parts = [f"summa: {phase['name']}"]
    if total > 0:
        parts[0] += f" {100 * min(done, total) / total:3.0f}%"
        parts.append(f"{_amount(done, unit)} of {_amount(total, unit)}")
        if elapsed > 0 and done > 0:
            parts.append(f"{_amount(done / elapsed, unit)}/s")
    parts.append(f"{_seconds(elapsed)} elapsed")
    left = remaining(done, total, elapsed, phase.get("predicted"))
    if left is not None:
        parts.append(f"ETA {_seconds(left)}")
    return ", ".join(parts)


class Display:
    """Draws one job's progress line on `stream`: a bar redrawn in place
    (``mode="bar"``, a few times a second) or plain lines (``"lines"``:
    once a phase has run a second, then every `interval` seconds, and where
    one was written, the phase's end). A thread draws, so the line moves
    while the caller sits in a long GEMM.

    Parameters
    ----------
    mode : {"bar", "lines"}
    interval : float
        Seconds between plain lines.
    stream : file, optional
        Default stderr.
    after : float, optional
        Seconds a phase runs before anything of it is drawn (a library
        call's: its short products leave a notebook's or a test's stderr
        as it was); default 0, from the start.
    """

    def __init__(self, mode: str, interval: float, stream=None, after: float = 0.0):
        self.mode, self.interval, self.after = mode, float(interval), float(after)
        self.stream = sys.stderr if stream is None else stream
        self._phase, self._read, self._began = None, None, 0.0
        self._written, self._width, self._next = 0, 0, 0.0
        self._lock, self._stop = threading.Lock(), threading.Event()
        self._thread = threading.Thread(target=self._run, name="summa-progress", daemon=True)
        self._thread.start()

    def begin(self, phase: dict, read) -> None:
        """Show `phase` (``name``, ``total``, ``unit``, ``predicted``),
        whose amount done `read()` tells, from now (ending the last one)."""
        with self._lock:
            self._end()
            self._phase, self._read, self._began = phase, read, time.perf_counter()
            self._written = 0
            self._next = self._began + max(self.after, min(1.0, self.interval))

    def close(self) -> None:
        """End the last phase and stop drawing."""
        self._stop.set()
        self._thread.join()
        with self._lock:
            self._end()

    def _run(self) -> None:
        tick = 0.2 if self.mode == "bar" else min(0.2, self.interval / 2)
        while not self._stop.wait(tick):
            with self._lock:
                if self._phase is not None:
                    self._draw(time.perf_counter())

    def _draw(self, now: float) -> None:
        if now < (self._next if self.mode == "lines" else self._began + self.after):
            return
        line = progress_line(self._phase, self._read(), now - self._began)
        if self.mode == "bar":
            self._write("\r" + line.ljust(self._width))
            self._width = len(line)
        else:
            self._write(line + "\n")
            self._next = now + self.interval
        self._written += 1

    def _end(self) -> None:
        """The last phase's end: its bar wiped, or a last line where one was written."""
        if self._phase is None:
            return
        if self.mode == "bar" and self._width:
            self._write("\r" + " " * self._width + "\r")
            self._width = 0
        elif self.mode == "lines" and self._written:
            elapsed = time.perf_counter() - self._began
            # (a phase of no counted amount, as a check: its time alone)
            amount = f", {_amount(self._read(), self._phase['unit'])}" \
                if self._phase["total"] > 0 else ""
            self._write(f"summa: {self._phase['name']} done, {_seconds(elapsed)}{amount}\n")
        self._phase = None

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # a closed or broken stderr: progress is not the job
            pass


class Tally:
    """What every rank of `comm` has done in each of `slots` phases, held by
    rank 0.

    Each rank adds its amounts one-sided (``MPI_Accumulate`` into rank 0's
    window under a shared lock): no rank waits for another. Rank 0 keeps
    its own amounts apart, so that only its reader locks the window.
    Making and freeing it are collective.
    """

    def __init__(self, comm, slots: int = len(PHASES)):
        self.comm, self.rank = comm, comm.Get_rank()
        self.own = np.zeros(slots)
        self._one = np.zeros(1)
        self.win = None
        if comm.Get_size() > 1:
            self.win = MPI.Win.Allocate(self.own.nbytes if self.rank == 0 else 0,
                                        self.own.itemsize, comm=comm)
            if self.rank == 0:
                np.frombuffer(self.win.tomemory(), dtype=self.own.dtype)[:] = 0
        self._unified = self.win is not None and \
            self.win.Get_attr(MPI.WIN_MODEL) == MPI.WIN_UNIFIED

    def add(self, slot: int, amount: float) -> None:
        """Add `amount` to the count of phase `slot`."""
        if self.rank == 0 or self.win is None:
            self.own[slot] += amount
            return
        self._one[0] = amount
        self.win.Lock(0, MPI.LOCK_SHARED)
        self.win.Accumulate(self._one, 0, target=(slot, 1, MPI.DOUBLE), op=MPI.SUM)
        self.win.Unlock(0)

    def read(self) -> np.ndarray:
        """Rank 0: every rank's counts so far, per phase."""
        if self.win is None:
            return self.own.copy()
        if self._unified:
            # read where the accumulates land, no MPI call: this runs on the
            # drawing thread, and an MPI without MPI_THREAD_MULTIPLE must not
            # be called from two threads (aligned doubles are read whole)
            return np.frombuffer(self.win.tomemory(), dtype=self.own.dtype) + self.own
        theirs = np.zeros(len(self.own))
        self.win.Lock(0, MPI.LOCK_SHARED)
        self.win.Get_accumulate(np.zeros(len(self.own)), theirs, 0, op=MPI.NO_OP)
        self.win.Unlock(0)
        return theirs + self.own

    def free(self) -> None:
        """Collective: the window goes."""
        if self.win is not None:
            self.win.Free()
            self.win = None


class JobProgress:
    """One progress line for a job of every rank of `comm`; made collectively,
    the same `shown` on every rank.

    Each rank says when a phase starts and its own amount of it
    (:meth:`phase`), then what it has done (:meth:`step`, the executors'
    ``progress(done, steps)`` callback, or :meth:`add`); rank 0 says what
    the whole phase is. Rank 0 draws (`display`) or, in a pool's worker,
    hands the state to `send` (a few times a second, from the calling
    thread: the worker's answers share its connection).

    Parameters
    ----------
    comm : MPI.Comm
    shown : bool
        False: nothing is counted or shown, and no window made.
    display : Display, optional
        Rank 0's.
    send : callable, optional
        Rank 0's, in a pool's worker: gets ``{"phase": ..., "done": ...}``.
    phases : tuple of str, optional
        The names :meth:`phase` takes, the same on every rank (default
        :data:`PHASES`).
    """

    #: Seconds between two states sent to the pool's caller.
    SEND_EVERY = 0.25

    def __init__(self, comm, shown: bool, display: Display | None = None, send=None,
                 phases: tuple = PHASES):
        self.shown, self.phases = shown, tuple(phases)
        self.tally = Tally(comm, len(self.phases)) if shown else None
        self.rank = comm.Get_rank()
        self.display, self.send = (display, send) if self.rank == 0 else (None, None)
        self._name, self._mine, self._posted, self._phase = None, 0.0, 0.0, None
        self._sent = 0.0

    def phase(self, name: str, mine: float, total: float = 0.0, unit: str = "",
              predicted: float | None = None) -> None:
        """This rank starts `name`, doing `mine` of it; on rank 0, the whole
        of it is `total` `unit` (bytes ``"B"``, ``"flop"``), `predicted`
        seconds by the plan (None: no prediction)."""
        if not self.shown:
            return
        self._name, self._mine, self._posted = name, float(mine), 0.0
        if self.rank != 0:
            return
        self._phase = dict(name=name, total=float(total), unit=unit, predicted=predicted)
        slot = self.phases.index(name)
        if self.display is not None:
            self.display.begin(self._phase, lambda: float(self.tally.read()[slot]))
        self._forward(force=True)

    def step(self, done: int, steps: int) -> None:
        """This rank has done `done` of its `steps` in the current phase."""
        if self.shown and self._name is not None and steps:
            self.add(self._mine * min(done, steps) / steps - self._posted)

    def add(self, amount: float) -> None:
        """This rank has done `amount` more of the current phase."""
        if not self.shown or self._name is None or amount <= 0:
            return
        self._posted += amount
        self.tally.add(self.phases.index(self._name), amount)
        self._forward()

    def _forward(self, force: bool = False) -> None:
        now = time.perf_counter()
        if self.send is None or not force and now - self._sent < self.SEND_EVERY:
            return
        self._sent = now
        slot = self.phases.index(self._phase["name"])
        self.send(dict(self._phase, done=float(self.tally.read()[slot])))

    def close(self) -> None:
        """Collective where shown: the last state sent, the line ended, the
        tally freed."""
        if not self.shown:
            return
        self.tally.comm.Barrier()  # every rank's last amount is in: the last line is whole
        if self._phase is not None:
            self._forward(force=True)
        self.stop()
        self.tally.free()
        self.shown = False

    def stop(self) -> None:
        """This rank alone: the line ended (where a rank failed, the others
        may never free the tally with it; the job ends anyway)."""
        if self.display is not None:
            self.display.close()
            self.display = None


#: The JobProgress of the job running in this process, innermost last
#: (:func:`reporting`): the pool's worker sets one around a multiply that
#: the array entry points run without knowing of it.
_active: list = []


@contextlib.contextmanager
def reporting(job: JobProgress):
    """Within, :func:`active` is `job`."""
    _active.append(job)
    try:
        yield job
    finally:
        _active.pop()


def active() -> JobProgress | None:
    """The JobProgress a caller set around this call, if any."""
    return _active[-1] if _active else None


class Relay:
    """The pool's caller's side of a job's line: the states its worker
    rank 0 sends (:class:`JobProgress` with ``send``), drawn by `display`."""

    def __init__(self, display: Display):
        self.display, self._name, self._done = display, None, 0.0

    def __call__(self, state: dict) -> None:
        self._done = state["done"]
        if state["name"] != self._name:
            self._name = state["name"]
            phase = {key: state[key] for key in ("name", "total", "unit", "predicted")}
            self.display.begin(phase, lambda: self._done)

    def close(self) -> None:
        self.display.close()


def relay_for(options) -> Relay | None:
    """The pool's caller's side of a command's line: a Relay drawing on its
    stderr, or None where `options` (:class:`summa.options.Options`) turn
    it off."""
    mode = display_mode(options.progress)
    return None if mode == "off" else Relay(Display(mode, options.progress_interval))
