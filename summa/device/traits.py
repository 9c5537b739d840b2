"""What kind of machine a backend name stands for, without making a backend.

Planning for a machine that is not this one (``summa plan --backend cupy``,
a model profile, :func:`summa.distribution.grid.grid_for`) knows only a backend's name;
this is the one place that reads it. Code that holds a
:class:`summa.device.backend.Backend` asks it (``backend.is_gpu``) instead.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Traits", "traits", "BACKEND_NAMES"]

#: The backends there are (``auto`` picks one of them at run time).
BACKEND_NAMES = ("numpy", "cupy")


@dataclass(frozen=True)
class Traits:
    """What a backend name tells about the ranks' machine.

    Attributes
    ----------
    name : str
        The backend's name as given (``"numpy"``, ``"cupy"``, ``"auto"`` ...).
    gpu : bool
        The GEMMs run on a GPU (CuPy): device memory, streams that overlap
        broadcasts with GEMMs, TF32 and INT8 tensor cores, NCCL and CUDA IPC.
    cpu_only : bool
        The GEMMs surely run on the host (NumPy). ``auto`` is neither: it may
        pick a GPU, so it is not ``gpu`` but not ``cpu_only`` either.

    Examples
    --------
    >>> traits("cupy").gpu, traits("numpy").cpu_only, traits("auto").cpu_only
    (True, True, False)
    """

    name: str
    gpu: bool
    cpu_only: bool


def traits(name: str) -> Traits:
    """The :class:`Traits` of backend `name` (any string: unknown names, such as
    ``"auto"``, are neither GPU nor CPU-only).

    Parameters
    ----------
    name : str
        A backend name.

    Returns
    -------
    Traits
    """
    return Traits(str(name), gpu=name == "cupy", cpu_only=name == "numpy")
