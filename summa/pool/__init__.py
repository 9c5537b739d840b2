"""Every GPU from one plain Python process: a pool of MPI workers it starts.

``summa.matmul(a, b)`` in a script or notebook that no MPI launcher started
(a world of one rank) runs on every visible GPU: the process starts the
workers as an ordinary MPI job of the MPI mpi4py was built with (its
``mpiexec``, or ``MPIEXEC``; :mod:`summa.pool.worker`), one rank per GPU, keeps it
between calls and stops it at exit. The arrays reach the workers through
shared memory (:func:`summa.host.shared.named`: copied once on host threads, not at
all where they were made with :func:`summa.host.empty` without a
communicator), and the product comes back as one too.

A :class:`summa.Matmul` made in such a process lives in the workers
(:class:`PooledMatmul`): they plan it once and keep its process grid, with
what that holds, between its executions, until it is freed.

The calling process is no rank and needs no MPI: it sends each command over
a local socket and then only waits, so it can never be caught in a
collective that a dead worker will not join. (``MPI.COMM_SELF.Spawn`` was
tried first: with MPICH a worker that fails takes the spawning process down
with it.) A worker that raises or dies ends the call with one exception
naming the rank and the cause (a worker that died, where one did, rather
than the MPI error its death left the others); the job is then ended and the next call
starts a new pool; SUMMA_TIMEOUT seconds without an answer does the same.
Ctrl-C raises KeyboardInterrupt once the job is ended (a second or so). The
workers wait for a call asleep, each on its socket (no CPU while idle), and
end by themselves, removing what their owner left in shared memory, when the
owner is killed. Under a launcher (a world of several ranks) nothing is
started.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import itertools
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
import weakref
from dataclasses import dataclass, field

import numpy as np

from ..host import shared as host, remote
from ..runtime.cleanup import process_alive
from ..options import current as current_options
from ..device.traits import traits

__all__ = ["WorkerError", "pool_size", "launched", "matmul", "PooledMatmul", "start", "close"]


class WorkerError(RuntimeError):
    """A worker of the pool failed (raised, died, or did not answer)."""


#: Environment variables a launcher sets in every rank it starts.
_LAUNCHER_VARIABLES = ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE",
                       "MPI_LOCALNRANKS", "SLURM_STEP_ID", "HYDI_CONTROL_FD")


def launched() -> bool:
    """Was this process started by an MPI launcher (mpirun, srun, a pool)?"""
    return any(v in os.environ for v in _LAUNCHER_VARIABLES)


def pool_size(gpus=None, workers=None, use_gpus: bool = True) -> int:
    """Workers a plain process's multiply runs on: `gpus` (``SUMMA_GPUS``),
    else every visible GPU; on a machine without one (or not `use_gpus`:
    the NumPy backend asked for) `workers` (``SUMMA_WORKERS``), else one per
    8 cores (a NumPy rank's BLAS threads scale to about that). 1 means: no
    pool, multiply in this process."""
    settings = current_options()
    for value in (gpus, workers, settings.gpus, settings.workers):
        if value not in (None, ""):
            count = int(value)
            if count < 1:
                raise ValueError(f"a pool needs at least one worker, not {count}")
            return count
    from ..device.backend import cupy_available
    if use_gpus and cupy_available():
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
    the speed of twelve)."""
    from mpi4py import MPI
    if not MPI.Get_library_version().startswith("Open MPI") or \
            any(a.lstrip("-") in ("bind-to", "bind-to-core", "bind-to-socket") or
                a.startswith("--bind-to=") for a in command[1:]):
        return command
    return command[:1] + ["--bind-to", "none"] + command[1:]


class _Pool:
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
        env = dict(os.environ, SUMMA_POOL_KEY=key.hex(), SUMMA_POOL_WARM=warm)
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")  # Open MPI as root (containers)
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        try:
            self.proc = subprocess.Popen(
                mpiexec_command() + ["-n", str(size), sys.executable, "-m", "summa.pool.worker",
                              self._listener.address, str(os.getpid())],
                env=env, stdin=subprocess.DEVNULL, start_new_session=True)
        except BaseException:  # Ctrl-C or no launcher: no folder left behind
            self._listener.close()
            shutil.rmtree(self._folder, ignore_errors=True)
            raise
        self.conns: dict[int, object] = {}
        self.pids: dict[int, int] = {}
        #: each worker's launcher process (hydra's proxy), MPI's shared memory files
        self.parents: set[int] = set()
        self.segments: set[str] = set()
        #: ids of the Matmuls kept in these workers (:class:`PooledMatmul`) whose
        #: owners were dropped unfreed (a finalizer adds them, at any moment):
        #: the workers free them before the next command, which carries them
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

    def run(self, kind: str, spec: dict, interrupted=None) -> dict:
        """One command on every worker (`kind`: ``"matmul"``, ``"open"``,
        ``"execute"``, ``"free"``; :mod:`summa.pool.worker`); rank 0's
        record (None: they cannot read this process's arrays,
        :mod:`summa.host.remote`), or raise (KeyboardInterrupt once
        `interrupted`, an Event, is set)."""
        from multiprocessing.connection import wait
        from ..runtime.watchdog import timeout_from_env
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

        The launcher is asked first (SIGTERM: it passes the signal on, each
        worker removes MPI's shared memory and exits, and it reaps its
        proxies, which a killed launcher leaves as zombies); whatever still
        runs a second later is killed, and this process removes the files the
        workers could not."""
        from ..runtime.cleanup import remove_segments
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=1.0)
        except (OSError, subprocess.TimeoutExpired):
            pass
        workers = [*self.pids.values(), *self.parents]
        if self.proc.poll() is None or any(process_alive(pid) for pid in workers):
            for pid in [-self.proc.pid, *workers]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        self.proc.wait()
        deadline = time.monotonic() + 5  # killed is not yet gone: wait until they are
        while any(process_alive(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.01)
        remove_segments(self.segments)
        for pid in self.pids.values():
            host.remove_files_of(pid)
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
    pool : _Pool or None
        The running pool, if any.
    ids : itertools.count
        The ids of the Matmuls opened in its pools (:class:`PooledMatmul`).
    """

    def __init__(self):
        self.pool: _Pool | None = None
        self.ids = itertools.count(1)


_slot = _Slot()


def _get(size: int, warm: str = "auto") -> _Pool:
    """The pool of `size` workers: this process's, or one launched now (not
    yet connected: its workers start while the caller prepares the arrays)."""
    if _slot.pool is not None and _slot.pool.size != size:
        close()
    if _slot.pool is None:
        _slot.pool = _Pool(size, warm)
    return _slot.pool


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
        _get(size, "numpy" if cpu_only else "auto")
    return size


def close() -> None:
    """Stop the pool's workers (at exit; also after a failure, by killing them)."""
    pool, _slot.pool = _slot.pool, None
    if pool is not None:
        try:
            pool.stop()
        except Exception:  # noqa: BLE001 -- a broken pool is killed instead
            pool.kill()


atexit.register(close)


@contextlib.contextmanager
def _ctrl_c_as_flag():
    """Within: Ctrl-C sets the Event yielded, which the pool's wait raises
    KeyboardInterrupt from; after, a Ctrl-C that came raises it here. Python
    raises a signal's exception in whatever code runs next, and in a
    finalizer it is printed and lost ("Exception ignored in: <finalize
    object>", a mapped file's in :mod:`summa.host.filemaps`): a caller
    looping over calls then went on waiting for good (a CI run of
    test_pool's Ctrl-C test). Only in the main thread with Python's own
    handler in place (a handler of the caller's is left alone)."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield None
        return
    hit = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: hit.set())
    try:
        yield hit
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if hit.is_set():
        raise KeyboardInterrupt


def matmul(a, b, size: int, out=None, **options):
    """``op(a) @ op(b)`` on a pool of `size` workers (see the module)."""
    a, b = _as_arrays(a, b)
    m, n, k, dtype = _checked(a, b, out, options)
    # The workers start (Python, MPI, CUDA) while the arrays are made ready.
    pool = _get(size, _warm_backend(options))
    stats = options.pop("stats", None)
    call = _Call("matmul", a, b, out, (m, n), dtype, options)
    record, result, timing = _ask(pool, call, _may_reach(pool, options, (m, n, k)))
    return _delivered(record, result, out, stats, timing)


class PooledMatmul:
    """The owner's side of a :class:`summa.Matmul` kept in the pool's workers.

    Opening ships the operands (as :func:`matmul` does) and the options; the
    workers make their Matmul over all of them (its Plan, process grid,
    broadcasters, page-locked rings and device memory, kept between
    executions) under a new id, and rank 0 answers with the Plan. Each
    :meth:`execute` ships the operands again (their values may have changed)
    and runs that Matmul. A pool that stopped since (a worker failed, Ctrl-C,
    a call asked for another size) took it along: it is opened again, with
    the operands it was opened with and in the same mode (in memory or out
    of core), in this process's pool. :meth:`free`
    frees it in the workers; one dropped unfreed is freed there before their
    next command, and every one when the pool stops or this process ends.

    Parameters
    ----------
    a, b : numpy.ndarray
        The operands, in host memory.
    size : int
        Workers of the pool.
    **options
        Those of :class:`summa.Matmul` (``backend``, ``grid``,
        ``out_of_core``, ``device_memory``, ``alpha``, ``trans_a`` ...).

    Attributes
    ----------
    plan : summa.planning.Plan
        The Plan the workers made, and run at each :meth:`execute`.
    """

    def __init__(self, a, b, size: int, **options):
        self._a, self._b = _as_arrays(a, b)
        self._meta = _checked(self._a, self._b, None, options)  # bad input: before any launch
        self._size, self._options = size, options
        self._pool = self._id = self._finalizer = None
        self._reach = False
        self.plan = self._open()

    def _open(self):
        """Open this Matmul in this process's pool (launched where there is
        none of its size): its Plan."""
        m, n, k, dtype = self._meta
        pool = _get(self._size, _warm_backend(self._options))
        self._id = next(_slot.ids)
        call = _Call("open", self._a, self._b, None, None, dtype, self._options,
                     {"id": self._id})
        record, _, timing = _ask(pool, call, _may_reach(pool, self._options, (m, n, k)))
        # the executions ship the operands as the plan was made for (read in
        # this process: out of core), or copies where the workers may not read
        self._pool, self._reach = pool, timing["pool_reads_caller"]
        # dropped unfreed: the workers free it before their next command
        self._finalizer = weakref.finalize(self, pool.released.append, self._id)
        return record["plan"]

    def execute(self, a=None, b=None, out=None, stats=None):
        """``op(a) @ op(b)`` by the workers' Matmul: of the operands it was
        opened with where neither `a` nor `b` is given (others of the planned
        shapes and dtype: the caller checks them), into `out` where given,
        else a new array, returned as :func:`matmul` returns it; `stats` (a
        SummaStats) gets the workers' record."""
        if self._pool is None:
            raise RuntimeError("this Matmul was freed")
        a, b = (self._a, self._b) if a is None and b is None else _as_arrays(a, b)
        m, n, _, dtype = _checked(a, b, out, self._options)
        if _slot.pool is not self._pool:
            self._reopen()
        call = _Call("execute", a, b, out, (m, n), dtype, self._options, {"id": self._id})
        record, result, timing = _ask(self._pool, call,
                                      self._reach and self._pool.remote is not False)
        return _delivered(record, result, out, stats, timing)

    def _reopen(self) -> None:
        """Open this Matmul again: the pool it was opened in has stopped, and
        its Matmul with it. Where the new pool plans it otherwise (other free
        device memory), the new Plan is the one run, with a RuntimeWarning."""
        self._finalizer.detach()  # nothing left to free in the old pool
        planned = self.plan
        # in memory or out of core as before, whether or not the new pool's
        # workers may read this process (out of core where they did)
        self._options = dict(self._options, out_of_core=planned.out_of_core)
        self.plan = self._open()
        if self.plan != planned:
            warnings.warn(f"the pool started again and planned this Matmul otherwise; it runs "
                          f"the new plan:\n{self.plan}", RuntimeWarning, stacklevel=4)

    def free(self) -> None:
        """Free this Matmul in the workers (its grid, communicators,
        broadcasters), waiting for them; safe twice. Where its pool has
        stopped there is nothing left to free."""
        pool, self._pool = self._pool, None
        if pool is None:
            return
        self._finalizer.detach()
        if _slot.pool is pool:
            pool.released.append(self._id)  # freed before the command, which waits for it
            _command(pool, "free")


