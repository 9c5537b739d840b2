"""What moves a tile's data between host memory and the device for the
out-of-core sweep (:mod:`summa.execution.outofcore`), and runs its GEMMs.

:class:`CudaMover`: uploads and write-backs on CUDA streams of their own,
ordered by events, host blocks page-locked or staged through the process's
:class:`summa.device.staging.Stager`. :class:`HostMover`: the NumPy stand-in
(plain copies, GEMMs on the host), with which the tests run the same sweep.
"""

from __future__ import annotations

import time

import numpy as np

from ..device.casts import cast_rows
from ..device.cupy_backend import CUDA_INVALID_VALUE, clear_cuda_error, page_locked
from ..device.staging import get_stager
from ..device.transfers import Transfer
from ..host import remote
from ..host.storage import copyable_rows, pitch
from ..runtime.cleanup import finalize

__all__ = ["HostMover", "CudaMover"]


def _host_copy(dst: np.ndarray, src: np.ndarray) -> None:
    """``dst[...] = src`` for host arrays, either perhaps another process's
    (:mod:`summa.host.remote`: read or written there, never through its stand-in)."""
    owner, target = remote.find(src), remote.find(dst)
    if target is not None:  # the pool's owner's array (its product)
        target.write_from(np.ascontiguousarray(src))
    elif owner is None:  # (integers and float64 as the stager converts them)
        cast_rows(dst, np.asarray(src))
    elif dst.flags.c_contiguous:
        owner.read_into(dst)
    else:
        rows = np.empty(src.shape, dtype=src.dtype)
        owner.read_into(rows)
        dst[...] = rows


class HostMover:
    """The NumPy stand-in for a GPU: plain copies, GEMMs on the host."""

    overlaps = False

    def __init__(self, device, dtype):
        self.device, self.xp, self.moved, self.staged, self._seconds = device, np, 0, 0, 0.0
        self.product_finite = True  # every tile of C written back so far

    def pin(self, array) -> bool:
        return True  # nothing to lock: host memory is the "device" memory

    def upload(self, dst, src):
        _host_copy(dst, src)
        self.moved += dst.nbytes
        return None

    def event_of(self, uploaded):
        return uploaded

    def touch(self, array) -> None:
        pass

    def wait_event(self, event) -> None:
        pass

    def begin_tile(self, c, host_tile, buf: int, load: bool) -> None:
        if load:
            _host_copy(c, host_tile)
            self.moved += c.nbytes
        else:
            c.fill(0)

    def gemm(self, alpha, a, b, c, precision, forms, conj=(False, False),
             scheme=None) -> None:
        t0 = time.perf_counter()
        a, b, conj = forms(a, b, conj)
        self.device.gemm(alpha, a, b, c, precision=precision, conj=conj, scheme=scheme)
        self._seconds += time.perf_counter() - t0

    def write_back(self, host, c, buf: int) -> None:
        self.product_finite = self.product_finite and self.device.all_finite(c)
        _host_copy(host, c)
        self.moved += c.nbytes

    def finish(self) -> None:
        pass

    def phases(self) -> tuple:
        return None, None, None  # host copies are synchronous: nothing waits

    def compute_seconds(self) -> float:
        return self._seconds

    def close(self) -> None:
        pass


