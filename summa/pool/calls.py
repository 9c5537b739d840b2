"""The calls made on the pool (:mod:`summa.pool`): a multiply
(:func:`matmul`) and a :class:`summa.Matmul` kept in the workers
(:class:`PooledMatmul`), their arrays checked here, shipped to the workers
(shared memory, or read where they lie: :mod:`summa.host.remote`) and the
answer waited for, Ctrl-C held until the workers are ended. The pool's
processes are :mod:`summa.pool.launch`."""

from __future__ import annotations

import contextlib
import signal
import threading
import time
import warnings
from dataclasses import dataclass, field

import numpy as np

from ..host import shared as host, remote
from ..options import current as current_options
from ..planning.checks import check_arrays
from ..device.base import resolve_dtype
from ..device.numpy_backend import NumpyBackend
from ..device.traits import traits
from .launch import Pool, get_pool, slot
from ..runtime.cleanup import finalize, raises_ctrl_c
from ..runtime.progress import relay_for


@contextlib.contextmanager
def _ctrl_c_as_flag():
    """Within: Ctrl-C sets the Event yielded, which the pool's wait raises
    KeyboardInterrupt from; after, a Ctrl-C that came raises it here. Python
    raises a signal's exception in whatever code runs next, and in a
    finalizer it is printed and lost ("Exception ignored in: <finalize
    object>", a mapped file's in :mod:`summa.host.filemaps`): a caller
    looping over calls then went on waiting for good (a CI run of
    test_pool's Ctrl-C test). Only in the main thread with Python's own
    handler in place, or summa's (:func:`summa.runtime.cleanup.raises_ctrl_c`;
    a handler of the caller's is left alone), which is put back after."""
    handler = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or not raises_ctrl_c(handler):
        yield None
        return
    hit = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: hit.set())
    try:
        yield hit
    finally:
        signal.signal(signal.SIGINT, handler)
    if hit.is_set():
        raise KeyboardInterrupt


def matmul(a, b, size: int, out=None, **options):
    """``op(a) @ op(b)`` on a pool of `size` workers (see the module)."""
    a, b = _as_arrays(a, b)
    m, n, k, dtype = _checked(a, b, out, options)
    # The workers start (Python, MPI, CUDA) while the arrays are made ready.
    pool = get_pool(size, _warm_backend(options))
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
        pool = get_pool(self._size, _warm_backend(self._options))
        self._id = next(slot.ids)
        call = _Call("open", self._a, self._b, None, None, dtype, self._options,
                     {"id": self._id})
        record, _, timing = _ask(pool, call, _may_reach(pool, self._options, (m, n, k)))
        # the executions ship the operands as the plan was made for (read in
        # this process: out of core), or copies where the workers may not read
        self._pool, self._reach = pool, timing["pool_reads_caller"]
        # dropped unfreed: the workers free it before their next command
        self._finalizer = finalize(self, pool.released.append, self._id)
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
        if slot.pool is not self._pool:
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
        if slot.pool is pool:
            pool.released.append(self._id)  # freed before the command, which waits for it
            _command(pool, "free")


def _as_arrays(a, b) -> tuple:
    """`a` and `b` as NumPy arrays: as they are where they are (a shared
    array's view would lose its name)."""
    return tuple(x if isinstance(x, np.ndarray) else np.asarray(x) for x in (a, b))


def _checked(a, b, out, options: dict) -> tuple:
    """``(m, n, k, dtype)`` of ``op(a) @ op(b)`` into `out` with `options`'
    ops, checked here (ValueError) before anything is shipped."""
    trans = [str(options.get(f"trans_{x}", "N")).upper() for x in "ab"]
    meta = check_arrays(a, b, out, *trans, dtype_checker(options.get("backend", "auto")))
    if isinstance(meta, str):
        raise ValueError(meta)
    return meta


def dtype_checker(backend):
    """What checks a dtype on the pool's owner for workers of `backend`: the
    NumPy backend where they use NumPy, else :class:`_AnyDtype` (no GPU
    library loaded here: the workers' backend checks it again)."""
    return NumpyBackend() if traits(backend).cpu_only else _AnyDtype()


def _warm_backend(options: dict) -> str:
    """The backend a pool launched for a call with `options` gets ready."""
    return "numpy" if traits(options.get("backend", "auto")).cpu_only else "auto"


def _may_reach(pool: Pool, options: dict, shape) -> bool:
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


def _ask(pool: Pool, call: _Call, reach: bool) -> tuple:
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
            relay = relay_for(current_options())  # the workers' line, drawn here
            try:
                with _ctrl_c_as_flag() as interrupted:
                    record = pool.run(call.kind, _spec(call, parts, reach, relay), interrupted,
                                      relay)
            finally:
                if relay is not None:
                    relay.close()
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


def _spec(call: _Call, parts: list, reach: bool, relay=None) -> dict:
    """What the workers are told of `call`, its arrays shipped as `parts`
    (:func:`_operands`; of A and B their :func:`_rows_array`): with
    `reach`, the multiply told to go out of core (it reads this process's
    arrays only through its copies); this process's settings; whether to
    send their progress (where a `relay` draws it)."""
    (rows_a, flip_a), (rows_b, flip_b) = _rows_array(call.a), _rows_array(call.b)
    return dict(call.fields, a=parts[0], a_shape=rows_a.shape, a_transposed=flip_a,
                b=parts[1], b_shape=rows_b.shape, b_transposed=flip_b, c=parts[2],
                c_shape=call.shape, dtype=np.dtype(call.dtype).str,
                options=dict(call.options, **({"out_of_core": True} if reach else {})),
                settings=current_options().to_json(),
                progress="send" if relay is not None else None)


def _command(pool: Pool, kind: str) -> dict:
    """A command that ships no arrays (``"free"``) on `pool`'s workers, waited
    for; its record. A failure ends the pool first."""
    try:
        with _ctrl_c_as_flag() as interrupted:
            return pool.run(kind, {"settings": current_options().to_json()}, interrupted)
    except BaseException:  # a raise, a death, Ctrl-C: no worker is left running
        _end(pool)
        raise


def _end(pool: Pool) -> None:
    """End `pool` after a failure: the next call starts a new one."""
    if slot.pool is pool:
        slot.pool = None
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
        return resolve_dtype(dtype)
