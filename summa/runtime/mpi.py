"""mpi4py's ``MPI``, imported where something first uses it.

``summa --help``, ``plan``, ``model`` and ``options`` run on a laptop without an
MPI library (summa installed without its ``mpich`` extra): the modules they
import name :data:`MPI` from here, which imports ``mpi4py.MPI`` (and so starts
MPI) on its first attribute, and where that fails says in one line what to
install (:class:`MPIUnavailable`).

The MPI's files in /dev/shm are removed only by ``MPI_Finalize``: before
the import, :func:`load` starts the process's guardian
(:mod:`summa.runtime.guardian`), which removes them once the process has
died however it died, and tells it the files MPI made (:func:`guard`), in a
launcher's ranks as in a plain process.

Examples
--------
>>> from summa.runtime.mpi import MPI
>>> MPI.COMM_WORLD.Get_size() >= 1  # mpi4py imported here, at the first use
True
"""

from __future__ import annotations

import importlib.util
import os
import sys

from . import guardian
from .. import options
from .cleanup import MPI_SEGMENT_PREFIXES, note_segments

__all__ = ["MPI", "MPIUnavailable", "load", "guard", "launched", "launcher_rank", "INSTALL",
           "SINGLETON", "tell_singleton", "untell"]

#: Where launchers put a process's rank (MPICH and Intel's, PMIx, Open MPI, Slurm).
_RANK_VARIABLES = ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID")

#: Environment variables a launcher sets in every rank it starts.
_LAUNCHER_VARIABLES = ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE",
                       "MPI_LOCALNRANKS", "SLURM_STEP_ID", "HYDI_CONTROL_FD")

#: What a machine without an MPI needs, in the words of the user guide's install.
INSTALL = ('pip install "summa-gemm[mpich]" (an MPI from PyPI), or mpi4py built against '
           "your site's MPI (pip install --no-binary=mpi4py mpi4py)")


#: What Open MPI is told where a process that no launcher started (a
#: singleton: a plain script or notebook) starts MPI: that it is alone, so
#: that it starts no daemon of its own. On an H100 host (Open MPI 4.1.6) that
#: cut the start inside a first call from 0.39-0.44 s to 0.29-0.30 s, and
#: ``from mpi4py import MPI`` alone from 0.56-0.57 s to 0.45. The daemon
#: serves only ``MPI_Comm_spawn``, which summa never calls (its pool is an
#: mpiexec job); other MPIs ignore the variable, and a value the user set
#: stays.
SINGLETON = {"OMPI_MCA_ess_singleton_isolated": "1"}


class MPIUnavailable(ImportError):
    """mpi4py, or the MPI library under it, cannot be loaded here."""


def load():
    """The module ``mpi4py.MPI``, imported now where it was not yet.

    Raises
    ------
    MPIUnavailable
        mpi4py is not installed, or finds no MPI library (mpi4py raises
        RuntimeError for that); the message names the cause and :data:`INSTALL`.

    Notes
    -----
    Where this import starts MPI, the process's guardian is started first
    (its files made since are its to remove) and told the files MPI made
    after (:func:`guard`); a process no launcher started tells Open MPI
    first that it is alone (:func:`tell_singleton`), for the start only.
    """
    # (each attribute of MPI comes here: once imported, only the import below)
    starting = "mpi4py.MPI" not in sys.modules and _installed()
    told = []
    if starting:
        told = tell_singleton()
        guardian.start(MPI_SEGMENT_PREFIXES)
    try:
        from mpi4py import MPI as module
    except (ImportError, RuntimeError) as exc:
        cause = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise MPIUnavailable(f"no MPI to run on ({cause}); install one: {INSTALL}") from None
    finally:  # read as MPI started (the import): gone again, so no later process inherits it
        untell(told)
    if starting:
        guard()
    return module


def tell_singleton(environ=None) -> list:
    """Where no launcher started this process, put :data:`SINGLETON` in
    `environ` (default: the process's, which MPI reads as it starts), beside
    what the user set there; returns the names it added (:func:`load`
    takes them out again once MPI has started: the pool's mpiexec, or a
    process the user starts, inherits none of them)."""
    environ = os.environ if environ is None else environ
    if launched():
        return []
    added = [name for name in SINGLETON if name not in environ]
    for name in added:
        environ[name] = SINGLETON[name]
    return added


def untell(names, environ=None) -> None:
    """Take what :func:`tell_singleton` added (`names`) out of `environ`
    (default: the process's) again, once MPI has read it."""
    environ = os.environ if environ is None else environ
    for name in names:
        environ.pop(name, None)


def _installed() -> bool:
    """Is mpi4py installed (imported already, or to be found)?"""
    return "mpi4py" in sys.modules or importlib.util.find_spec("mpi4py") is not None


def guard() -> None:
    """Once MPI has started, have this process's guardian (started now where
    it has none: MPI started outside :func:`load`) remove, once the process
    has died, the MPI files it maps now (noted for
    :func:`summa.runtime.cleanup.hard_exit` too) and summa's shared files
    named after it in the shared folder of the current settings."""
    guardian.start(MPI_SEGMENT_PREFIXES)
    guardian.tell(note_segments())
    guardian.tell_shared_dir(_shared_dir())


def _shared_dir() -> str:
    """Where summa's shared files go (``SUMMA_SHM_DIR``), or /dev/shm where
    a setting is bad: asked before the command reads its settings, which
    refuses it in one line."""
    try:
        return options.current().shm_dir
    except ValueError:
        return "/dev/shm"


def launched() -> bool:
    """Was this process started by an MPI launcher (mpirun, srun, a pool)?"""
    return any(v in os.environ for v in _LAUNCHER_VARIABLES)


def launcher_rank() -> int:
    """This process's rank as its launcher gave it, without starting MPI
    (0 where no launcher started it): a command that needs no MPI under
    ``mpiexec -n 4`` prints once, from rank 0."""
    for variable in _RANK_VARIABLES:
        text = os.environ.get(variable, "")
        if text.strip().isdigit():
            return int(text)
    return 0


class _Deferred:
    """Stands for ``mpi4py.MPI``: each attribute is the module's, which
    :func:`load` imports on the first."""

    __slots__ = ()

    def __getattr__(self, name: str):
        return getattr(load(), name)

    def __repr__(self) -> str:
        return "<mpi4py.MPI, imported on first use>"


#: ``mpi4py.MPI`` for the package's modules, imported on its first use.
MPI = _Deferred()
