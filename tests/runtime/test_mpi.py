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
    assert mpi.tell_singleton(environ) == list(mpi.SINGLETON)
    assert environ == mpi.SINGLETON


def test_what_the_user_told_open_mpi_stays(plain):
    name = next(iter(mpi.SINGLETON))
    environ = {name: "0", "OTHER": "x"}
    assert mpi.tell_singleton(environ) == []
    assert environ == {name: "0", "OTHER": "x"}


def test_what_was_told_is_taken_out_again_and_nothing_else(plain):
    name = next(iter(mpi.SINGLETON))
    environ = {"OTHER": "x"}
    mpi.untell(mpi.tell_singleton(environ), environ)
    assert environ == {"OTHER": "x"}
    users = {name: "0"}
    mpi.untell(mpi.tell_singleton(users), users)
    assert users == {name: "0"}


def test_a_launched_rank_tells_open_mpi_nothing(plain, monkeypatch):
    monkeypatch.setenv("PMI_RANK", "0")
    environ = {}
    assert mpi.tell_singleton(environ) == [] and environ == {}


# A spy on the import that starts MPI (mpi4py.MPI initializes it as it is
# imported): what the process's environment held at that moment.
_STARTED = """
import importlib.abc, os, sys
seen = []
class Spy(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname == "mpi4py.MPI":
            seen.append(os.environ.get(NAME))
sys.meta_path.insert(0, Spy())
from summa.runtime.mpi import MPI
before = os.environ.get(NAME)
MPI.COMM_WORLD.Get_size()
print(before, seen[0], os.environ.get(NAME))
"""


@pytest.mark.parametrize("users", [None, "0"])
def test_a_plain_process_tells_mpi_as_it_starts_and_no_longer(users):
    """MPI reads the process's environment as it starts: the variable is
    there while summa's first use of MPI imports it, and gone after (later
    processes inherit none of it); a value the user set is theirs
    throughout."""
    name = next(iter(mpi.SINGLETON))
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARIABLES and k != name}
    if users is not None:
        env[name] = users
    done = subprocess.run([sys.executable, "-c", f"NAME = {name!r}\n" + _STARTED], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    expected = [str(users), mpi.SINGLETON[name], "None"] if users is None else [users] * 3
    assert done.stdout.split() == expected
