"""Host memory a run takes for itself, against what its machine has
available now: refused before the first read, in one line.

:func:`summa.planning.memorycheck.check_host_memory` refuses a plan larger than a
node's whole memory while planning (certain not to fit, wherever the rest
of the memory is). This is the second check, once the plan is made: the
memory summa allocates itself (the blocks it reads or generates, staging
buffers, a product it gathers) against the memory the system can give
without swapping (Linux's MemAvailable), summed over the ranks of each
machine, so that a run that would end in the OOM killer or in swap after
minutes of reading is refused before it starts. Memory the caller already
holds (the arrays passed to ``summa.matmul``) is in neither figure.
"""

from __future__ import annotations

import numpy as np

from ..distribution.topology import topology_of
from .units import format_bytes
from ..host.filemaps import meminfo_available

__all__ = ["available_host_memory", "check_host_room", "own_host_bytes"]


def available_host_memory() -> int | None:
    """The memory this machine can give without swapping, in bytes; None
    where the system does not say (:func:`summa.host.filemaps.meminfo_available`)."""
    return meminfo_available()


def own_host_bytes(plan, mapped: tuple = (False, False, False)) -> int:
    """Host bytes one rank of `plan` (a :class:`summa.planning.Plan`) takes
    for itself where it reads or makes every block (files, generated
    matrices): its blocks, panels and copies (``host_bytes``) and out of
    core its staging buffers (``staging_bytes``). `mapped`: whether the
    blocks of A, B and C are memory maps of files out of core (page cache
    the system reclaims as the sweep goes, not memory taken), left out."""
    memory = plan.memory
    need = int(memory.host_bytes)
    if plan.device_budget is not None and any(mapped):
        (m, n, k), (pr, pc) = plan.shape, plan.grid
        blocks = (-(-m // pr) * -(-k // pc), -(-k // pr) * -(-n // pc), -(-m // pr) * -(-n // pc))
        item = np.dtype(plan.dtype).itemsize
        need -= sum(size for size, is_map in zip(blocks, mapped) if is_map) * item
    return max(need, 0) + int(memory.staging_bytes or 0)


def check_host_room(need: int, comm, hint: str = "use more nodes") -> None:
    """Refuse, on every rank, a run whose ranks on some machine need more
    host memory (`need`: this rank's bytes) than that machine has available
    now; collective over `comm`.

    Raises
    ------
    ValueError
        One line, the same on every rank, naming the machine with the
        largest shortfall: what its ranks need, what it has available, and
        `hint`.
    """
    machine = topology_of(comm).machine_comm  # (virtual nodes share the machine's memory)
    total = machine.allreduce(int(need))
    available = available_host_memory() if machine.Get_rank() == 0 else None
    available = machine.bcast(available, root=0)
    short = None
    if available is not None and total > available:
        ranks = machine.Get_size()
        short = (total - available, comm.Get_rank(),
                 f"the {ranks} rank{'s' if ranks > 1 else ''} on rank {comm.Get_rank()}'s "
                 f"machine need {format_bytes(total)} of host memory, and it has "
                 f"{format_bytes(available)} available; free some memory or {hint}")
    worst = max((s for s in comm.allgather(short) if s), default=None)
    if worst:
        raise ValueError(worst[2])
