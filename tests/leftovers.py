"""What a job leaves behind: its processes and the shared-memory files they
held. Other engineers' runs may add and remove files in /dev/shm at the same
time, so nothing here compares whole listings: a job's files are the ones its
own processes mapped (MPI's segments) or named after their pids (summa's)."""

from __future__ import annotations

import os
import time

from summa import host
from summa.cleanup import mapped_segments


def job_pids(root: int) -> list[int]:
    """Process `root` and its live descendants (a launcher starts its ranks in
    sessions of their own, so a session or group would not find them)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] not in ("Z", "X"):
                children.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def held_files(pids) -> set[str]:
    """Shared-memory files processes `pids` hold: MPI's segments they map and
    summa's shared arrays named after them (:func:`summa.host.named`)."""
    held = {path for pid in pids for path in mapped_segments(pid)}
    try:
        names = os.listdir(host.shm_dir())
    except OSError:
        names = []
    held |= {os.path.join(host.shm_dir(), n) for n in names for pid in pids
             if n.startswith(f"summa-{pid}-")}
    return held


def existing(paths) -> list[str]:
    return sorted(p for p in paths if os.path.exists(p))


def wait_gone(pids, seconds: float) -> list[int]:
    """`pids` still alive after up to `seconds` (zombies count as gone)."""
    from summa.pool import _alive
    deadline = time.monotonic() + seconds
    while True:
        alive = [p for p in pids if _alive(p)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.02)