def _as_arrays(a, b) -> tuple:
    """`a` and `b` as NumPy arrays: as they are where they are (a shared
    array's view would lose its name)."""
    return tuple(x if isinstance(x, np.ndarray) else np.asarray(x) for x in (a, b))


def _checked(a, b, out, options: dict) -> tuple:
    """``(m, n, k, dtype)`` of ``op(a) @ op(b)`` into `out` with `options`'
    ops, checked here (ValueError) before anything is shipped."""
    from ..api.arrays import check_arrays
    trans = [str(options.get(f"trans_{x}", "N")).upper() for x in "ab"]
    meta = check_arrays(a, b, out, *trans, dtype_checker(options.get("backend", "auto")))
    if isinstance(meta, str):
        raise ValueError(meta)
    return meta


def dtype_checker(backend):
    """What checks a dtype on the pool's owner for workers of `backend`: the
    NumPy backend where they use NumPy, else :class:`_AnyDtype` (no GPU
    library loaded here: the workers' backend checks it again)."""
    from ..device.backend import NumpyBackend
    return NumpyBackend() if traits(backend).cpu_only else _AnyDtype()


def _warm_backend(options: dict) -> str:
    """The backend a pool launched for a call with `options` gets ready."""
    return "numpy" if traits(options.get("backend", "auto")).cpu_only else "auto"


