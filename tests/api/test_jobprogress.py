"""The whole job's progress line where several ranks run: ``summa multiply``
and ``summa bench`` under mpiexec, ``summa.matmul`` on a pool's workers, and
``summa.matmul`` and ``summa.Matmul`` called by every rank of the user's own
mpiexec (shown only for products long enough to matter)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import summa
from summa.api.jobprogress import block_share
from summa.distribution.grid import ProcessGrid

ROOT = Path(__file__).resolve().parents[2]
#: Lines as often as the job's phases allow (a plain line each 10 ms).
LINES = {"SUMMA_PROGRESS": "lines", "SUMMA_PROGRESS_INTERVAL": "0.01"}


def _mpiexec() -> list[str]:
    beside = Path(sys.executable).with_name("mpiexec")
    found = str(beside) if beside.exists() else shutil.which("mpiexec")
    if not found:
        pytest.skip("no mpiexec")
    return [found]


def _run(args: list, env=None) -> subprocess.CompletedProcess:
    """`args` run to success from the tree's root, summa importable."""
    done = subprocess.run(args, capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=str(ROOT), **(env or {})))
    assert done.returncode == 0, done.stderr
    return done


def _multiply(folder: Path, ranks: int, *extra: str, env=None) -> subprocess.CompletedProcess:
    """``summa multiply`` of A (600x500) and B (500x600) on `ranks` ranks;
    in panels of 16 so that the multiply lasts long enough for lines."""
    rng = np.random.default_rng()
    np.save(folder / "A.npy", rng.uniform(-1, 1, (600, 500)))
    np.save(folder / "B.npy", rng.uniform(-1, 1, (500, 600)))
    cmd = _mpiexec() + ["-n", str(ranks), sys.executable, "-m", "summa", "multiply",
                        str(folder / "A.npy"), str(folder / "B.npy"), "-o", str(folder / "C.npy"),
                        "--backend", "numpy", "--nb", "16", *extra]
    return _run(cmd, env)


def test_multiply_on_several_ranks_shows_every_ranks_work(tmp_path):
    err = _multiply(tmp_path, 2, env=LINES).stderr
    lines = [line for line in err.splitlines() if line.startswith("summa: multiply")]
    assert any("%" in line and "ETA" in line for line in lines), err
    # 2 * 600 * 600 * 500 flops, half of them rank 1's
    assert lines[-1].startswith("summa: multiply done") and lines[-1].endswith(" 360.0 Mflop"), err


@pytest.mark.parametrize("how", [("--quiet",), ()])
def test_quiet_or_off_shows_nothing(tmp_path, how):
    env = dict(LINES, **({} if how else {"SUMMA_PROGRESS": "off"}))
    err = _multiply(tmp_path, 2, *how, env=env).stderr
    assert "summa:" not in err, err


def test_a_pools_caller_draws_its_workers_line(capfd, monkeypatch):
    for variable, value in LINES.items():
        monkeypatch.setenv(variable, value)
    rng = np.random.default_rng()
    a, b = rng.uniform(-1, 1, (600, 500)), rng.uniform(-1, 1, (500, 600))
    summa.matmul(a, b, workers=2, backend="numpy", panel_width=16)
    lines = [line for line in capfd.readouterr().err.splitlines()
             if line.startswith("summa: multiply")]
    assert lines and lines[-1].endswith(" 360.0 Mflop"), lines


@pytest.mark.mpi(min_size=1)
def test_the_ranks_shares_of_a_matrix_make_it_whole(comm):
    with ProcessGrid(comm, None) as grid:
        total = comm.allreduce(block_share((7, 5), grid))
    assert total == pytest.approx(1.0)


def _bench(*extra: str, env=None) -> str:
    """stderr of ``summa bench`` of 600x600x600 on 2 ranks: one warm-up and
    one timed run in panels of 16 (long enough for lines), checked."""
    return _run(_mpiexec() + ["-n", "2", sys.executable, "-m", "summa", "bench", "--backend",
                              "numpy", "--size", "600", "--nb", "16", "--repeat", "1",
                              "--check", "--no-ideal", *extra], env).stderr


def test_bench_on_several_ranks_shows_its_generation_each_run_and_its_check():
    err = _bench(env=LINES)
    ends = [line for line in err.splitlines() if " done, " in line]
    # A and B's 2 * 600 * 600 doubles, then each run's 2 * 600**3 flops, of both ranks
    assert [line.split(" done")[0] for line in ends] == \
        ["summa: generate", "summa: run 1/2", "summa: run 2/2", "summa: check"], err
    assert ends[0].endswith(" 5.8 MB") and ends[1].endswith(" 432.0 Mflop") and \
        ends[2].endswith(" 432.0 Mflop"), err
    assert any(line.startswith("summa: run 2/2") and "%" in line for line in err.splitlines())


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
a, b = (rng.uniform(-1, 1, shape) if rank == 0 else None for shape in ((600, 500), (500, 600)))
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
        # 2 * 600 * 600 * 500 flops, half of them rank 1's
        assert calls[name][-1].startswith("summa: multiply done"), err
        assert calls[name][-1].endswith(" 360.0 Mflop"), err


def test_a_short_library_call_in_one_process_prints_nothing(capfd, monkeypatch):
    for variable, value in LINES.items():
        monkeypatch.setenv(variable, value)
    rng = np.random.default_rng()
    a, b = rng.uniform(-1, 1, (800, 800)), rng.uniform(-1, 1, (800, 800))
    summa.matmul(a[:300, :200], b[:200, :300], workers=1, backend="numpy", panel_width=16)
    assert capfd.readouterr().err == ""
    # a longer one shown from its start (50 panels: lines every 10 ms)
    monkeypatch.setenv("SUMMA_PROGRESS_AFTER", "0")
    summa.matmul(a, b, workers=1, backend="numpy", panel_width=16)
    assert capfd.readouterr().err.splitlines()[-1].endswith(" 1.0 Gflop")
