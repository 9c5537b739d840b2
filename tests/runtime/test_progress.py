"""The progress bar of one rank (shown only on a terminal, driven through its
phases), and the one line of a job of many ranks."""

import io
import sys
import time
import types

import pytest

from summa.runtime.progress import (PHASES, Display, JobProgress, Progress, Tally,
                                    display_mode, remaining)


class FakeBar:
    made = []

    def __init__(self, total, desc, **kwargs):
        self.total, self.desc, self.n, self.closed = total, desc, 0, False
        FakeBar.made.append(self)

    def refresh(self):
        pass

    def close(self):
        self.closed = True


def test_no_bar_off_a_terminal_or_when_disabled(monkeypatch):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False, raising=False)
    p = Progress(True)
    p.phase("read", 2)
    p.step(1, 2)
    p.close()
    assert p._bar is None
    assert Progress(False)._tqdm is None


def test_bar_follows_phases_on_a_terminal(monkeypatch):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    monkeypatch.setitem(sys.modules, "tqdm", types.SimpleNamespace(tqdm=FakeBar))
    FakeBar.made = []
    p = Progress(True)
    p.phase("read", 2)
    p.step(2, 2)
    p.phase("multiply", 1)
    p.step(5, 8)
    p.close()
    read, multiply = FakeBar.made
    assert (read.desc, read.n, read.closed) == ("read", 2, True)
    assert (multiply.desc, multiply.n, multiply.total, multiply.closed) == ("multiply", 5, 8, True)


def test_bench_shows_generation_each_run_and_the_check(monkeypatch):
    from mpi4py import MPI
    import io
    from summa import cli
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    monkeypatch.setitem(sys.modules, "tqdm", types.SimpleNamespace(tqdm=FakeBar))
    FakeBar.made = []
    args = ["bench", "--backend", "numpy", "--size", "96", "--nb", "32", "--repeat", "2",
            "--check", "--no-ideal"]
    assert cli.main(args, MPI.COMM_SELF, io.StringIO()) == 0
    assert [b.desc for b in FakeBar.made] == ["generate", "run 1/3", "run 2/3", "run 3/3",
                                              "check"]
    assert all(b.closed for b in FakeBar.made)
    assert all(b.n == b.total >= 1 for b in FakeBar.made[1:4])  # driven by the SUMMA steps
    FakeBar.made = []
    assert cli.main(args + ["--quiet"], MPI.COMM_SELF, io.StringIO()) == 0
    assert FakeBar.made == []


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


def _shown(mode: str, seconds: float) -> str:
    stream, done = io.StringIO(), [0.0]
    display = Display(mode, 0.02, stream)
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


@pytest.mark.mpi(min_size=1)
def test_every_ranks_amounts_reach_rank_0(comm):
    tally = Tally(comm)
    tally.add("read", 10.0 * (comm.rank + 1))
    tally.add("multiply", 1.0)
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
