"""cuBLASLt's choice of INT8 algorithm (:mod:`summa.device.lt`) without a GPU:
the library's calls stand in, the decisions are summa's."""

from types import SimpleNamespace

import pytest

from summa.device import lt


class _Lib:
    def __getattr__(self, name):
        return lambda *args: 0


class _Gemm(lt.LtGemm):
    """An LtGemm whose library calls do nothing and whose timing is recorded."""

    def __init__(self):
        self.lib, self._plans, self.choices, self.timed = _Lib(), {}, {}, []

    def _desc(self, compute, scale_type):
        return "desc"

    def _layout(self, data_type, rows, cols, ld):
        return ("layout", rows, cols)

    def _candidates(self, desc, layouts, aligns):
        return [SimpleNamespace(algo=f"algo {i}") for i in range(4)]

    def _fastest(self, found, desc, p, layouts, scalar, how):
        self.timed.append((p.m, p.n, p.k))
        self.choices[how.key] = {"index": 2}
        return found[2].algo


def _product(m, n, k):
    return lt.Product(3, m, n, k, 1 << 20, k, 2 << 20, k, 3 << 20, m, 0)


@pytest.fixture
def gemm(monkeypatch):
    remembered = {}
    monkeypatch.setattr(lt, "_remembered", lambda g, key: remembered.get(key))
    monkeypatch.setattr(lt, "_remember", lambda g, key, index: remembered.__setitem__(key, index))
    return _Gemm()


def test_only_int8_products_worth_it_time_their_candidates(gemm):
    """A tile's product is timed (and its choice kept); a row strip of it,
    below INT8_TUNE_MIN_MACS, takes the heuristic's first at once: each
    shape timed costs ~1.2 s the first time on a machine."""
    big, strip = _product(10240, 13654, 16384), _product(2048, 13654, 16384)
    assert big.m * big.n * big.k >= lt.INT8_TUNE_MIN_MACS > strip.m * strip.n * strip.k
    chosen = [gemm._int8_plan(p, p.alignments(), ("int8 TN", p.m, p.n, p.k, (), None), False)[-1]
              for p in (big, strip)]
    assert gemm.timed == [(10240, 13654, 16384)]
    assert chosen == ["algo 2", "algo 0"]


def test_a_remembered_choice_is_taken_without_timing(gemm):
    p = _product(16384, 16384, 16384)
    key = ("int8 TN", p.m, p.n, p.k, (), None)
    first = gemm._int8_plan(p, p.alignments(), key, False)[-1]
    again = _Gemm()._int8_plan(p, p.alignments(), key, False)[-1]  # another process
    assert first == again == "algo 2" and gemm.timed == [(16384,) * 3]