def _may_reach(pool: _Pool, options: dict, shape) -> bool:
    """Do the workers read this process's arrays (a product of `shape`
    ``(m, n, k)`` with `options`)?

    They read the caller's own arrays (:mod:`summa.host.remote`) where the
    system lets them and the multiply reads them only through its copies
    (out of core, untransposed), else copies in shared memory (the first
    answer of a pool that cannot read says so, and the call is made again)."""
    return pool.remote is not False and options.get("out_of_core") is not False \
        and options.get("schedule", "panels") == "panels" and min(shape) > 0 \
        and remote.allowed()


@dataclass(frozen=True)
class _Call:
    """One command to the workers that ships arrays (:func:`_ask`).

    Attributes
    ----------
    kind : str
        ``"matmul"``, ``"open"`` or ``"execute"`` (:mod:`summa.pool.worker`).
    a, b : numpy.ndarray
    out : numpy.ndarray or None
        Where the product goes (None: a new array).
    shape : tuple or None
        ``(m, n)`` of the product; None where the command makes none.
    dtype : numpy.dtype
    options : dict
        The multiply's keyword arguments.
    fields : dict
        The command's own (a Matmul's ``id``).
    """

    kind: str
    a: np.ndarray
    b: np.ndarray
    out: np.ndarray | None
    shape: tuple | None
    dtype: object
    options: dict
    fields: dict = field(default_factory=dict)


