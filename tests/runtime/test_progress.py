"""The one progress line of a job of one or many ranks: the time left, how
it is drawn, and every rank's counts reaching rank 0."""

import io
import time

import pytest

from summa.runtime.progress import PHASES, Display, JobProgress, Tally, display_mode, remaining


# -- one line for a job of many ranks ---------------------------------------------------

def test_time_left_is_the_plans_until_counts_come_then_the_rate_so_far():
    assert remaining(0, 100, 0.0, 30.0) == 30.0
    assert remaining(0, 100, 0.0, None) is None
    assert remaining(10, 100, 2.0, None) == pytest.approx(18.0)
    # a prediction 100 times off weighs nothing from a quarter of the work on
    assert remaining(50, 100, 10.0, 1000.0) == pytest.approx(10.0)
    # while little has run, it is blended with the prediction's rest
    early = remaining(5, 100, 1.0, 10.0)
    assert min(9.0, 19.0) < early < max(9.0, 19.0)


def test_auto_is_a_bar_on_a_terminal_and_lines_elsewhere():
    class Terminal(io.StringIO):
        def isatty(self):
            return True
    assert display_mode("auto", io.StringIO()) == "lines"
    assert display_mode("auto", Terminal()) == "bar"
    assert display_mode("off", Terminal()) == "off"


def _shown(mode: str, seconds: float, after: float = 0.0) -> str:
    stream, done = io.StringIO(), [0.0]
    display = Display(mode, 0.02, stream, after=after)
    display.begin(dict(name="multiply", total=8e9, unit="flop", predicted=None),
                  lambda: done[0])
    for _ in range(4):
        time.sleep(seconds / 4)
        done[0] += 2e9
    display.close()
    return stream.getvalue()


def test_lines_come_once_a_phase_has_run_a_while_and_end_with_its_total():
    text = _shown("lines", 0.2)
    lines = text.splitlines()
    assert len(lines) >= 3 and all(line.startswith("summa: multiply") for line in lines)
    assert "ETA" in text and "flop/s" in text
    assert lines[-1].startswith("summa: multiply done") and lines[-1].endswith("8.0 Gflop")


def test_a_bar_is_redrawn_in_place_and_wiped_at_the_end():
    text = _shown("bar", 0.5)
    assert "\n" not in text and text.count("\r") >= 3
    assert text.endswith("\r") and text.rsplit("\r", 2)[-2].strip() == ""


def test_nothing_is_drawn_for_a_phase_shorter_than_a_line():
    assert _shown("lines", 0.0) == ""


@pytest.mark.parametrize("mode", ["lines", "bar"])
def test_a_phase_shorter_than_its_threshold_draws_nothing_a_longer_one_does(mode):
    assert _shown(mode, 0.3, after=5.0) == ""
    # (how many drawings come before and after the threshold depends on the
    # machine's load: a drawing thread that wakes late counted equal)
    assert "summa: multiply" in _shown(mode, 0.6, after=0.3)


@pytest.mark.mpi(min_size=1)
def test_every_ranks_amounts_reach_rank_0(comm):
    tally = Tally(comm)
    tally.add(PHASES.index("read"), 10.0 * (comm.rank + 1))
    tally.add(PHASES.index("multiply"), 1.0)
    comm.Barrier()  # each add is complete once its lock is released
    counts = tally.read() if comm.rank == 0 else None
    tally.free()
    if comm.rank == 0:
        p = comm.size
        assert counts[PHASES.index("read")] == 10.0 * p * (p + 1) / 2
        assert counts[PHASES.index("multiply")] == p
        assert counts[PHASES.index("write")] == 0


@pytest.mark.mpi(min_size=1)
def test_a_ranks_steps_count_its_share_of_the_phase(comm):
    sent = []
    job = JobProgress(comm, True, send=sent.append)
    job.phase("multiply", 100.0 * (comm.rank + 1), 0.0, "flop")
    for step in range(1, 5):
        job.step(step, 4)
    job.close()
    if comm.rank == 0:
        p = comm.size
        assert sent[-1]["name"] == "multiply"
        assert sent[-1]["done"] == pytest.approx(100.0 * p * (p + 1) / 2)
    else:
        assert sent == []


@pytest.mark.mpi(min_size=1)
def test_a_job_of_its_own_phases_counts_each_apart(comm):
    sent = []
    job = JobProgress(comm, True, send=sent.append, phases=("generate", "run 1/2", "run 2/2"))
    for name in job.phases[1:]:
        comm.Barrier()  # (as bench's runs start together)
        job.phase(name, 10.0, 10.0 * comm.size, "flop")
        job.step(1, 1)
    job.close()
    if comm.rank == 0:
        assert [state["name"] for state in sent][-1] == "run 2/2"
        # the second run's count starts from nothing, not from the first's
        assert sent[-1]["done"] == pytest.approx(10.0 * comm.size)
