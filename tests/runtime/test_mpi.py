"""summa.runtime.mpi: what a process tells MPI before it starts."""

import os
import subprocess
import sys

import pytest

from summa.runtime import mpi
from helpers import LAUNCHER_VARIABLES

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def plain(monkeypatch):
    """This process as no launcher started it."""
    for name in LAUNCHER_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def test_a_plain_process_tells_open_mpi_it_is_alone(plain):
    environ = {}
    mpi.tell_singleton(environ)
    assert environ == mpi.SINGLETON


def test_what_the_user_told_open_mpi_stays(plain):
    name = next(iter(mpi.SINGLETON))
    environ = {name: "0", "OTHER": "x"}
    mpi.tell_singleton(environ)
    assert environ == {name: "0", "OTHER": "x"}


def test_a_launched_rank_tells_open_mpi_nothing(plain, monkeypatch):
    monkeypatch.setenv("PMI_RANK", "0")
    environ = {}
    mpi.tell_singleton(environ)
    assert environ == {}


def test_a_plain_process_starting_mpi_has_told_it_first():
    """MPI reads the process's environment as it starts: the variable is
    there once summa's first use of MPI has started it."""
    name = next(iter(mpi.SINGLETON))
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARIABLES and k != name}
    code = ("import os\n"
            "from summa.runtime.mpi import MPI\n"
            f"before = os.environ.get({name!r})\n"
            "MPI.COMM_WORLD.Get_size()\n"
            f"print(before, os.environ.get({name!r}))\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["None", mpi.SINGLETON[name]]
