"""A progress bar on rank 0 (tqdm, to stderr), off when stderr is not a terminal,
when asked to be quiet, or when tqdm is not installed."""

from __future__ import annotations

import sys

__all__ = ["Progress"]


class Progress:
    """Phases with step counts, shown as one bar each on rank 0.

    Parameters
    ----------
    enabled : bool
        Show anything at all (pass ``rank == 0 and not quiet``).
    """

    def __init__(self, enabled: bool):
        self._tqdm = None
        if enabled and sys.stderr.isatty():
            try:
                from tqdm import tqdm
            except ImportError:
                tqdm = None
            self._tqdm = tqdm
        self._bar = None

    def phase(self, name: str, total: int) -> None:
        """Start a phase of `total` steps (closing the previous bar)."""
        self.close()
        if self._tqdm is not None:
            self._bar = self._tqdm(total=total, desc=name, file=sys.stderr, leave=False,
                                   dynamic_ncols=True)

    def step(self, done: int, total: int) -> None:
        """Report `done` of `total` steps of the current phase."""
        if self._bar is not None:
            self._bar.total = total
            self._bar.n = done
            self._bar.refresh()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
