"""The progress bar: shown only on a terminal, driven through its phases."""

import sys
import types

from summa.runtime.progress import Progress


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
