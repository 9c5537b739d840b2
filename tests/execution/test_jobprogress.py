"""The whole job's progress line where several ranks run: ``summa multiply``
and ``summa bench`` under mpiexec, ``summa.matmul`` on a pool's workers, and
``summa.matmul`` and ``summa.Matmul`` called by every rank of the user's own
mpiexec (shown only for products long enough to matter)."""

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from mpi4py import MPI

import summa
from summa.execution.jobprogress import block_share, library_reporting
from summa.device.numpy_backend import NumpyBackend
from summa.distribution.grid import ProcessGrid

ROOT = Path(__file__).resolve().parents[2]
#: Lines as often as the job's phases allow (a plain line each 10 ms).
LINES = {"SUMMA_PROGRESS": "lines", "SUMMA_PROGRESS_INTERVAL": "0.01"}


def _mpiexec() -> list[str]:
    """The launcher ./run chose (unbound under Open MPI, whose binding a
    rank warns of), else one beside this Python or on PATH."""
    from test_cli import mpiexec
    return mpiexec()


def _run(args: list, env=None) -> subprocess.CompletedProcess:
    """`args` run to success from the tree's root, summa importable."""
    done = subprocess.run(args, capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=str(ROOT), **(env or {})))
    assert done.returncode == 0, done.stderr
    return done


def _multiply(folder: Path, ranks: int, *extra: str, env=None) -> subprocess.CompletedProcess:
    """``summa multiply`` of A (800x640) and B (640x800) on `ranks` ranks;
    in panels of 16 so that the multiply lasts long enough for lines."""
    rng = np.random.default_rng()
    np.save(folder / "A.npy", rng.uniform(-1, 1, (800, 640)))
    np.save(folder / "B.npy", rng.uniform(-1, 1, (640, 800)))
    cmd = _mpiexec() + ["-n", str(ranks), sys.executable, "-m", "summa", "multiply",
                        str(folder / "A.npy"), str(folder / "B.npy"), "-o", str(folder / "C.npy"),
                        "--backend", "numpy", "--nb", "16", *extra]
    return _run(cmd, env)


def test_multiply_on_several_ranks_shows_every_ranks_work(tmp_path):
    err = _multiply(tmp_path, 2, env=LINES).stderr
    lines = [line for line in err.splitlines() if line.startswith("summa: multiply")]
    assert any("%" in line and "ETA" in line for line in lines), err
    # 2 * 800 * 800 * 640 flops, half of them rank 1's
    assert lines[-1].startswith("summa: multiply done") and lines[-1].endswith(" 819.2 Mflop"), err


@pytest.mark.parametrize("how", [("--quiet",), ()])
def test_quiet_or_off_shows_nothing(tmp_path, how):
    env = dict(LINES, **({} if how else {"SUMMA_PROGRESS": "off"}))
    err = _multiply(tmp_path, 2, *how, env=env).stderr
    assert "summa:" not in err, err


def test_a_pools_caller_draws_its_workers_line(capfd, monkeypatch):
    for variable, value in LINES.items():
        monkeypatch.setenv(variable, value)
    rng = np.random.default_rng()
    a, b = rng.uniform(-1, 1, (800, 640)), rng.uniform(-1, 1, (640, 800))
    summa.matmul(a, b, workers=2, backend="numpy", panel_width=16)
    lines = [line for line in capfd.readouterr().err.splitlines()
             if line.startswith("summa: multiply")]
    assert lines and lines[-1].endswith(" 819.2 Mflop"), lines


@pytest.mark.mpi(min_size=1)
def test_the_ranks_shares_of_a_matrix_make_it_whole(comm):
    with ProcessGrid(comm, None) as grid:
        total = comm.allreduce(block_share((7, 5), grid))
    assert total == pytest.approx(1.0)


def _bench(*extra: str, env=None) -> str:
    """stderr of ``summa bench`` of 800x800x800 on 2 ranks: one warm-up and
    one timed run in panels of 16 (long enough for lines), checked."""
    return _run(_mpiexec() + ["-n", "2", sys.executable, "-m", "summa", "bench", "--backend",
                              "numpy", "--size", "800", "--nb", "16", "--repeat", "1",
                              "--check", "--no-ideal", *extra], env).stderr


def test_bench_on_several_ranks_shows_its_generation_each_run_and_its_check():
    err = _bench(env=LINES)
    # (a phase ends with a line only where one was written: over 10 ms)
    ends = {line.split(" done")[0][len("summa: "):]: line for line in err.splitlines()
            if " done, " in line}
    firsts = [err.find(f"summa: {phase}") for phase in ("generate", "run 1/2", "run 2/2",
                                                         "check")]
    shown = [where for where in firsts if where >= 0]
    assert shown == sorted(shown), err  # the phases in their order
    assert {"run 1/2", "run 2/2"} <= set(ends), err  # each run: 50 panels, tens of ms
    # A and B's 2 * 800 * 800 doubles, each run's 2 * 800**3 flops, of both ranks
    assert ends.get("generate", " 10.2 MB").endswith(" 10.2 MB"), err
    assert ends["run 1/2"].endswith(" 1.0 Gflop") and ends["run 2/2"].endswith(" 1.0 Gflop")