def _ask(pool: _Pool, call: _Call, reach: bool) -> tuple:
    """Run `call` on `pool`'s workers, its arrays shipped (:func:`_operands`:
    with `reach` read in this process, else, or once the workers say they
    may not, copies), and wait for the answer; a failure (a raise, a death,
    Ctrl-C) ends the pool first. Returns ``(the record, the array the
    product lands in or None, where this process's seconds went)``."""
    began = time.perf_counter()
    if reach:
        remote.allow_readers(pool.proc.pid)  # the launcher and the workers it started
    try:
        while True:
            # (kept: the shared copies made, alive until the workers are done)
            parts, result, kept = _operands(call.a, call.b, call.out, call.shape, call.dtype,
                                            reach, touch=len(pool.conns) < pool.size)
            copied = time.perf_counter()
            pool.connect()
            connected = time.perf_counter()
            with _ctrl_c_as_flag() as interrupted:
                record = pool.run(call.kind, _spec(call, parts, reach), interrupted)
            if record is not None or not reach:
                break
            pool.remote = reach = False  # the workers cannot read this process: copies
        if reach:
            pool.remote = True
    except BaseException:  # a raise, a death, Ctrl-C: no worker is left running
        _end(pool)
        raise
    del kept
    return record, result, dict(pool_copy_seconds=copied - began,
                                pool_start_wait_seconds=connected - copied,
                                pool_run_seconds=time.perf_counter() - connected,
                                pool_reads_caller=reach)


def _spec(call: _Call, parts: list, reach: bool) -> dict:
    """What the workers are told of `call`, its arrays shipped as `parts`
    (:func:`_operands`; of A and B their :func:`_rows_array`): with
    `reach`, the multiply told to go out of core (it reads this process's
    arrays only through its copies); this process's settings."""
    (rows_a, flip_a), (rows_b, flip_b) = _rows_array(call.a), _rows_array(call.b)
    return dict(call.fields, a=parts[0], a_shape=rows_a.shape, a_transposed=flip_a,
                b=parts[1], b_shape=rows_b.shape, b_transposed=flip_b, c=parts[2],
                c_shape=call.shape, dtype=np.dtype(call.dtype).str,
                options=dict(call.options, **({"out_of_core": True} if reach else {})),
                settings=current_options().to_json())


