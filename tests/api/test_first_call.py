"""A plain process's first fp64-int8 call: its kernels start compiling
before MPI starts (:func:`summa.api.planned.compile_first`), where the
product may run in this process on its one GPU, and nowhere else."""

import os
import subprocess
import sys

import numpy as np
import pytest

from helpers import LAUNCHER_VARIABLES
from summa.api import planned

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def started(monkeypatch):
    """compile_ahead's calls (whether complex), MPI not started meanwhile."""
    calls = []
    monkeypatch.setattr(planned, "compile_ahead", calls.append)
    monkeypatch.delitem(sys.modules, "mpi4py.MPI", raising=False)
    monkeypatch.setattr(planned.pool, "launched", lambda: False)
    return calls


def test_a_plain_first_fp64_int8_call_starts_compiling(started):
    a = np.ones((3, 4))
    planned.compile_first(a, a.T, None, "fp64-int8")
    planned.compile_first(a, a.T * 1j, None, "fp64-int8", "cupy", 1)
    assert started == [False, True]


@pytest.mark.parametrize("why", ["precision", "comm", "backend", "gpus", "MPI", "launcher"])
def test_nothing_compiles_ahead_where_the_product_may_not_run_here_first(started, why,
                                                                         monkeypatch):
    a = np.ones((3, 4))
    asked = dict(comm=None, precision="fp64-int8", backend="auto", gpus=None)
    if why == "MPI":
        monkeypatch.setitem(sys.modules, "mpi4py.MPI", object())
    elif why == "launcher":
        monkeypatch.setattr(planned.pool, "launched", lambda: True)
    else:
        asked[why] = {"precision": None, "comm": object(), "backend": "numpy", "gpus": 2}[why]
    planned.compile_first(a, a.T, **asked)
    assert started == []


_FIRST_CALLS = """
import sys
import numpy as np
import summa
from summa.api import planned
seen = []
planned.compile_ahead = lambda complex_: seen.append(("mpi4py.MPI" in sys.modules, complex_))
rng = np.random.default_rng(0)
a, b = rng.uniform(-1, 1, (40, 48)), rng.uniform(-1, 1, (48, 36))
for call in (lambda: summa.Matmul(a, b * 1j, precision="fp64-int8", workers=1),
             lambda: summa.matmul(a, b, precision="fp64-int8", workers=1)):
    try:
        call()
    except ValueError as exc:  # (no INT8 tensor cores here: refused after planning)
        assert "cupy backend" in str(exc), exc
print(seen)
"""


def test_the_first_call_starts_compiling_before_mpi_starts():
    """summa.Matmul's first plan in a fresh process starts compiling before
    MPI starts; the next call finds MPI started, and starts nothing."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARIABLES}
    env["PYTHONPATH"] = os.pathsep.join([ROOT, env.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, "-c", _FIRST_CALLS], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[(False, True)]", out.stdout
