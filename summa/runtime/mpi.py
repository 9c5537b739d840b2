"""mpi4py's ``MPI``, imported where something first uses it.

``summa --help``, ``plan``, ``model`` and ``options`` run on a laptop without an
MPI library (summa installed without its ``mpich`` extra): the modules they
import name :data:`MPI` from here, which imports ``mpi4py.MPI`` (and so starts
MPI) on its first attribute, and where that fails says in one line what to
install (:class:`MPIUnavailable`).

A plain process (no launcher started it) starts MPI alone, and the MPI's
files in /dev/shm are removed only by ``MPI_Finalize``: before the import,
:func:`load` starts the process's guardian (:mod:`summa.runtime.guardian`),
which removes them once the process has died however it died, and tells it
the files MPI made.

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
from .cleanup import mapped_segments

__all__ = ["MPI", "MPIUnavailable", "load", "launched", "launcher_rank", "INSTALL"]

#: Where launchers put a process's rank (MPICH and Intel's, PMIx, Open MPI, Slurm).
_RANK_VARIABLES = ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID")

#: Environment variables a launcher sets in every rank it starts.
_LAUNCHER_VARIABLES = ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE",
                       "MPI_LOCALNRANKS", "SLURM_STEP_ID", "HYDI_CONTROL_FD")

#: What a machine without an MPI needs, in the words of the user guide's install.
INSTALL = ('pip install "summa-gemm[mpich]" (an MPI from PyPI), or mpi4py built against '
           "your site's MPI (pip install --no-binary=mpi4py mpi4py)")


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
    Where this import starts MPI in a plain process, the process's guardian
    is started first and told the files MPI made after (:func:`_guarded`).
    """
    # (each attribute of MPI comes here: once imported, only the import below)
    guarded = "mpi4py.MPI" not in sys.modules and _guarded()
    try:
        from mpi4py import MPI as module
    except (ImportError, RuntimeError) as exc:
        cause = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise MPIUnavailable(f"no MPI to run on ({cause}); install one: {INSTALL}") from None
    if guarded:
        guardian.tell(mapped_segments())
    return module


def _guarded() -> bool:
    """Start this process's guardian before MPI starts, where MPI will start
    alone: a plain process with mpi4py installed (the files of a launcher's
    ranks are named after their job, not after one process)."""
    if launched() or "mpi4py" not in sys.modules and importlib.util.find_spec("mpi4py") is None:
        return False
    guardian.start()
    return True


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
