"""Host memory and files.

Host arrays the ranks of a node share (:mod:`summa.host.shared`), how an
operand lies in host memory (:mod:`summa.host.storage`: rows, columns or
strided, as the plan records it), a rank's blocks of host arrays, ``.npy``
headers and block reads (:mod:`summa.host.npyio`), the output's checks and
atomic writes (:mod:`summa.host.npyoutput`; :class:`summa.DistMatrix`'s,
:mod:`summa.host.matrixfiles`), which memory maps a file, and reading and
writing another process's memory in place.
``summa.host.empty`` and ``summa.host.load`` (:mod:`summa.host.shared`) are
public here.
"""

from . import matrixfiles  # noqa: F401 -- gives DistMatrix its .npy reader and writer
from .shared import empty, load

__all__ = ["empty", "load"]
