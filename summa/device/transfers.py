"""A copy between host and GPU memory in flight, as its caller holds it.

A :class:`Transfer` counts the chunks of one copy as the stager's threads
finish them (:mod:`summa.device.staging`), keeps the first error any of them
met, and lets the caller wait for it on the GPU (:meth:`Transfer.event`) or on
the host (:meth:`Transfer.wait`), the error raised there. A :class:`Touch` is
the same for the first touch of a fresh array's pages, whose parts
(:func:`page_parts`) any thread may claim.
"""

from __future__ import annotations

import bisect
import threading

import numpy as np

from ..runtime.watchdog import watch

__all__ = ["Transfer", "Touch", "page_parts", "byte_extent"]


class Transfer:
    """One copy between a host array and a device array, in flight."""

    def __init__(self, chunks: int):
        self._left = chunks
        self._lock = threading.Lock()
        self._done = threading.Event()      # every chunk finished on the host
        self._queued = threading.Event()    # every device copy queued; `_event` set
        self._event = None
        self.error: BaseException | None = None
        if chunks == 0:
            self._queued.set()
            self._done.set()

    def _fail(self, error: BaseException) -> None:
        if self.error is None:
            self.error = error
        self._queued.set()
        self._done.set()

    def _chunk_done(self, record=None) -> bool:
        """Count one chunk; True for the last one (which then records `record`)."""
        with self._lock:
            self._left -= 1
            last = self._left == 0
            if last and record is not None:
                self._event = record()
                self._queued.set()
        if last:
            self._done.set()
        return last

    def _wait(self, flag: threading.Event, what: str) -> None:
        if not flag.is_set():
            with watch(what):
                flag.wait()
        if self.error is not None:
            raise self.error

    def event(self):
        """A CUDA event after the transfer's device copies (None: nothing to
        copy); waits on the host until they are all queued."""
        self._wait(self._queued, "host threads to queue a copy between host and GPU memory")
        return self._event

    def wait(self) -> None:
        """Wait on the host until the transfer is complete, its host side too."""
        self._wait(self._done, "host threads to finish a copy between host and GPU memory")


class Touch(Transfer):
    """The first touch of a fresh array's pages (:meth:`Stager.touch`): its
    parts, in address order, each filled with zeros once by whichever thread
    claims it first.

    Its own few threads start it beside the uploads; :meth:`Stager.hurry`
    lets the copy threads take what is left once they are free, rather than
    the few alone (with a quarter of 12 threads a 2 GiB result takes ~0.3 s
    to fault in, 2.4 GB/s a thread, longer than float64 16384³'s GEMMs). A
    download into the array waits only for the parts it writes
    (:meth:`ensure`, in the copy thread that drains it), so the sweep's
    thread goes on queueing GEMMs: waiting for all of a 40960² result before
    its first strip went home held it 0.25-0.48 s on an H100, the GPU idle
    0.29 s of it in a first call (fp64-int8 under 24 GiB). The faulting
    itself stays: on another H100 that first call's GPU then waited about
    as long for the next tile's first upload, which shares the copy threads
    with it (there a process's first result faulted in slower than its
    later ones).
    """

    def __init__(self, parts: list):
        super().__init__(len(parts))
        self._parts = sorted(((*byte_extent(p), p) for p in parts), key=lambda t: t[0])
        self._starts = [lo for lo, _, _ in self._parts]
        self._claimed = [False] * len(parts)
        self._filled = [threading.Event() for _ in parts]
        self._claims = threading.Lock()

    def unclaimed(self) -> int:
        """Parts no thread has claimed yet."""
        with self._claims:
            return self._claimed.count(False)

    def _claim(self, i: int) -> bool:
        with self._claims:
            if self._claimed[i]:
                return False
            self._claimed[i] = True
            return True

    def _fill(self, i: int) -> None:
        try:
            self._parts[i][2].fill(0)
            self._chunk_done()
        except BaseException as exc:  # noqa: BLE001
            self._fail(exc)
        finally:
            self._filled[i].set()

    def fill_one(self) -> None:
        """Fill the first part (lowest addresses) no thread has claimed
        (none left: nothing): the order a sweep's strips go home in."""
        with self._claims:
            try:
                i = self._claimed.index(False)
            except ValueError:
                return
            self._claimed[i] = True
        self._fill(i)

    def ensure(self, view: np.ndarray) -> None:
        """Return once every part whose bytes `view` (of the touched array)
        spans is filled: those unclaimed filled here, those claimed waited
        for; raises the touch's error."""
        lo, hi = byte_extent(view)
        # (the parts start in order and do not overlap: those starting below
        # `hi` from the last one starting at or below `lo`, ending past `lo`)
        first = max(0, bisect.bisect_right(self._starts, lo) - 1)
        spanned = [i for i in range(first, bisect.bisect_left(self._starts, hi))
                   if self._parts[i][1] > lo]
        for i in spanned:  # every unclaimed one first, then the wait for the rest
            if self._claim(i):
                self._fill(i)
        for i in spanned:
            self._filled[i].wait()
        if self.error is not None:
            raise self.error


def byte_extent(x: np.ndarray) -> tuple[int, int]:
    """``(lowest, past the highest)`` address of the bytes `x` holds (any
    strides): NumPy's ``byte_bounds`` (``numpy.lib.array_utils`` from NumPy
    2, the top level before)."""
    return _byte_bounds(x)


_byte_bounds = getattr(getattr(np.lib, "array_utils", np), "byte_bounds")


_PAGE = 4096


def page_parts(flat: np.ndarray, count: int) -> list:
    """About `count` views of the bytes `flat`, one byte of each page: filling
    them faults every page in (a byte a page does it), a part per thread."""
    step = -(-flat.nbytes // count // _PAGE) * _PAGE
    return [flat[i:i + step:_PAGE] for i in range(0, flat.nbytes, step)]