class CudaMover:
    """Host-device copies on streams of their own, ordered by events.

    Uploads wait for the GEMMs queued before them (which read the slot being
    refilled); a C buffer is zeroed or loaded only after its previous tile's
    write-back; write-backs wait for their strip's GEMM. Host blocks that are
    page-locked are copied directly; the others go through the process's
    :class:`summa.device.staging.Stager` (`host_copies` ``"stage"``), or are
    page-locked whole first and stay so while they live (``"lock"``); where
    locking fails, copies still work, synchronously.
    """

    overlaps = True
    _H2D, _D2H = 1, 2  # cudaMemcpyKind

    def __init__(self, device, dtype, host_copies: str = "stage", threads: int = 1):
        import cupy
        self.device, self.xp, self.moved, self.staged = device, cupy, 0, 0
        self.up = cupy.cuda.Stream(non_blocking=True)
        self.down = cupy.cuda.Stream(non_blocking=True)
        self.written: dict[int, object] = {}  # C buffer -> its last write-back
        self.marks: list = []
        self.begin, self.end = device.timing_mark(), None  # the sweep's two ends
        self.host_copies, self.threads = host_copies, threads
        self._locked: list = []  # (start, end) host addresses copied directly
        self._downloads: list = []  # staged write-backs still to finish
        self._uploads: list = []  # staged uploads (waited for after an error)
        self._probes: list = []  # of each C tile's finiteness (Backend.finite_probe)
        self.product_finite = None  # known once finished
        self._stager = None
        self._touched = None  # C's pages being faulted in
        self._hurried = False  # the copy threads asked to help with them
        self._to_touch = None  # C, to fault in once the first GEMM is queued

    def pin(self, array: np.ndarray) -> bool:
        """Note whether `array` is page-locked (locking it first under
        ``"lock"``); its copies then go directly. Returns that."""
        locked = (_register(self.xp, array) if self.host_copies == "lock"
                  else _is_page_locked(self.xp, array))
        if locked and array.nbytes:
            self._locked.append((array.ctypes.data, array.ctypes.data + array.nbytes))
        return locked

    def _direct(self, host: np.ndarray, dev=None) -> bool:
        """Is `host` copied directly (page-locked), not through the stager?
        Never where it is of another type than the device rows `dev`
        (integers, converted as the stager's threads copy them)."""
        if dev is not None and host.dtype != dev.dtype:
            return False
        start = host.ctypes.data
        return any(a <= start < b for a, b in self._locked)

    def touch(self, array: np.ndarray) -> None:
        """Fault in C's pages, from the first GEMM on: before it, the host
        threads are the first uploads' (16 more threads there delayed the
        first GEMM of N = 16384 by 60 ms)."""
        if not self._direct(array):
            self._to_touch = array

    def _stage(self):
        if self._stager is None:
            self._stager = get_stager(self.device.device, self.threads)
        return self._stager

    def event_of(self, uploaded):
        """The CUDA event of an upload (waits until a staged one is queued)."""
        return uploaded.event() if isinstance(uploaded, Transfer) else uploaded

    def _h2d(self, dst, src: np.ndarray, stream) -> None:
        """Copy the host rows `src` into the device array `dst` on `stream`."""
        self._copy(dst, src, self._H2D, stream)

    def _d2h(self, dst: np.ndarray, src, stream) -> None:
        """Copy the device array `src` into the host rows `dst` on `stream`."""
        self._copy(src, dst, self._D2H, stream)

    def _copy(self, dev, host: np.ndarray, kind: int, stream) -> None:
        if not (host.shape[0] and host.shape[1]):
            return
        try:
            self._memcpy(dev, host, kind, stream)
        except self.xp.cuda.runtime.CUDARuntimeError as exc:
            if exc.status != CUDA_INVALID_VALUE:
                raise
            self._staged_copy(dev, host, kind, stream)
        self.moved += host.shape[0] * host.shape[1] * host.itemsize

    def _memcpy(self, dev, host: np.ndarray, kind: int, stream) -> None:
        """One asynchronous 2-D copy between a device array and host rows."""
        ends = ((dev.data.ptr, pitch(dev)), (host.ctypes.data, pitch(host)))
        (dst, dst_pitch), (src, src_pitch) = ends if kind == self._H2D else ends[::-1]
        self.xp.cuda.runtime.memcpy2DAsync(dst, dst_pitch, src, src_pitch,
                                           host.shape[1] * host.itemsize, host.shape[0],
                                           kind, stream.ptr)

    def _staged_copy(self, dev, host: np.ndarray, kind: int, stream) -> None:
        """The copy through a page-locked buffer of its own, synchronously.

        CUDA refuses a copy whose host range is partly page-locked and partly
        not, which happens to a small array sharing a page with a locked one
        (locking works on whole pages).
        """
        clear_cuda_error(self.xp)
        memory = self.xp.cuda.alloc_pinned_memory(host.nbytes)
        stage = np.frombuffer(memory, host.dtype, host.size).reshape(host.shape)
        if kind == self._H2D:
            stage[...] = host
        self._memcpy(dev, stage, kind, stream)
        stream.synchronize()  # before `memory` goes back to the pool
        if kind == self._D2H:
            host[...] = stage
        self.staged += 1

    def _event(self, stream):
        event = self.xp.cuda.Event(disable_timing=True)
        event.record(stream)
        return event

    def upload(self, dst, src):
        after = self.device.record_event()  # GEMMs done with this slot
        if not (self._direct(src, dst) and copyable_rows(src)):  # strided: the threads gather
            self.moved += src.nbytes
            transfer = self._stage().upload(dst, src, after)
            self._uploads.append(transfer)
            return transfer
        self.up.wait_event(after)
        self._h2d(dst, src, self.up)
        return self._event(self.up)

    def wait_event(self, event) -> None:
        event = self.event_of(event)
        if event is not None:
            self.xp.cuda.get_current_stream().wait_event(event)

    def begin_tile(self, c, host_tile, buf: int, load: bool) -> None:
        stream = self.xp.cuda.get_current_stream()
        self.wait_event(self.written.pop(buf, None))
        if load and not self._direct(host_tile, c):
            self.moved += host_tile.nbytes
            self.wait_event(self._stage().upload(c, host_tile, self.device.record_event()))
        elif load:
            self._h2d(c, host_tile, stream)
        else:
            c.fill(0)

    def gemm(self, alpha, a, b, c, precision, forms, conj=(False, False),
             scheme=None) -> None:
        """`a` times `b` as `forms` (:class:`summa.execution.transpose.PanelForms`:
        each as it is, or a transposed copy) give them into `c`, conjugated
        where `conj` says, fp64-int8 as the plan's `scheme` says
        (:attr:`summa.planning.Plan.scheme`), timed (the copies too: they are
        the GEMM's work)."""
        self.marks.append(self.device.timing_mark())
        a, b, conj = forms(a, b, conj)
        self.device.gemm(alpha, a, b, c, precision=precision, conj=conj, scheme=scheme)
        self.marks.append(self.device.timing_mark())
        if self._to_touch is not None:
            self._touched, self._to_touch = self._stage().touch(self._to_touch), None

    def write_back(self, host, c, buf: int) -> None:
        # Whether the product is finite, asked of each tile where it lies (the
        # inputs are scanned only where it is not: see multiply_files).
        self._probes.append(self.device.finite_probe(c))
        if not self._direct(host, c):
            self.moved += host.nbytes
            if self._touched is not None and not self._hurried:
                self._stage().hurry(self._touched)  # the copy threads help: tile's uploads done
                self._hurried = True
            # (each chunk goes home once the zeros of its pages have landed)
            transfer = self._stage().download(host, c, self.device.record_event(),
                                              touch=self._touched)
            self._downloads.append(transfer)
            self.written[buf] = transfer
            return
        self.down.wait_event(self.device.record_event())
        self._d2h(host, c, self.down)
        self.written[buf] = self._event(self.down)

    def finish(self) -> None:
        for transfer in self._downloads:  # in host memory, every byte
            transfer.wait()
        self._downloads = []
        if self._touched is not None:  # (no zero may land after the call: done by now)
            self._touched.wait()
            self._touched = None
        self.down.wait_event(self.device.record_event())
        self.end = self.xp.cuda.Event()
        self.end.record(self.down)  # after the last GEMM and the last write-back
        self.device.synchronize()
        self.up.synchronize()
        self.down.synchronize()
        self.product_finite = all(self.device.probed_finite(p) for p in self._probes)
        self._probes = []

    def phases(self) -> tuple:
        """Device seconds before the first GEMM (the first panels' uploads and
        broadcasts), between GEMMs (waiting for later panels) and after the
        last (the last write-back), where the GPU waits; None where there was
        no GEMM."""
        if not self.marks or self.end is None:
            return None, None, None
        between = sum(self.device.elapsed(b, a) for b, a in zip(self.marks[1:-1:2],
                                                                 self.marks[2::2]))
        return (self.device.elapsed(self.begin, self.marks[0]), between,
                self.device.elapsed(self.marks[-1], self.end))

    def compute_seconds(self) -> float:
        marks, self.marks = self.marks, []
        return sum(self.device.elapsed(a, b) for a, b in zip(marks[::2], marks[1::2]))

    def close(self) -> None:
        self.up.synchronize()
        self.down.synchronize()
        # After an error: nothing may still be copying into or out of the
        # caller's arrays once the call has returned.
        for transfer in self._uploads + self._downloads:
            try:
                transfer.wait()
            except BaseException:  # noqa: BLE001 -- the first error is already raised
                pass
        self._uploads, self._downloads = [], []
        if self._touched is not None:
            try:
                self._touched.wait()
            except BaseException:  # noqa: BLE001
                pass
        if self._stager is not None:
            self._stager.up.synchronize()
            self._stager.down.synchronize()


