"""Temporary outputs of this process not yet renamed into place, so that a
signal, the watchdog or an aborting rank can remove them before the process
ends. No imports of summa's own: the I/O, the watchdog and the entry point
all reach it."""

from __future__ import annotations

import os

__all__ = ["temporary_files", "remove_temporary_files"]

#: Paths of unfinished outputs (a set: safe to change from any thread).
temporary_files: set = set()


def remove_temporary_files() -> None:
    """Delete this process's unfinished temporary outputs (safe from any thread)."""
    for path in list(temporary_files):
        try:
            os.unlink(path)
        except OSError:
            pass
        temporary_files.discard(path)