@pytest.mark.parametrize("how", [("--quiet",), ()])
def test_bench_quiet_or_off_shows_nothing(how):
    err = _bench(*how, env=dict(LINES, **({} if how else {"SUMMA_PROGRESS": "off"})))
    assert "summa:" not in err, err


#: Every rank of the user's own mpiexec multiplies: a short product with the
#: settings as they are, then long ones (in panels of 16) shown at once,
#: by the options keyword, by summa.options.set around a Matmul, and with
#: the line turned off; each call's lines after a mark of it.
SPMD = """
import sys
import numpy as np
from mpi4py import MPI
import summa

rank = MPI.COMM_WORLD.Get_rank()
rng = np.random.default_rng(0)
a, b = (rng.uniform(-1, 1, shape) if rank == 0 else None for shape in ((800, 640), (640, 800)))
now = summa.options.current().replace(progress_after=0.0)

def mark(name):
    if rank == 0:
        print("call", name, file=sys.stderr, flush=True)

mark("short")
summa.matmul(a[:50, :40] if rank == 0 else None, b[:40, :50] if rank == 0 else None,
             backend="numpy")
mark("matmul")
summa.matmul(a, b, backend="numpy", panel_width=16, options=now)
mark("Matmul")
with summa.options.set(progress_after=0.0):
    with summa.Matmul(a, b, backend="numpy", panel_width=16) as m:
        m.execute()
mark("off")
summa.matmul(a, b, backend="numpy", panel_width=16, options=now.replace(progress="off"))
mark("end")
"""


def test_a_library_call_on_the_users_own_ranks_shows_long_products_only(tmp_path):
    script = tmp_path / "spmd.py"
    script.write_text(SPMD)
    err = _run(_mpiexec() + ["-n", "2", sys.executable, str(script)], LINES).stderr
    calls = {}
    for part in err.split("call ")[1:]:
        name, _, text = part.partition("\n")
        calls[name] = [line for line in text.splitlines() if line.startswith("summa:")]
    assert calls["short"] == [] and calls["off"] == [], err
    for name in ("matmul", "Matmul"):
        # 2 * 800 * 800 * 640 flops, half of them rank 1's
        assert calls[name][-1].startswith("summa: multiply done"), err
        assert calls[name][-1].endswith(" 819.2 Mflop"), err


def test_a_short_library_call_in_one_process_prints_nothing(capfd, monkeypatch):
    for variable, value in LINES.items():
        monkeypatch.setenv(variable, value)
    rng = np.random.default_rng()
    a, b = rng.uniform(-1, 1, (800, 800)), rng.uniform(-1, 1, (800, 800))
    summa.matmul(a[:300, :200], b[:200, :300], workers=1, backend="numpy", panel_width=16)
    assert capfd.readouterr().err == ""
    # a longer one shown from its start (lines every 10 ms); each GEMM held
    # 50 ms, so that it outlasts the first line on a machine whose cores
    # multiply the whole 1 Gflop in less than 10 ms (one rank's panels go
    # as a few strips)
    monkeypatch.setenv("SUMMA_PROGRESS_AFTER", "0")
    gemm = NumpyBackend.gemm

    def slow_gemm(*args, **kwargs):
        time.sleep(0.05)
        return gemm(*args, **kwargs)

    monkeypatch.setattr(NumpyBackend, "gemm", slow_gemm)
    summa.matmul(a, b, workers=1, backend="numpy", panel_width=16)
    assert capfd.readouterr().err.splitlines()[-1].endswith(" 1.0 Gflop")


def test_a_product_too_small_to_outlast_the_threshold_makes_no_line():
    small, big = (summa.Matmul(np.ones((n, n)), np.ones((n, n)), comm=MPI.COMM_SELF,
                               backend="numpy") for n in (100, 1000))
    with small, big:
        with summa.options.set(progress_after=2.0):  # 2 Mflop, 2 Gflop: over 1 Gflop shows
            with library_reporting(MPI.COMM_SELF, small.plan) as job:
                assert job is None
            with library_reporting(MPI.COMM_SELF, big.plan) as job:
                assert job is not None and job.shown
        with summa.options.set(progress_after=0.0):  # every product: the tests' setting
            with library_reporting(MPI.COMM_SELF, small.plan) as job:
                assert job is not None and job.shown