def _is_page_locked(cupy, array: np.ndarray) -> bool:
    """Is `array`'s memory page-locked already (registered, or allocated so)?"""
    if not array.nbytes:
        return True
    return array.ctypes.data in _registered or page_locked(cupy, array)


_registered: dict[int, int] = {}  # host address -> bytes registered with CUDA


_PAGE = 4096


def _register(cupy, array: np.ndarray) -> bool:
    """Page-lock `array`'s memory for as long as the array lives (once).

    Returns whether it is locked (an empty array counts as locked); copies from
    memory that is not run synchronously, through the driver's own buffers.
    """
    if not array.nbytes:
        return True
    if not array.flags.owndata or not (array.flags.c_contiguous or array.flags.f_contiguous):
        return False  # a view or memory map: not ours to lock (Fortran order is: whole)
    start = array.ctypes.data // _PAGE * _PAGE  # whole pages
    nbytes = -(-(array.ctypes.data + array.nbytes - start) // _PAGE) * _PAGE
    if _registered.get(start, 0) >= nbytes:
        return True
    try:
        cupy.cuda.runtime.hostRegister(start, nbytes, 0)
    except cupy.cuda.runtime.CUDARuntimeError:
        return False  # not allowed here, or a page shared with another locked array
    _registered[start] = nbytes
    finalize(array, _unregister, cupy, start)
    return True


def _unregister(cupy, ptr: int) -> None:
    if _registered.pop(ptr, None) is not None:
        try:
            cupy.cuda.runtime.hostUnregister(ptr)
        except Exception:  # interpreter shutdown, or the context is gone
            pass
