"""The whole job's progress line where several ranks run: ``summa multiply``
under mpiexec, and ``summa.matmul`` on a pool's workers."""

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


def _multiply(folder: Path, ranks: int, *extra: str, env=None) -> subprocess.CompletedProcess:
    """``summa multiply`` of A (600x500) and B (500x600) on `ranks` ranks;
    in panels of 16 so that the multiply lasts long enough for lines."""
    rng = np.random.default_rng()
    np.save(folder / "A.npy", rng.uniform(-1, 1, (600, 500)))
    np.save(folder / "B.npy", rng.uniform(-1, 1, (500, 600)))
    cmd = _mpiexec() + ["-n", str(ranks), sys.executable, "-m", "summa", "multiply",
                        str(folder / "A.npy"), str(folder / "B.npy"), "-o", str(folder / "C.npy"),
                        "--backend", "numpy", "--nb", "16", *extra]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=str(ROOT), **(env or {})))
    assert done.returncode == 0, done.stderr
    return done


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
