"""The device memory account of one execution: what its Plan said it would
hold on the GPU, and what it holds.

An executor runs inside :meth:`Account.drawing`. On a GPU every allocation
CuPy makes in that time, on the executing thread, passes through the
account's allocator (:func:`cupy.cuda.using_allocator`): the operand blocks,
panels, C tiles, staging buffers, INT8 residues and sums, cuBLASLt
workspaces and CuPy's own temporaries alike, so nothing an executor takes is
left out of the count. Each draw is counted and given back when CuPy frees
it; the account keeps the high-water mark (:attr:`Account.peak`), which the
run reports beside the plan's peak (``stats.extra["device_peak"]``).

Two failures differ:

* :class:`Overdrawn`: the execution drew more than its plan's peak. That
  is summa's miscount, a bug: with ``SUMMA_MEMORY_CHECK=1`` (the test
  suites) the run raises it once it is over, on every rank, so a test
  catches it; either way the draws go on where the GPU has the room, and
  the peak says by how much.
* :class:`DeviceMemoryError`: the GPU itself had no room (another process
  took memory after the call was planned). One clear :class:`MemoryError`
  naming the GPU, what was asked, held and free, in place of CuPy's. On
  one rank of several it ends the job with that line (MPI_Abort): the
  other ranks wait for it mid-broadcast, where no rank can agree any more.

The draws come from CuPy's pool, the caller's, so that what a call gives
back (a product on the GPU) and what it frees serve the caller's own CuPy
code as any CuPy array's would. An execution whose plan differs from the
last one first has the pool give back its cached, unused blocks, so its
allocations are the ones a fresh process makes, never parts of blocks an
earlier call split (a 40960² fp64-int8 product that runs in a fresh process
ran out of memory after a dozen other calls in one process, its 12.5 GiB
draw finding no free block whole among the pool's split ones); a plan
executed again (a :class:`summa.Matmul`, the same call repeated) finds its
own blocks cached.

Memory the libraries take outside CuPy's allocator (the CUDA context,
cuBLAS's own workspace, NCCL's buffers) is not drawn here: the backend
readies them before the call is planned (:meth:`summa.device.backend.Backend.prepare`),
so the free memory the planner reads is what is left after them.

The NumPy backend's "device" is host memory: there the account counts what
Python's allocator traces (:mod:`tracemalloc`, NumPy's arrays included),
when the account is strict, so the CPU tests hold the plan's device and host
peaks together to what a run takes.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import tracemalloc

from ..runtime import cleanup

__all__ = ["Account", "Overdrawn", "DeviceMemoryError", "give_back_cached", "GIB", "SMALL_DRAWS"]

GIB = 2 ** 30

#: Host bytes a traced NumPy run may take beyond its plan: the objects
#: Python itself allocates meanwhile (the loop's, MPI's messages, the plan's
#: pickles, copy threads), which tracemalloc counts with the arrays: 3-60 KB
#: beside products of 1000 x 800 x 600 and 700 x 900 x 500 on 1, 2 and 4
#: ranks whose arrays (tracemalloc's snapshots at the peak) were the plan's
#: byte for byte, up to 0.3 MB beside the sweep's smallest out-of-core
#: products. A run that imports modules (a process's first of a path:
#: 0.5-1.3 MB more) is not judged.
TRACED_SLACK = 1 << 20

#: Device bytes a run may draw beyond its plan's peak: the scalars and
#: reductions' results CuPy makes beside the planned arrays (44-88 bytes
#: beside float64, float32 and complex128 plans of 11-23 GB on an H100,
#: benchmarks/memory_sequence.py).
SMALL_DRAWS = 1 << 20

_last_key: dict = {}  # device -> the key of the last plan whose blocks the pool caches


class Overdrawn(MemoryError):
    """An execution drew more device memory than its plan's peak: summa
    counted short (a bug, raised where the account is strict)."""


class DeviceMemoryError(MemoryError):
    """The GPU had no room for a draw within the plan: another process (or
    the caller) took memory after the call was planned."""


def give_back_cached(backend) -> None:
    """Have CuPy's pool give back the cached, unused blocks it keeps on
    `backend`'s GPU (nothing on the NumPy backend): after a run that failed
    for want of memory, so that what it held and freed counts as free for
    the plan made again (:func:`summa.execution.arrays.run_held`); the next
    account starts from the emptied pool, whatever its plan."""
    if not getattr(backend, "is_gpu", False):
        return
    with backend.xp.cuda.Device(backend.device):
        backend.xp.get_default_memory_pool().free_all_blocks()
    _last_key.pop(backend.device, None)


@contextlib.contextmanager
def _alone_or_ended(comm=None):
    """Run the block; where one rank of several fails in it for want of
    memory (a draw the GPU had no room for, NumPy's own MemoryError), end the
    job with that rank's one line: the others wait mid-multiply in
    collectives that no rank can join any more, so nothing short of the
    job's end frees them. On one rank the error is raised as it came."""
    try:
        yield
    except Overdrawn:  # (agreed over the ranks, raised by every one)
        raise
    except MemoryError as exc:
        if comm is None or comm.Get_size() == 1:
            raise
        cleanup.end_job(comm, f"summa: rank {comm.Get_rank()}: {exc} (the other ranks were "
                        "mid-multiply: aborting the job)", 1)


def _gib(nbytes: int) -> str:
    """`nbytes` for a message: GiB from 1 GiB up, else MiB."""
    if abs(nbytes) >= GIB:
        return f"{nbytes / GIB:.2f} GiB"
    return f"{nbytes / 2**20:.1f} MiB"


class _Held:
    """What one draw holds: CuPy's pointer, given back to the account (and
    CuPy's pool) when the array that drew it is freed."""

    __slots__ = ("pointer", "account", "nbytes")

    def __init__(self, pointer, account: "Account", nbytes: int):
        self.pointer, self.account, self.nbytes = pointer, account, nbytes

    def __del__(self):
        self.account._given_back(self.nbytes)


class Account:
    """Device bytes one execution may hold (its plan's peak) and holds.

    Parameters
    ----------
    budget : int
        The plan's peak on this device (bytes).
    backend : summa.device.backend.Backend
        Where the execution runs; its GPU draws go through the account.
    strict : bool
        Raise :class:`Overdrawn` once the run is over where it drew past
        `budget` (the tests); either way the draws go where the device has
        room, and :attr:`peak` says by how much.
    what : str
        What runs, for messages (``"the multiply"``).
    key : hashable, optional
        What the execution is (its plan's memory and shape): executed again
        with the same key, the pool's cached blocks serve it as they are;
        else the pool gives back its unused blocks first.

    Attributes
    ----------
    held, peak : int
        Bytes held now, and the most held at once since the account opened.
    """

    def __init__(self, budget: int, backend, strict: bool = False, what: str = "the multiply",
                 key=None):
        self.budget, self.backend, self.strict, self.what = int(budget), backend, strict, what
        self.key = key
        self.held = self.peak = 0
        self._lock = threading.Lock()

    @classmethod
    def of(cls, plan, backend, what: str = "the multiply", holding: int = 0,
           result: int = 0) -> "Account":
        """The account of `plan` (a :class:`summa.planning.Plan`) executed on
        `backend`: its device peak on a GPU; on the NumPy backend, whose
        device is host memory, its device and host peaks together. Strict
        where `backend`'s options say (``SUMMA_MEMORY_CHECK``). `holding`:
        bytes of the plan's already on the device when the account opens
        (operand blocks made before it), counted as held; `result`: host
        bytes of a product gathered on this rank beside the plan's (NumPy:
        the root's whole C)."""
        memory = plan.memory
        budget = memory.device_bytes if backend.is_gpu else \
            memory.device_bytes + memory.host_bytes + int(result)
        account = cls(budget, backend, strict=backend.options.memory_check, what=what,
                      key=(tuple(plan.shape), str(plan.dtype), memory))
        account.held = account.peak = int(holding)
        return account

    def _drawn(self, nbytes: int) -> None:
        with self._lock:
            self.held += nbytes
            self.peak = max(self.peak, self.held)

    def _given_back(self, nbytes: int) -> None:
        with self._lock:
            self.held -= nbytes

    def _short(self, nbytes: int, free: int | None) -> DeviceMemoryError:
        device = getattr(self.backend, "device", None)
        where = f"GPU {device}" if device is not None else "the device"
        has = f", {_gib(free)} free there" if free is not None else ""
        return DeviceMemoryError(
            f"{where} has no room for {_gib(nbytes)} more: {self.what} held {_gib(self.held)} "
            f"of the {_gib(self.budget)} it planned{has}; another process may have taken "
            "memory since it was planned (set device_memory lower, or free the GPU)")

    @contextlib.contextmanager
    def drawing(self, comm=None):
        """Run the block with its device allocations drawn from this account
        (CuPy: on the calling thread; NumPy: traced where strict, the
        verdict agreed over `comm` where given, so that every rank raises
        or none)."""
        if getattr(self.backend, "is_gpu", False):
            with self._cupy_allocator(), _alone_or_ended(comm):
                yield self
            if self.strict:  # (judged once the run is over: a raise mid-run on one
                # rank would leave the others waiting in a collective)
                self._judge(self.peak > self.budget + SMALL_DRAWS, "drew", comm)
        elif self.strict:
            with self._traced(comm), _alone_or_ended(comm):
                yield self
        else:
            with _alone_or_ended(comm):
                yield self

    def _cleared(self, cupy):
        """CuPy's pool, its cached, unused blocks given back unless they
        are this execution's own (the same key)."""
        pool, device = cupy.get_default_memory_pool(), self.backend.device
        if self.key is None or _last_key.get(device) != self.key:
            pool.free_all_blocks()
        _last_key[device] = self.key
        return pool

    @contextlib.contextmanager
    def _cupy_allocator(self):
        import cupy  # (the GPU backend's own module: CuPy is optional)
        pool, memory = self._cleared(cupy), cupy.cuda.memory

        def malloc(nbytes: int):
            self._drawn(nbytes)
            try:
                pointer = pool.malloc(nbytes)
            except memory.OutOfMemoryError:
                self._given_back(nbytes)
                raise self._short(nbytes, self.backend.memory_free()) from None
            owner = _Held(pointer, self, nbytes)
            drawn = memory.UnownedMemory(pointer.ptr, nbytes, owner, pointer.device_id)
            return memory.MemoryPointer(drawn, 0)

        with cupy.cuda.using_allocator(malloc):
            yield

    @contextlib.contextmanager
    def _traced(self, comm=None):
        started, modules = not tracemalloc.is_tracing(), len(sys.modules)
        if started:
            tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0] - self.held  # (what it holds already)
        tracemalloc.reset_peak()
        try:
            yield
        finally:
            self.peak = max(self.peak, tracemalloc.get_traced_memory()[1] - base)
            if started:
                tracemalloc.stop()
        # (beyond the plan's: the interpreter's own objects; a run that
        # imported modules is not judged)
        self._judge(self.peak > self.budget + TRACED_SLACK and len(sys.modules) == modules,
                    "took", comm)

    def _judge(self, over: bool, did: str, comm=None) -> None:
        """Raise Overdrawn where this rank (or, over `comm`, any rank) went
        past its plan's peak: every rank raises, or none."""
        said = f"{did} {_gib(self.peak)}, more than its plan's peak of {_gib(self.budget)}"
        if comm is not None:
            overs = [x for x in comm.allgather(said if over else None) if x]
            said, over = (overs[0], True) if overs else (said, False)
        if over:
            raise Overdrawn(f"{self.what} {said}: summa's memory plan counted short")

    def report(self) -> dict:
        """What the run reports in its stats: the plan's peak and the
        account's high-water mark, in bytes."""
        return {"device_planned": self.budget, "device_peak": self.peak}
