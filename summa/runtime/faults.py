"""Fault injection for testing the failure paths of whole jobs.

``SUMMA_INJECT_FAULT="PHASE:RANK:ACTION"`` (comma-separated for several) makes
world rank RANK, on reaching PHASE, do ACTION: ``raise`` (a RuntimeError),
``ioerror`` (an OSError: a full disk), ``kill`` (SIGKILL itself, like a
crashed node) or ``hang`` (sleep forever).
Phases: ``read``, ``multiply`` (before it starts), ``summa`` (inside the SUMMA
loop, before the second panel), ``check``, ``write``. Unset, it costs one
dictionary lookup per phase.
"""

from __future__ import annotations

import errno
import os
import signal
import time

from .mpi import MPI
from .. import options

__all__ = ["inject", "PHASES"]

PHASES = ("read", "multiply", "summa", "check", "write")
_ACTIONS = ("raise", "ioerror", "kill", "hang")


def _parse(text: str) -> list[tuple[str, int, str]]:
    faults = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        try:
            phase, rank, action = item.split(":")
            faults.append((phase, int(rank), action))
        except ValueError:
            raise ValueError(f"SUMMA_INJECT_FAULT: expected PHASE:RANK:ACTION, got {item!r}")
        if phase not in PHASES or action not in _ACTIONS:
            raise ValueError(f"SUMMA_INJECT_FAULT: unknown phase or action in {item!r}")
    return faults


def inject(phase: str) -> None:
    """Do what SUMMA_INJECT_FAULT asks of this rank at `phase`, if anything."""
    spec = options.current().inject_fault
    if not spec:
        return
    rank = MPI.COMM_WORLD.Get_rank()
    for where, who, action in _parse(spec):
        if where != phase or who != rank:
            continue
        if action == "raise":
            raise RuntimeError(f"injected fault in {phase} on rank {rank}")
        if action == "ioerror":
            raise OSError(errno.ENOSPC, f"No space left on device (injected in {phase})")
        if action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        while True:  # hang
            time.sleep(60)
