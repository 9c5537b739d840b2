"""The progress bar: shown only on a terminal, driven through its phases."""

import sys
import types

from summa.progress import Progress


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
