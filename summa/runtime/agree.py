"""Collective error agreement: a step that can fail on some ranks only must not
leave the others waiting in the next collective.

:func:`collectively` runs a local step on every rank, then agrees on the
outcome; if any rank failed, every rank raises the same exception, carrying
the message of the lowest failing rank and naming the ranks that failed.
"""

from __future__ import annotations

from mpi4py import MPI

from .watchdog import watch

__all__ = ["collectively", "RankFailure"]


class RankFailure(RuntimeError):
    """A step failed on some ranks for a reason other than bad input."""


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
        result, failure = None, (type(exc).__name__, str(exc), isinstance(exc, ValueError))
    with watch(f"the other ranks to finish {getattr(step, '__name__', 'a step')}"):
        failures = comm.allgather(failure)
    bad = [rank for rank, f in enumerate(failures) if f is not None]
    if not bad:
        return result
    name, message, is_value_error = failures[bad[0]]
    ranks = f"rank {bad[0]}" if len(bad) == 1 else f"ranks {', '.join(map(str, bad))}"
    if is_value_error:
        raise ValueError(message if len(bad) == comm.Get_size() else f"{ranks}: {message}")
    raise RankFailure(f"{ranks}: {name}: {message}")
