"""Collective error agreement (summa.runtime.agree): a step that fails on some
ranks is raised on every rank, bad input as ValueError, the rest as
RankFailure naming the ranks it failed on."""

import pytest

from summa.runtime.agree import Failure, RankFailure, collectively, from_root


def _fails_on(ranks, error):
    def step(rank):
        if rank in ranks:
            raise error
        return rank * 2
    return step


@pytest.mark.mpi(min_size=1)
def test_a_step_that_fails_nowhere_returns_each_ranks_result(comm):
    assert collectively(comm, _fails_on((), None), comm.rank) == comm.rank * 2


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("failing, error, raised, match", [
    ("all", ValueError("bad input"), ValueError, "^bad input$"),
    ("0", ValueError("bad input"), ValueError, "^rank 0: bad input$"),
    ("0", MemoryError("no room"), RankFailure, "^rank 0: MemoryError: no room$"),
])
def test_a_failure_is_raised_on_every_rank(comm, failing, error, raised, match):
    if failing == "0" and comm.size == 1:
        match = match.replace("rank 0: ", "") if raised is ValueError else match
    ranks = range(comm.size) if failing == "all" else (0,)
    with pytest.raises(raised, match=match):
        collectively(comm, _fails_on(ranks, error), comm.rank)


def test_a_failure_travels_as_it_is_raised():
    with pytest.raises(ValueError, match="^x$"):
        Failure.of(ValueError("x")).raise_here("rank 3")
    with pytest.raises(ValueError, match="^rank 3: x$"):
        Failure.of(ValueError("x")).raise_here("rank 3", everywhere=False)
    with pytest.raises(RankFailure, match="^rank 3: OSError: y$"):
        Failure.of(OSError("y")).raise_here("rank 3")


@pytest.mark.mpi(min_size=1)
def test_what_the_root_decides_or_its_failure_reaches_every_rank(comm):
    assert from_root(comm, 0, "plan" if comm.rank == 0 else None) == "plan"
    failed = Failure.of(MemoryError("no room")) if comm.rank == 0 else None
    with pytest.raises(RankFailure, match="^rank 0: MemoryError: no room$"):
        from_root(comm, 0, failed)
