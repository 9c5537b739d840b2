"""The broadcasters by name: made, and self-tested, for a grid row or column.

Above :mod:`summa.transports.comm` (NCCL, CUDA-aware and host-staged MPI) and
:mod:`summa.transports.ipc` (copy engines between the GPUs of a node), so that neither
of those imports the other's registry.
"""

from __future__ import annotations

import numpy as np

from ..runtime.mpi import MPI
from .comm import CudaAwareBroadcaster, HostStagedBroadcaster, NcclBroadcaster, choose_comm
from .ipc import IpcBroadcaster

__all__ = ["BROADCASTERS", "NoBroadcasts", "make_broadcaster", "self_test"]

#: The broadcaster classes by the names ``--comm`` accepts.
BROADCASTERS = {"nccl": NcclBroadcaster, "cuda-aware": CudaAwareBroadcaster,
                "mpi": HostStagedBroadcaster, "ipc": IpcBroadcaster}


def self_test(broadcaster, backend) -> None:
    """Broadcast a small pattern from every root and check it on every rank.

    Raises RuntimeError on every rank of the communicator if any rank got
    wrong bytes.
    """
    comm = broadcaster.comm
    ok = True
    for root in range(comm.Get_size()):
        expect = np.arange(1000, dtype=np.float64) * (root + 1) + 0.5
        buf = backend.asarray(expect if comm.Get_rank() == root else np.zeros_like(expect))
        broadcaster.ibcast(buf, root).wait()
        backend.synchronize()
        ok &= bool(np.array_equal(backend.to_host(buf), expect))
    bad = [r for r, good in enumerate(comm.allgather(ok)) if not good]
    if bad:
        raise RuntimeError(f"{broadcaster.name} broadcast self-test failed on ranks {bad} "
                           "of a grid row/column; try --comm mpi")


def make_broadcaster(kind: str, comm: MPI.Intracomm, backend, check: bool = False):
    """Return the broadcaster `kind` over `comm`, self-tested when `check` is set.

    It is made on `backend`'s GPU (NCCL's communicator, CUDA's IPC handles),
    whatever GPU is current; its broadcasts are queued on the current stream,
    so callers run them on that GPU too (``with backend.on_device():``, as the
    executors do)."""
    name = choose_comm(kind, backend)
    with backend.on_device():
        broadcaster = BROADCASTERS[name](comm, backend)
        if check:
            try:
                self_test(broadcaster, backend)
            except RuntimeError:  # raised on every rank of `comm`: free it everywhere
                broadcaster.free()
                raise
    return broadcaster


class NoBroadcasts:
    """The broadcaster of an out-of-core sweep where every rank uploads its own
    panel parts (node-shared copies): nothing to send. Here, below planning,
    so that the sweep's set-up, a planning step, may make it, and the sweep
    (:mod:`summa.execution.sweep`) recognise it."""

    name = "own uploads"

    class _Done:
        def wait(self) -> None:
            pass

    def ibcast(self, buf, root, slot=0, ready=None, own=False):
        return self._Done()

    def take_seconds(self) -> float:
        return 0.0
