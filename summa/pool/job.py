"""An MPI job that a plain process launches and ends: the pool's workers
(:mod:`summa.pool.launch`) and ``python -m summa multiply`` run without
mpirun (:mod:`summa.__main__`), whose process stays the job's parent.

The job starts with SIGINT and SIGTERM blocked, which its launcher and its
ranks inherit: a rank takes them only once it can clean up after itself
(:func:`summa.runtime.watchdog.handle_signals` unblocks them), not in its
start, where Python's default action ended it with MPI's shared memory
made and the launcher printed "BAD TERMINATION" for it. A stop passes the
signal to every rank and waits for them; a job that does not end in time
is frozen, the MPI files its processes hold are noted, it is killed (its
launcher first: dead, it reports nothing) and the files are removed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

from ..host import shared as host
from ..runtime.cleanup import (cuda_ipc_files, descendants, held_segments, process_alive,
                               remove_segments)

#: Signals the job's processes start with blocked, and that stop a job run
#: in this process's place (:func:`run`; SIGHUP too, as a closed terminal's).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)

#: Seconds a stopped job's ranks have to end by themselves: one still
#: starting reaches its signal handling after Python's, summa's and MPI's
#: start (about a second on the 2-core CI machines).
STOP_GRACE = 3.0


def launch(command: list[str], env: dict) -> subprocess.Popen:
    """Start `command` (a launcher and its ranks) in a session of its own
    (a terminal's Ctrl-C reaches this process only, which stops the job),
    with :data:`STOP_SIGNALS` blocked in it and in what it starts."""
    held = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        return subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def stop(proc: subprocess.Popen, ranks=(), signum: int = signal.SIGTERM,
         grace: float = STOP_GRACE) -> list[int]:
    """End the job whose launcher is `proc`: `signum` to every process
    below it (`ranks` too, pids known to be its ranks), which each rank
    takes once it can clean up (its launcher and proxies hold it blocked),
    and up to `grace` seconds for all to end; what still runs is killed
    (:func:`kill`). Returns the pids of every process of the job seen, whose
    shared files the caller removes (:func:`summa.host.shared.remove_files_of`)."""
    seen = set(ranks) | set(descendants(proc.pid))
    for pid in seen:
        try:
            os.kill(pid, signum)
        except OSError:
            pass
    deadline = time.monotonic() + grace
    while (proc.poll() is None or any(process_alive(p) for p in seen)) and \
            time.monotonic() < deadline:
        time.sleep(0.01)
    if proc.poll() is None or any(process_alive(p) for p in seen):
        seen.update(kill(proc))
    proc.wait()
    for pid in seen:
        host.remove_files_of(pid)
    return sorted(seen)


def kill(proc: subprocess.Popen) -> list[int]:
    """Kill the job of launcher `proc` and remove the MPI files its processes
    held: all are stopped first (SIGSTOP, the launcher before what it
    starts), so that none makes a file after they are read; then killed,
    the launcher first (it would report its ranks' deaths). Returns the
    pids killed."""
    frozen: list[int] = []
    while True:
        new = [p for p in [proc.pid, *descendants(proc.pid)] if p not in frozen]
        if not new:
            break
        for pid in new:
            _signal(pid, signal.SIGSTOP)
            frozen.append(pid)
    _wait_stopped(frozen)
    files = {path for pid in frozen for path in held_segments(pid) + cuda_ipc_files(pid)}
    for pid in frozen:
        _signal(pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 5  # killed is not yet gone: its maps go with it
    while any(process_alive(p) for p in frozen) and time.monotonic() < deadline:
        time.sleep(0.01)
    remove_segments(files)
    return frozen


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except OSError:
        pass


def _wait_stopped(pids, seconds: float = 1.0) -> None:
    """Wait (up to `seconds`) until each of `pids` is stopped or gone: a
    signal is delivered on the process's next run, not on the call."""
    deadline = time.monotonic() + seconds
    for pid in pids:
        while _state(pid) not in ("T", "t", "Z", "X", "") and time.monotonic() < deadline:
            time.sleep(0.001)


def _state(pid: int) -> str:
    """Process `pid`'s state letter (/proc), "" where it has gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def run(command: list[str], env: dict) -> int:
    """Run the job `command` to its end in this process's place (as if it
    were its launcher): SIGINT, SIGTERM or SIGHUP to this process stops it
    (:func:`stop`, SIGHUP passed on as SIGTERM). Returns its exit status,
    128 + the signal's number where a signal ended it or stopped it."""
    received: list[int] = []
    caught = (*STOP_SIGNALS, signal.SIGHUP)
    previous = {s: signal.signal(s, lambda signum, frame: received.append(signum))
                for s in caught}
    try:
        proc = launch(command, env)
        while proc.poll() is None and not received:
            time.sleep(0.02)
        if received:
            signum = received[0]
            stop(proc, signum=signal.SIGTERM if signum == signal.SIGHUP else signum)
            return 128 + signum
        return proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
