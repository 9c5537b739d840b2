"""Host memory and files.

Host arrays the ranks of a node share (:mod:`summa.host.shared`), how an
operand lies in host memory (:mod:`summa.host.storage`: rows, columns or
strided, as the plan records it), a rank's blocks of host arrays, ``.npy``
headers, block reads and atomic writes (:mod:`summa.host.npyio`), which memory
maps a file, and reading and writing another process's memory in place.
``summa.host.empty`` and ``summa.host.load`` (:mod:`summa.host.shared`) are
public here, imported when first asked for: the modules of this package
import each other, and an import here would make the package's own
initialisation one of them.
"""

import importlib

__all__ = ["empty", "load"]


def __getattr__(name: str):
    if name in __all__:  # as scipy loads its submodules (PEP 562)
        return getattr(importlib.import_module(".shared", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
