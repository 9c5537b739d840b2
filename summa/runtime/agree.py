"""Collective error agreement: a step that can fail on some ranks only must not
leave the others waiting in the next collective.

:func:`collectively` runs a local step on every rank, then agrees on the
outcome; if any rank failed, every rank raises the same exception, carrying
the message of the lowest failing rank and naming the ranks that failed.
"""

from __future__ import annotations

from dataclasses import dataclass

from .mpi import MPI
from .watchdog import watch

__all__ = ["collectively", "from_root", "RankFailure", "Failure"]


class RankFailure(RuntimeError):
    """A step failed on some ranks for a reason other than bad input."""


@dataclass(frozen=True)
class Failure:
    """A step that failed on a rank, as it travels to the others (pickled
    in a broadcast or a gather) for every rank to raise the same."""

    name: str
    message: str
    bad_input: bool  # a ValueError: the call's input, said as it is

    @classmethod
    def of(cls, exc: Exception) -> "Failure":
        return cls(type(exc).__name__, str(exc), isinstance(exc, ValueError))

    def raise_here(self, ranks: str, everywhere: bool = True) -> None:
        """Raise it on this rank: bad input as the ValueError it was (prefixed
        with `ranks`, the ranks it failed on, unless it failed `everywhere`
        or one rank decided for all), anything else as RankFailure."""
        if self.bad_input:
            raise ValueError(self.message if everywhere else f"{ranks}: {self.message}")
        raise RankFailure(f"{ranks}: {self.name}: {self.message}")


def from_root(comm: MPI.Comm, root: int, decided):
    """What rank `root` `decided` for every rank of `comm` (one broadcast; the
    others pass anything): where it is a :class:`Failure` (the root's step
    raised), every rank raises it, naming the root."""
    decided = comm.bcast(decided, root=root)
    if isinstance(decided, Failure):
        decided.raise_here(f"rank {root}")
    return decided


def collectively(comm: MPI.Comm, step, *args, **kwargs):
    """Run ``step(*args, **kwargs)`` on every rank of `comm` and agree on success.

    Returns
    -------
    Whatever `step` returned on this rank.

    Raises
    ------
    ValueError
        On every rank, when a rank's step raised ValueError (bad input).
    RankFailure
        On every rank, when a rank's step raised anything else.
    """
    try:
        result, failure = step(*args, **kwargs), None
    except Exception as exc:  # reported collectively below
        result, failure = None, Failure.of(exc)
    with watch(f"the other ranks to finish {getattr(step, '__name__', 'a step')}"):
        failures = comm.allgather(failure)
    bad = [rank for rank, f in enumerate(failures) if f is not None]
    if not bad:
        return result
    ranks = f"rank {bad[0]}" if len(bad) == 1 else f"ranks {', '.join(map(str, bad))}"
    failures[bad[0]].raise_here(ranks, everywhere=len(bad) == comm.Get_size())
