"""cuBLASLt's choice of INT8 algorithm (:mod:`summa.device.lt`) without a GPU:
the library's calls stand in, the decisions are summa's."""

import sys
import types
from types import SimpleNamespace

import pytest

from summa.device import lt


class _Lib:
    def __getattr__(self, name):
        return lambda *args: 0


class _Gemm(lt.LtGemm):
    """An LtGemm whose library calls do nothing: each candidate "algo i"
    runs a product in `ms[i]` milliseconds of a clock, its events done once
    the clock has passed `done_until` (all of them, by default)."""

    def __init__(self, ms=(5.0, 3.0, 1.0, 4.0), refuses=()):
        self.lib, self._plans, self.choices = _Lib(), {}, {}
        self.ms, self.refuses, self.ran, self.clock = ms, refuses, [], 0.0
        self.done_until = float("inf")

    def _desc(self, compute, scale_type):
        return "desc"

    def _layout(self, data_type, rows, cols, ld):
        return ("layout", rows, cols)

    def _candidates(self, desc, layouts, aligns):
        return [SimpleNamespace(algo=f"algo {i}") for i in range(len(self.ms))]

    def _run(self, desc, algo, scalars, pointers, layouts, stream):
        index = int(algo.split()[1])
        if index in self.refuses:
            return 7
        self.ran.append(index)
        self.clock += self.ms[index] * (2 if self.ran.count(index) == 1 else 1)
        return 0

    def _record(self, stream):
        return SimpleNamespace(at=self.clock)

    def _done(self, event):
        return event.at <= self.done_until

    def _elapsed(self, start, stop):
        return stop.at - start.at


def _product(m, n, k):
    return lt.Product(3, m, n, k, 1 << 20, k, 2 << 20, k, 3 << 20, m, 0)


@pytest.fixture
def remembered(monkeypatch):
    kept = {}
    monkeypatch.setattr(lt, "_remembered", lambda g, key: kept.get(key))
    monkeypatch.setattr(lt, "_remember", lambda g, key, index: kept.__setitem__(key, index))
    return kept


def _key(p):
    return ("int8 TN", p.m, p.n, p.k, tuple(p.alignments().values()), None)


def test_only_int8_products_worth_it_try_their_candidates(remembered):
    """A tile's product tries the candidates on its products; a row strip of
    it, below INT8_TUNE_MIN_MACS, takes the heuristic's first at once."""
    big, strip = _product(10240, 13654, 16384), _product(2048, 13654, 16384)
    assert big.m * big.n * big.k >= lt.INT8_TUNE_MIN_MACS > strip.m * strip.n * strip.k
    gemm = _Gemm()
    chosen = [gemm._int8_plan(p, p.alignments(), _key(p))[-1] for p in (big, strip)]
    assert isinstance(chosen[0], lt._Trial) and chosen[1] == "algo 0"


def _products(gemm, p, count):
    for _ in range(count):
        gemm.int8_tn(p, accumulate=False)


def test_the_candidates_take_turns_on_the_products_and_the_fastest_is_kept(remembered):
    """Every call runs its one product; each candidate runs until its runs
    beyond a warm-up (twice as slow here) took INT8_TRIAL_MS, then the
    fastest runs every product, and the choice is remembered: another
    process takes it without trying (nothing runs for the timing's sake)."""
    ms = (30.0, 20.0, 7.0, 40.0)
    gemm, p = _Gemm(ms), _product(16384, 16384, 16384)
    _products(gemm, p, 60)
    choice = gemm.choices[_key(p)]
    assert len(gemm.ran) == 60 and choice["index"] == 2 and remembered[_key(p)] == 2
    tried = sum(choice["runs"])
    assert [gemm.ran[:tried].count(i) for i in range(len(ms))] == choice["runs"]
    for runs, t, mean in zip(choice["runs"], ms, choice["ms"]):
        assert (runs - 1) * t >= lt.INT8_TRIAL_MS > (runs - 2) * t and mean == t
    assert tried < 50 and gemm.ran[tried:] == [2] * (60 - tried)
    again = _Gemm(ms)
    _products(again, p, 3)
    assert again.ran == [2, 2, 2]


def test_times_not_yet_back_leave_the_choice_open_without_extra_runs(remembered):
    """While the GPU has not reached the trial's runs, each candidate runs
    what it needs (two runs: warm-up and one) and no more; the products go
    on by the first candidate until the times are back."""
    ms = (30.0, 200.0, 150.0)
    gemm, p = _Gemm(ms), _product(16384, 16384, 16384)
    gemm.done_until = -1.0
    _products(gemm, p, 10)
    assert sorted(gemm.ran[:6]) == [0, 0, 1, 1, 2, 2] and gemm.ran[6:] == [0] * 4
    assert _key(p) not in remembered
    gemm.done_until = float("inf")
    _products(gemm, p, 20)
    assert remembered[_key(p)] == 0 and gemm.ran[-5:] == [0] * 5


def test_a_candidate_that_refuses_the_operands_leaves_the_product_to_another(remembered):
    gemm, p = _Gemm((5.0, 1.0, 3.0), refuses={1}), _product(16384, 16384, 16384)
    _products(gemm, p, 80)
    assert len(gemm.ran) == 80 and 1 not in gemm.ran
    assert remembered[_key(p)] == 2


def test_every_candidate_refusing_is_an_error(remembered):
    gemm, p = _Gemm((5.0, 1.0), refuses={0, 1}), _product(16384, 16384, 16384)
    with pytest.raises(RuntimeError, match="cublasLtMatmul"):
        gemm.int8_tn(p, accumulate=False)


def test_the_loaded_library_is_tried_before_any_search(monkeypatch):
    """libcublasLt by its soname first (the copy cuBLAS loaded); the
    pathfinder (which imports and loads a library of its own) only where
    those fail, then the wheel's files."""
    searched = []
    finder = types.ModuleType("cuda.pathfinder")
    finder.load_nvidia_dynamic_lib = lambda name: (searched.append(name)
                                                   or SimpleNamespace(abs_path="/found/lib.so"))
    monkeypatch.setitem(sys.modules, "cuda", types.ModuleType("cuda"))
    monkeypatch.setitem(sys.modules, "cuda.pathfinder", finder)
    candidates = lt._candidates()
    assert [next(candidates), next(candidates)] == ["libcublasLt.so.13", "libcublasLt.so.12"]
    assert not searched
    assert next(candidates) == "/found/lib.so" and searched == ["cublasLt"]
