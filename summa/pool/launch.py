"""The pool's processes (:mod:`summa.pool`): the MPI job of workers that a
plain process launches, its connections (one per rank), a command run on
every worker, and how the job ends (stopped, or killed with what it held);
the process's one pool, started by its first call and stopped at exit.
The calls made on it are :mod:`summa.pool.calls`."""

from __future__ import annotations

import atexit
import collections
import itertools
import os
import secrets
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

from .job import STOP_GRACE, launch, stop
from ..runtime.cleanup import mapped_segments, process_alive, remove_segments
from ..runtime.mpi import MPI, launched
from ..runtime.watchdog import timeout_from_env
from ..options import current as current_options
from ..device import backend as device_backend  # its cupy_available looked up at each call
from ..device.traits import traits
from ..device.account import DeviceMemoryError


class WorkerError(RuntimeError):
    """A worker of the pool failed (raised, died, or did not answer)."""


def pool_size(gpus=None, workers=None, use_gpus: bool = True) -> int:
    """Workers a plain process's multiply runs on: `gpus` (``SUMMA_GPUS``),
    else every visible GPU; on a machine without one (or not `use_gpus`:
    the NumPy backend asked for) `workers` (``SUMMA_WORKERS``), else one per
    8 cores (a NumPy rank's BLAS threads scale to about that). 1 means: no
    pool, multiply in this process."""
    settings = current_options()
    for name, value in (("gpus", gpus), ("workers", workers), ("SUMMA_GPUS", settings.gpus),
                        ("SUMMA_WORKERS", settings.workers)):
        if value not in (None, ""):
            if isinstance(value, bool) or not str(value).strip().isdigit() and \
                    not isinstance(value, int):
                raise ValueError(f"{name} must be a whole number, got {value!r}")
            count = int(value)
            if count < 1:
                raise ValueError(f"a pool needs at least one worker, not {count}")
            return count
    if use_gpus and device_backend.cupy_available():
        import cupy
        return int(cupy.cuda.runtime.getDeviceCount())
    return max(1, (os.cpu_count() or 1) // 8)


def mpiexec_command() -> list[str]:
    """The launcher of the MPI that mpi4py uses: ``MPIEXEC``, else the
    ``mpiexec`` beside this Python (./run's venv with the PyPI MPICH), else
    the one on PATH; under Open MPI, told not to bind the workers (see
    :func:`_unbound`)."""
    asked = current_options().mpiexec
    if asked:
        return _unbound(shlex.split(asked))
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    found = here if os.access(here, os.X_OK) else shutil.which("mpiexec") or \
        shutil.which("mpirun")
    if not found:
        raise WorkerError("no mpiexec to start the pool's workers with; set MPIEXEC")
    return _unbound([found])


def _unbound(command: list[str]) -> list[str]:
    """`command` (a launcher and its options) with ``--bind-to none`` where
    the MPI is Open MPI and nothing about binding was said: Open MPI binds
    each rank to one core when it starts two or fewer, and a rank's host
    copies run on threads (on the H200 machine one core staged at a third of
    the speed of twelve). Asked before the pool's launch, this is where a
    plain caller's MPI starts (:func:`summa.runtime.mpi.load`: its guardian
    first)."""
    if not MPI.Get_library_version().startswith("Open MPI") or \
            any(a.lstrip("-") in ("bind-to", "bind-to-core", "bind-to-socket") or
                a.startswith("--bind-to=") for a in command[1:]):
        return command
    return command[:1] + ["--bind-to", "none"] + command[1:]


class Pool:
    """The workers' job, one connection per rank, and how to end it."""

    def __init__(self, size: int, warm: str = "auto"):
        """Launch `size` workers (they connect later: :meth:`connect`); `warm`
        is the backend they get ready while they wait (``cupy``: CUDA and
        CuPy started on each worker's GPU; ``numpy``: nothing)."""
        from multiprocessing.connection import Listener
        self.size = size
        self.remote = None  # can the workers read the caller's memory (summa.host.remote)?
        self._folder = tempfile.mkdtemp(prefix="summa-pool-")
        key = secrets.token_bytes(16)
        self._listener = Listener(os.path.join(self._folder, "socket"), family="AF_UNIX",
                                  authkey=key)
        # TMPDIR: Open MPI's launcher keeps a session folder there, which one
        # killed by kill() cannot remove; in the pool's folder, _cleanup does
        env = dict(os.environ, SUMMA_POOL_KEY=key.hex(), SUMMA_POOL_WARM=warm,
                   TMPDIR=self._folder)
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")  # Open MPI as root (containers)
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        try:
            command = mpiexec_command()  # MPI started here where not before: files made
            # with MPI's files of this process, which the workers remove should it be killed
            owner = [self._listener.address, str(os.getpid()),
                     os.pathsep.join(mapped_segments())]
            self.proc = launch(command + ["-n", str(size), sys.executable, "-m",
                                          "summa.pool.worker", *owner], env)
        except BaseException:  # Ctrl-C or no launcher: no folder left behind
            self._listener.close()
            shutil.rmtree(self._folder, ignore_errors=True)
            raise
        self.conns: dict[int, object] = {}
        self.pids: dict[int, int] = {}
        #: each worker's launcher process (hydra's proxy), MPI's shared memory files
        self.parents: set[int] = set()
        self.segments: set[str] = set()
        #: ids of the Matmuls kept in these workers (:class:`summa.pool.PooledMatmul`)
        #: whose owners were dropped unfreed (a finalizer adds them, at any
        #: moment): the workers free them before the next command, which carries them
        self.released: collections.deque = collections.deque()

    def connect(self) -> None:
        """Wait until every worker has connected (at once once they have)."""
        if len(self.conns) == self.size:
            return
        try:
            self._accept()
        except BaseException:  # Ctrl-C or a failed start: no job left behind
            self.kill()
            raise

    def _accept(self) -> None:
        """Every rank's connection, or the reason it did not come."""
        import socket
        # Accept with a timeout, so that a job that never connects is noticed
        # (multiprocessing's Listener has no public timeout).
        self._listener._listener._socket.settimeout(0.2)
        deadline = time.monotonic() + current_options().pool_start
        while len(self.conns) < self.size:
            try:
                conn = self._listener.accept()
            except (socket.timeout, TimeoutError):
                if self.proc.poll() is not None:
                    raise WorkerError(f"the pool's workers ended (status {self.proc.returncode})"
                                      " before they all connected") from None
                if time.monotonic() > deadline:
                    raise WorkerError("the pool's workers did not all start in time "
                                      "(SUMMA_POOL_START seconds)") from None
                continue
            _, rank, pid, parent, segments = conn.recv()
            self.conns[rank], self.pids[rank] = conn, pid
            self.parents.add(parent)
            self.segments.update(segments)

    def run(self, kind: str, spec: dict, interrupted=None, progress=None) -> dict:
        """One command on every worker (`kind`: ``"matmul"``, ``"open"``,
        ``"execute"``, ``"free"``; :mod:`summa.pool.worker`); rank 0's
        record (None: they cannot read this process's arrays,
        :mod:`summa.host.remote`), or raise (KeyboardInterrupt once
        `interrupted`, an Event, is set). `progress` gets the states of
        the job's progress rank 0 sends meanwhile."""
        from multiprocessing.connection import wait
        # with the workers' pids (one that fails names those it finds dead)
        # and the Matmuls to free first
        self._send((kind, spec, dict(self.pids), self._released()))
        timeout, last = timeout_from_env(), time.monotonic()
        ranks = {conn: rank for rank, conn in self.conns.items()}
        ended: list[int] = []  # ranks whose connection ended, in the order seen
        while True:
            if interrupted is not None and interrupted.is_set():
                raise KeyboardInterrupt
            open_conns = [conn for conn, rank in ranks.items() if rank not in ended]
            ready = wait(open_conns, timeout=0.05) if open_conns else time.sleep(0.05) or []
            reports = []  # the errors read together: which came first is decided on all
            for conn in ready:
                try:
                    answer = conn.recv()
                except (EOFError, OSError):
                    ended.append(ranks[conn])  # that rank ended: its error, if any, came first
                    continue
                if answer[0] == "done":
                    return answer[1]
                if answer[0] == "no-remote":  # they cannot read the caller: ask again
                    return None
                if answer[0] == "progress":
                    if progress is not None:
                        progress(answer[1])
                    continue
                reports.append(answer)
            if reports:
                raise self._failure(reports)
            if self.proc.poll() is not None or len(ended) == len(ranks):
                raise WorkerError(self._death(ended))
            if timeout and time.monotonic() - last > timeout:
                raise WorkerError(f"the pool's workers did not answer in {timeout:g} s "
                                  "(SUMMA_TIMEOUT); the pool is stopped")

    def _released(self) -> list:
        """The ids in :attr:`released`, taken off it one by one (a finalizer
        may add one meanwhile: the next command carries that)."""
        ids = []
        while self.released:
            ids.append(self.released.popleft())
        return ids

    def _failure(self, reports: list) -> Exception:
        """The exception the workers' error reports `reports` (read together)
        end the call with.

        Of them the first sent counts: one that found no other reporter dead
        (a worker reports, then ends). A peer it found dead is named first, as
        the cause: a worker killed mid-call leaves the others an MPI error,
        which one of them may report before this process sees the death. The
        report follows; a ValueError (bad input) with no death is raised as
        itself."""
        reporters = {report[1] for report in reports}
        _, rank, kind, message, detail, dead = next(
            (report for report in reports if not reporters.intersection(report[5])), reports[0])
        failed = f"worker rank {rank} failed: {kind}: {message}\n{detail}"
        if dead:
            return WorkerError(f"{self._death(dead)}\nthen {failed}")
        if kind == "ValueError":
            return ValueError(message)
        if kind == "DeviceMemoryError":  # a GPU taken by others: summa's one line
            return DeviceMemoryError(f"worker rank {rank}: {message}")
        return WorkerError(failed)

    def _send(self, command) -> None:
        """`command` to every worker: each waits for the next on its own
        socket, asleep (in an MPI broadcast they would poll, a core each)."""
        for conn in self.conns.values():
            conn.send(command)

    def _death(self, ranks=()) -> str:
        """Whom the call lost: the first of `ranks` (workers seen to end, or
        found dead by the one that failed, in that order: the launcher ends
        the others after the first), else any worker no longer running."""
        dead = list(ranks) or [r for r, pid in self.pids.items() if not process_alive(pid)]
        who = f"worker rank {dead[0]} (pid {self.pids[dead[0]]})" if dead else "a worker"
        return f"{who} died; the pool is stopped and starts anew on the next call"

    def kill(self) -> None:
        """End the workers' job now, and remove what its workers held.

        Each worker is sent SIGTERM (:func:`summa.pool.job.stop`): it removes
        MPI's shared memory and exits, one still starting once it can (its
        start holds the signal); what still runs a moment later is killed, and
        this process removes the files the workers could not."""
        connected = len(self.conns) == self.size
        stop(self.proc, self.pids.values(), grace=1.0 if connected else STOP_GRACE)
        remove_segments(self.segments)
        self._cleanup()

    def stop(self) -> None:
        """Ask the workers to end, and wait for them (briefly)."""
        try:
            self._send(("stop",))
            self.proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            self.kill()
            return
        self._cleanup()

    def _cleanup(self) -> None:
        for conn in self.conns.values():
            conn.close()
        self._listener.close()
        shutil.rmtree(self._folder, ignore_errors=True)


class _Slot:
    """Where this process's pool is held: module state, because a process has
    one pool (started by the first call, reused by the next, closed at exit
    by :func:`close`), which no caller passes along. One object whose
    attribute is set, not a name rebound with ``global``.

    Attributes
    ----------
    pool : Pool or None
        The running pool, if any.
    ids : itertools.count
        The ids of the Matmuls opened in its pools (:class:`summa.pool.PooledMatmul`).
    """

    def __init__(self):
        self.pool: Pool | None = None
        self.ids = itertools.count(1)


slot = _Slot()


def get_pool(size: int, warm: str = "auto") -> Pool:
    """The pool of `size` workers: this process's, or one launched now (not
    yet connected: its workers start while the caller prepares the arrays)."""
    if slot.pool is not None and slot.pool.size != size:
        close()
    if slot.pool is None:
        slot.pool = Pool(size, warm)
    return slot.pool


def start(gpus=None, workers=None, backend: str = "auto") -> int:
    """Start the pool's workers now, in a plain Python process, so that the
    first ``summa.matmul`` does not wait for them (Python, MPI and, on GPUs,
    CuPy and CUDA: ~1.5 s on the H200 machine); returns how many it has (1:
    none, the multiply runs in this process). The same rule as matmul's
    (:func:`pool_size`); nothing under a launcher."""
    if launched():
        return 1
    cpu_only = traits(backend).cpu_only
    size = pool_size(None if cpu_only else gpus, workers, use_gpus=not cpu_only)
    if size > 1:
        get_pool(size, "numpy" if cpu_only else "auto")
    return size


def close() -> None:
    """Stop the pool's workers (at exit; also after a failure, by killing them)."""
    pool, slot.pool = slot.pool, None
    if pool is not None:
        try:
            pool.stop()
        except Exception:  # noqa: BLE001 -- a broken pool is killed instead
            pool.kill()


atexit.register(close)
