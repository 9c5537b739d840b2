"""Memory checks: whether a plan fits the machine it runs on, asked of every
rank before anything is allocated.

Ranks that share a GPU share its free memory (:func:`ranks_on_device`).
:func:`check_memory` refuses a plan that does not fit the free device memory,
:func:`check_host_memory` one whose ranks on some node need more host memory
than the node has in all; either refuses on every rank, with the largest
shortfall ("rank 3 needs 41.2 GiB on GPU 1, 23.5 GiB free; use
--device-memory (out of core) or more ranks"). :func:`panel_sums_fit` asks
whether fp64-int8's panel sums fit every rank's device, where no plan counted
them. What a plan needs is counted in :mod:`summa.planning.memory`.
"""

from __future__ import annotations

import os

from ..distribution.topology import topology_of
from ..runtime.mpi import MPI
from .memory import MemoryPlan
from .precision import panel_sums_bytes
from .units import format_bytes

__all__ = ["ranks_on_device", "panel_sums_fit", "check_memory", "host_memory_total",
           "check_host_memory"]


def _refuse_largest_shortfall(comm, short) -> None:
    """Raise, on every rank, the message of the largest ``(bytes, rank, message)``
    shortfall any rank found (None where it found none); collective."""
    worst = max((s for s in comm.allgather(short) if s), default=None)
    if worst:
        raise ValueError(worst[2])


def ranks_on_device(backend, comm, counted: bool = True) -> int:
    """How many ranks of `comm` that are `counted` share this rank's GPU (1
    on the CPU backend or where this rank is not counted): they share its
    free memory, on virtual nodes too (the machine's). Collective."""
    where = backend.device_id() if backend.is_gpu and counted else "cpu"
    sharing = topology_of(comm).machine_comm.allgather(where).count(where)
    return sharing if where != "cpu" else 1


def panel_sums_fit(c_shape: tuple, k: int, width: int, lookahead: int, backend, comm) -> bool:
    """Does every rank's device hold fp64-int8's panel sums of its `c_shape`
    block of C over `k` terms in `width`-wide panels, beside the pipeline's
    panel buffers and a margin (ranks on one GPU sharing it)? What
    :func:`summa.execution.algorithm.summa` without a plan asks; a plan
    counts the sums in its peak instead. Collective."""
    m, n = c_shape
    buffers = 2 * (lookahead + 1) * (m + n) * width * 8
    need = panel_sums_bytes(m, n, width, k) + buffers
    free = backend.memory_free()
    sharing = ranks_on_device(backend, comm)  # (their sums come out of the same memory)
    fits = free is not None and free >= sharing * (need + need // 16 + (256 << 20))
    return bool(comm.allreduce(fits, op=MPI.LAND))


def check_memory(plan: MemoryPlan, backend, comm) -> None:
    """Refuse, on every rank, a plan that does not fit the free device memory.

    Ranks that share a GPU share its free memory. Raises ValueError naming the
    rank with the largest shortfall, e.g. "rank 3 needs 41.2 GiB on GPU 1, 23.5
    GiB free; use --device-memory (out of core) or more ranks". Host memory is
    checked by :func:`check_host_memory`, against the node's total.
    """
    need, free = plan.device_bytes, None
    if backend.is_gpu and need:
        free = backend.memory_free()
    sharing = ranks_on_device(backend, comm, bool(need))
    short = None
    if free is not None and need * sharing > free:
        short = (need * sharing - free, comm.Get_rank(),
                 f"rank {comm.Get_rank()} needs {format_bytes(need)}"
                 + (f" ({sharing} ranks share the GPU)" if sharing > 1 else "")
                 + f" on GPU {backend.device}, {format_bytes(free)} free; use --device-memory "
                   "(out of core) or more ranks")
    _refuse_largest_shortfall(comm, short)


def host_memory_total() -> int | None:
    """This node's physical memory in bytes (None where the OS does not say).

    The total, not the free figure: VMs whose memory grows on use report far
    less free memory than they can give, so only a plan larger than the whole
    node is certain not to fit.
    """
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def check_host_memory(plan: MemoryPlan, comm) -> None:
    """Refuse, on every rank, a plan whose ranks on some node need more host
    memory than that node has in all (collective)."""
    node = topology_of(comm).node_comm
    need, ranks = node.allreduce(plan.host_bytes), node.Get_size()
    total = host_memory_total()
    short = None
    if total is not None and need > total:
        short = (need - total, comm.Get_rank(),
                 f"the {ranks} rank(s) on rank {comm.Get_rank()}'s node need "
                 f"{format_bytes(need)} of host memory, and the node has "
                 f"{format_bytes(total)} in all; use more nodes"
                 + (" or --device-memory" if plan.mode == "in-memory" and plan.device_bytes
                    else ""))
    _refuse_largest_shortfall(comm, short)
