"""A copy between host and GPU memory in flight, as its caller holds it.

A :class:`Transfer` counts the chunks of one copy as the stager's threads
finish them (:mod:`summa.device.staging`), keeps the first error any of them
met, and lets the caller wait for it on the GPU (:meth:`Transfer.event`) or on
the host (:meth:`Transfer.wait`), the error raised there. A :class:`Touch` is
the same for the first touch of a fresh array's pages, whose parts
(:func:`page_parts`) any thread may claim.
"""

from __future__ import annotations

import queue
import threading

import numpy as np

from ..runtime.watchdog import watch

__all__ = ["Transfer", "Touch", "page_parts"]


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
    parts, each filled with zeros once by whichever thread claims it first.

    Its own few threads start it beside the uploads; :meth:`Stager.hurry`
    lets the copy threads take what is left once they are free (before the
    first download into the array), rather than the download waiting for
    the few: with a quarter of 12 threads a 2 GiB result takes ~0.3 s to
    fault in (2.4 GB/s a thread), longer than float64 16384³'s GEMMs.
    """

    def __init__(self, parts: list):
        super().__init__(len(parts))
        self._parts = queue.SimpleQueue()
        for part in parts:
            self._parts.put(part)

    def unclaimed(self) -> int:
        """Parts no thread has claimed yet."""
        return self._parts.qsize()

    def fill_one(self) -> None:
        """Fill the next part no thread has claimed (none left: nothing)."""
        try:
            part = self._parts.get_nowait()
        except queue.Empty:
            return
        try:
            part.fill(0)
            self._chunk_done()
        except BaseException as exc:  # noqa: BLE001
            self._fail(exc)


_PAGE = 4096


def page_parts(flat: np.ndarray, count: int) -> list:
    """About `count` views of the bytes `flat`, one byte of each page: filling
    them faults every page in (a byte a page does it), a part per thread."""
    step = -(-flat.nbytes // count // _PAGE) * _PAGE
    return [flat[i:i + step:_PAGE] for i in range(0, flat.nbytes, step)]
