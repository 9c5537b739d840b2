""":class:`summa.DistMatrix` to and from ``.npy`` files, each rank only its
own block (:meth:`summa.DistMatrix.from_npy`, :meth:`summa.DistMatrix.to_npy`).

A GPU's block goes straight between the file's memory map and the device,
through the copy threads (:mod:`summa.device.staging`, which read and write
the file's rows: :mod:`summa.host.filemaps`). The methods are the
distribution's; what they do with files lies here, above it, and is handed
to it as this module loads (:data:`summa.distribution.matrix.NPY_FILES`).
"""

from __future__ import annotations

import types

import numpy as np

from ..runtime.mpi import MPI
from ..device.numpy_backend import NumpyBackend
from ..distribution import matrix as _matrix
from ..distribution.layout import Layout
from ..runtime.agree import collectively
from .npyio import map_block, mapped_by_columns, read_block, read_header
from .npyoutput import AtomicNpyWriter, check_output_path

__all__ = ["read_npy", "write_npy", "TRANSPOSE_STRIP"]


def read_npy(kind, path, grid, backend=None, block=None, trans: str = "N", dtype=None):
    """A `kind` (:class:`summa.DistMatrix`) read from the ``.npy`` file
    `path`: :meth:`summa.DistMatrix.from_npy` (its parameters)."""
    backend = backend or NumpyBackend()
    trans = str(trans).upper()
    if trans not in ("N", "T", "H"):
        raise ValueError(f"trans must be N, T or H, got {trans!r}")
    header = read_header(path, grid.comm)
    if dtype is None and header.dtype.kind in "iu":
        raise ValueError(f"{path}: integer dtype {header.dtype.name}; pass a dtype "
                         "(e.g. --dtype float64) to convert it")
    target = backend.check_dtype(header.dtype if dtype is None else dtype)
    shape = header.shape if trans == "N" else header.shape[::-1]
    layout = Layout(shape, grid.shape, block)
    rows = layout.rows.global_indices(grid.row)
    cols = layout.cols.global_indices(grid.col)
    if backend.is_gpu and header.dtype == target:
        # Straight from the file into the GPU: the block's map is read by
        # the copy threads into page-locked chunks (summa.host.filemaps), disk
        # reads and uploads overlapping, no host copy of the block.
        mapped = collectively(grid.comm, map_block, header, rows, cols, trans != "N")
        stored = None if mapped is None else (
            mapped.T if mapped_by_columns(header, trans != "N") else mapped)
        direct = stored is not None and (not stored.size or backend.stages(stored))
        if grid.comm.allreduce(direct, op=MPI.LAND):
            local = collectively(grid.comm, _uploaded, stored, stored is not mapped,
                                 trans == "H", backend)
            return kind(grid, layout, local, backend)
    local = collectively(grid.comm, read_block, header, rows, cols,
                         transpose=trans != "N", conjugate=trans == "H")
    return kind(grid, layout, backend.asarray(local.astype(target, copy=False)), backend)


def write_npy(matrix, path) -> None:
    """Write `matrix` to the ``.npy`` file `path`:
    :meth:`summa.DistMatrix.to_npy`."""
    check_output_path(path, [], matrix.grid.comm)
    comm = matrix.grid.comm
    with AtomicNpyWriter(path, matrix.shape, matrix.dtype, comm) as out:
        if matrix.backend.is_gpu:
            # Straight from the GPU into the file: downloaded chunks are written
            # by the copy threads (pwrite), no host copy of the block.
            mapped = collectively(comm, out.map_block, matrix.row_indices(),
                                  matrix.col_indices())
            direct = mapped is not None and (not mapped.size or (
                matrix.backend.stages(mapped) and matrix.local.flags.c_contiguous))
            if comm.allreduce(direct, op=MPI.LAND):
                collectively(comm, matrix.backend.to_host, matrix.local, mapped)
                collectively(comm, out.flush)
                return
        local = collectively(comm, matrix.backend.to_host, matrix.local)
        out.write_block(np.ascontiguousarray(local), matrix.row_indices(), matrix.col_indices())


#: Columns of a block lying by columns in a file that go up at a time to be
#: transposed on the device (:func:`_uploaded`): the transient beside the
#: block is this many of its rows' worth, not a second block.
TRANSPOSE_STRIP = 4096


def _uploaded(stored, transpose: bool, conjugate: bool, backend):
    """The file rows `stored` (a C-ordered memory map) on `backend`'s device as
    a C-ordered block: with `transpose` their transpose (a block lying by
    columns in the file: a Fortran-ordered file read as it is, a C-ordered
    one transposed), made on the device a strip of :data:`TRANSPOSE_STRIP`
    file rows at a time, so the host reads and uploads only rows, at the
    disk's and the link's rates (a transposing gather on host threads ran a
    24576² Fortran file at 0.3 GB/s, `benchmarks/files.py --order F
    --only "in memory"`); conjugated where `conjugate` (complex)."""
    conjugate = conjugate and stored.dtype.kind == "c"
    if not transpose:
        local = backend.asarray(stored)
        if conjugate:
            backend.conjugate(local)
        return local
    local = backend.xp.empty(stored.shape[::-1], stored.dtype)
    for j0 in range(0, stored.shape[0], TRANSPOSE_STRIP):
        strip = stored[j0:j0 + TRANSPOSE_STRIP]
        backend.transpose(backend.asarray(strip), local[:, j0:j0 + strip.shape[0]], conjugate)
    return local


# The distribution's own methods read and write through these.
_matrix.NPY_FILES = types.SimpleNamespace(read=read_npy, write=write_npy)
