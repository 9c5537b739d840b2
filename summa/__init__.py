"""summa: dense matrix multiplication across many GPUs (or CPU ranks) by SUMMA.

The library is SPMD: every rank of an MPI communicator calls the same functions.

Examples
--------
>>> from mpi4py import MPI
>>> import summa
>>> grid = summa.ProcessGrid(MPI.COMM_WORLD)
>>> A = summa.DistMatrix.random((4000, 3000), "float64", grid, seed=1)
>>> B = summa.DistMatrix.random((3000, 2000), "float64", grid, seed=2)
>>> C = summa.matmul(A, B)
>>> c = C.gather()  # NumPy array on rank 0, None elsewhere
"""

from . import host, options
from .execution.algorithm import SummaStats, gemm, summa
from .device.account import DeviceMemoryError
from .device.backend import get_backend
from .distribution.grid import ProcessGrid
from .distribution.layout import Distribution, Layout
from .distribution.matrix import DistMatrix
from .api.multiply import matmul
from .options import Options
from .api.stateful import Matmul
from .api.verify import freivalds

__version__ = "0.1.0"

__all__ = ["ProcessGrid", "Distribution", "Layout", "DistMatrix", "gemm", "matmul", "Matmul",
           "summa", "SummaStats", "get_backend", "freivalds", "host", "options", "Options",
           "DeviceMemoryError", "__version__"]