def _command(pool: _Pool, kind: str) -> dict:
    """A command that ships no arrays (``"free"``) on `pool`'s workers, waited
    for; its record. A failure ends the pool first."""
    try:
        with _ctrl_c_as_flag() as interrupted:
            return pool.run(kind, {"settings": current_options().to_json()}, interrupted)
    except BaseException:  # a raise, a death, Ctrl-C: no worker is left running
        _end(pool)
        raise


def _end(pool: _Pool) -> None:
    """End `pool` after a failure: the next call starts a new one."""
    if _slot.pool is pool:
        _slot.pool = None
    pool.kill()


def _delivered(record: dict, result, out, stats, timing: dict):
    """The product of a call whose workers answered `record`, in `result`
    (:func:`_operands`): `out` where given (filled from `result` where the
    workers wrote elsewhere), else `result`; `stats` gets the record and
    this process's `timing`."""
    if stats is not None:
        stats.__dict__.update(record)
        stats.extra = dict(stats.extra or {}, **timing)
    if out is not None and result is not out:
        host.parallel_copy(out, result)
        return out
    if host.shared_name(result) is not None and result is not out:
        host.unlink_name(result)  # the workers have let go: only this process maps it
    return result


def _rows_array(x: np.ndarray) -> tuple:
    """``(array, transposed)``: what the workers attach of the operand `x`,
    `x` itself or, where that is C-ordered and `x` is not (a Fortran-ordered
    array, a ``.T`` view), ``x.T``, which they transpose back as a view (its
    rows are copied, never transposed: :mod:`summa.host.storage`)."""
    if not x.flags.c_contiguous and x.T.flags.c_contiguous:
        return x.T, True
    return x, False


def _operands(a, b, out, shape, dtype, reach: bool, touch: bool):
    """What the workers are told of A, B and C (a shared file's name, an
    .npy file's bytes, or where in this process; of A and B their
    :func:`_rows_array`), the array C lands in (`out`, a shared array, or
    with `reach` this process's own: with `touch`, while the workers start,
    faulted in on threads so that they write into touched pages; a warm
    pool's call would only wait for it; None where `shape` is None: no
    product), and the shared copies made, to be kept until the workers are
    done."""
    parts, kept = [], []  # kept: the shared copies, alive until the call has ended
    for x in (a, b):
        x = _rows_array(x)[0]
        where = remote.describe(x) if reach and host.shared_name(x) is None \
            and host.file_map(x) is None else None
        if where is not None:
            parts.append({"remote": where})
        else:
            kept.append(_shared(x))
            parts.append(kept[-1][1])
    if shape is None:
        return parts + [None], None, kept
    if out is not None and host.shared_name(out) is not None:
        return parts + [host.shared_name(out)], out, kept
    if reach and (out is None or out.flags.c_contiguous):
        result = out if out is not None else host.touched(shape, dtype) if touch else \
            np.empty(shape, dtype)
        return parts + [{"remote": remote.describe(result)}], result, kept
    result, name = host.named(shape, dtype)
    return parts + [name], result, kept


def _shared(x: np.ndarray):
    """`x` in a shared file: itself where it is one (a shared array, or a map
    of an .npy file, which the workers map too), else a copy (host threads)."""
    name = host.shared_name(x)
    if name is not None:
        return x, name
    mapped = host.file_map(x)
    if mapped is not None:
        return x, {"file": mapped[0], "offset": mapped[1]}
    try:
        copy, name = host.named(x.shape, x.dtype)
    except ValueError as exc:  # no room for the copy: say how to need none
        raise ValueError(f"{exc}; the workers read A and B without a copy where they are made "
                         "with summa.host.empty(shape, dtype) and filled in place, or mapped "
                         "from .npy files (np.load(path, mmap_mode='r'))") from None
    host.parallel_copy(copy, x)
    return copy, name


class _AnyDtype:
    """Dtype check of the pool's owner, which loads no GPU library: the
    workers' backend checks the dtype again."""

    @staticmethod
    def check_dtype(dtype):
        from ..device.backend import resolve_dtype
        return resolve_dtype(dtype)
