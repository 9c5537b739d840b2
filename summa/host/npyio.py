""".npy files read block by block.

Rank 0 reads a file's header once (with NumPy's own ``numpy.lib.format``) and
checks it against the file's size; every rank then memory-maps the file and
copies out only its own block, C or Fortran order alike. The threaded
positional reads and writes (:func:`rows_io`) and the memory maps of rows
(:func:`map_rows`) are the writer's too (:mod:`summa.host.npyoutput`).
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass

import numpy as np
from numpy.lib import format as npy_format

from ..runtime.mpi import MPI
# (the submodule, not the package, which imports this module as it loads)
import summa.host.filemaps as filemaps
from .copies import parallel_copy
from .. import options
from ..distribution.layout import span, take_block
from ..device.staging import ranks_on_node, usable_cores

__all__ = ["NpyHeader", "NpyError", "read_header", "read_block", "map_block",
           "mapped_by_columns", "take_block", "io_threads", "rows_io", "map_rows", "memmap"]

class NpyError(ValueError):
    """A file is missing, unreadable or unsuitable; the message names it."""


@dataclass(frozen=True)
class NpyHeader:
    """What an .npy header says, plus where the data starts."""

    path: str
    shape: tuple
    dtype: np.dtype
    fortran_order: bool
    offset: int

    @property
    def nbytes(self) -> int:
        """Bytes of the array's data in the file."""
        return int(np.prod(self.shape)) * self.dtype.itemsize


def _read_header_local(path: str) -> NpyHeader:
    if not os.path.exists(path):
        raise NpyError(f"{path}: no such file")
    if os.path.isdir(path):
        raise NpyError(f"{path}: is a folder, not an .npy file")
    try:
        with open(path, "rb") as fh:
            try:
                version = npy_format.read_magic(fh)
            except ValueError:
                raise NpyError(f"{path}: not an .npy file (bad magic string)") from None
            try:
                if version == (1, 0):
                    shape, fortran, dtype = npy_format.read_array_header_1_0(fh)
                elif version == (2, 0):
                    shape, fortran, dtype = npy_format.read_array_header_2_0(fh)
                else:
                    raise ValueError(f"unsupported .npy format version {version}")
            except (ValueError, SyntaxError, EOFError) as exc:
                raise NpyError(f"{path}: unreadable .npy header ({exc})") from None
            offset = fh.tell()
    except OSError as exc:
        raise NpyError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if dtype.hasobject or dtype.kind in "OUSVMmb" or dtype.fields is not None:
        kind = "bool" if dtype.kind == "b" else dtype.name
        raise NpyError(f"{path}: dtype {kind} cannot be multiplied; "
                       "expected float16/32/64 or complex64/128 (or integers with --dtype)")
    if len(shape) != 2:
        raise NpyError(f"{path}: is {len(shape)}-D with shape {shape}; a matrix must be 2-D")
    expect = offset + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    size = os.path.getsize(path)
    if size < expect:
        raise NpyError(f"{path}: truncated: {size} bytes, but its header ({shape} "
                       f"{dtype.name}) needs {expect}")
    return NpyHeader(path, tuple(int(x) for x in shape), dtype, bool(fortran), int(offset))


def read_header(path: str, comm: MPI.Comm, root: int = 0) -> NpyHeader:
    """Read and check an .npy header on `root`; every rank gets it, or the same
    :class:`NpyError` (a ValueError) naming the file."""
    result = None
    if comm.Get_rank() == root:
        try:
            result = _read_header_local(os.fspath(path))
        except NpyError as exc:
            result = str(exc)
    result = comm.bcast(result, root=root)
    if isinstance(result, str):
        raise NpyError(result)
    return result


def memmap(header: NpyHeader, mode: str = "r") -> np.memmap:
    """The file's whole matrix as a NumPy memory map (`mode` as np.memmap's)."""
    return np.memmap(header.path, dtype=header.dtype, mode=mode, offset=header.offset,
                     shape=header.shape, order="F" if header.fortran_order else "C")


def io_threads() -> int:
    """Threads one rank reads or writes a file with: ``SUMMA_IO_THREADS``, else
    its cores shared with the node's ranks that may run on them (as the
    process grid said: :func:`summa.device.staging.ranks_on_node`), at most 16.
    One thread of page faults through a memory map read a disk at a quarter
    of what 8-16 threads of pread did on the H200 machine (issue 23)."""
    asked = options.current().io_threads
    if asked is not None:
        return asked
    # the cores this rank may run on: where the launcher bound it
    return max(1, min(16, usable_cores() // ranks_on_node()))


def rows_io(fd: int, path: str, offset: int, pitch: int, first: int, width: int,
            dest: np.ndarray, write: bool) -> None:
    """Move stored rows between the file and `dest` (rows of `width` bytes at
    ``offset + r * pitch + first``) on :func:`io_threads` threads: one call
    per run of whole rows where they are contiguous in the file, else one
    per row; a short read or any error ends every thread and is raised."""
    rows = dest.shape[0]
    if rows == 0 or width == 0:
        return
    flat = width == pitch and dest.flags.c_contiguous
    threads = min(io_threads(), rows)
    step = -(-rows // (4 * threads)) if flat else -(-rows // threads)
    view = dest.reshape(rows, -1).view(np.uint8)
    done = {"failed": None}

    def move(r0: int) -> None:
        r1 = min(r0 + step, rows)
        pieces = [view[r0:r1].reshape(-1)] if flat else [view[r] for r in range(r0, r1)]
        where = offset + r0 * pitch + first
        for piece in pieces:
            if done["failed"] is not None:
                return
            n = piece.nbytes
            got = 0
            while got < n:
                part = piece[got:]
                moved = os.pwrite(fd, part, where + got) if write else \
                    os.preadv(fd, [part], where + got)
                if moved <= 0:
                    raise NpyError(f"{path}: ends {n - got} bytes early at byte {where + got}"
                                   + ("" if write else "; the file is shorter than its header "
                                      "says (changed while read?)"))
                got += moved
            where += n if flat else pitch
        if write:  # the disk starts on these rows now (summa.host.filemaps.write_out)
            filemaps.write_out(fd, offset + r0 * pitch + first, (r1 - r0 - 1) * pitch + width)

    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(threads, thread_name_prefix="summa-io") as pool:
        futures = [pool.submit(move, r0) for r0 in range(0, rows, step)]
        for future in futures:
            try:
                future.result()
            except BaseException as exc:  # the others stop at their next piece
                done["failed"] = done["failed"] or exc
    if done["failed"] is not None:
        failed = done["failed"]
        if isinstance(failed, OSError):
            raise NpyError(f"{path}: cannot {'write' if write else 'read'} "
                           f"({failed.strerror or failed})") from None
        raise failed


def map_rows(path: str, offset: int, shape, dtype, writable: bool, cols, with_map=False):
    """Rows of a C-ordered matrix stored at `offset` of `path` as a memory map
    (columns ``cols[0]:cols[1]`` of them), read ahead by the kernel; with
    `with_map`, also the mmap object (None for an empty block)."""
    dtype = np.dtype(dtype)
    rows, width = shape
    if rows == 0 or width == 0:
        empty = np.empty((rows, cols[1] - cols[0]), dtype=dtype)
        return (empty, None) if with_map else empty
    aligned = offset // mmap.ALLOCATIONGRANULARITY * mmap.ALLOCATIONGRANULARITY
    length = rows * width * dtype.itemsize + offset - aligned
    with open(path, "r+b" if writable else "rb") as fh:
        mm = mmap.mmap(fh.fileno(), length, offset=aligned,
                       access=mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ)
    data = np.frombuffer(mm, dtype=dtype, count=rows * width, offset=offset - aligned)
    filemaps.register(data, path, offset, writable)  # copies read and write the file itself
    block = data.reshape(rows, width)[:, cols[0]:cols[1]]
    if not writable:
        filemaps.prefetch(block)  # read ahead, in order, at the disk's pace
    return (block, mm) if with_map else block


def mapped_by_columns(header: NpyHeader, transpose: bool = False) -> bool:
    """Does :func:`map_block` of this file (transposed or not) give blocks
    lying by columns?"""
    return header.fortran_order != bool(transpose)


def map_block(header: NpyHeader, rows: np.ndarray, cols: np.ndarray,
              transpose: bool = False) -> np.ndarray | None:
    """This rank's block of the file's matrix (with `transpose`, of its
    transpose: `rows` and `cols` index that) as a read-only memory map, where
    it is one range of rows and of columns (balanced blocks); None elsewhere.
    Where the block's rows are rows of the file (a C-ordered file read as it
    is, a Fortran-ordered one transposed) it is those rows; else it is the
    transpose of the file rows holding its columns: a view lying by columns
    (:mod:`summa.host.storage`), which the GEMMs read as their transposed
    operand, no copy.

    The out-of-core multiply reads such a block as it goes (its copy threads
    fault the pages in while the kernel reads ahead), instead of reading all
    of it before the first GEMM.
    """
    by_columns = mapped_by_columns(header, transpose)
    stored_rows, stored_cols = (cols, rows) if by_columns else (rows, cols)
    span_r, span_c = span(stored_rows), span(stored_cols)
    if (stored_rows.size and span_r is None) or (stored_cols.size and span_c is None):
        return None
    span_r, span_c = span_r or (0, 0), span_c or (0, 0)
    # a Fortran-ordered file stores the transpose in C order
    width = header.shape[0] if header.fortran_order else header.shape[1]
    pitch = width * header.dtype.itemsize
    try:
        block = map_rows(header.path, header.offset + span_r[0] * pitch,
                          (span_r[1] - span_r[0], width), header.dtype, False, span_c)
    except OSError as exc:
        raise NpyError(f"{header.path}: cannot map ({exc.strerror or exc})") from None
    return block.T if by_columns else block


def read_block(header: NpyHeader, rows: np.ndarray, cols: np.ndarray, transpose: bool = False,
               conjugate: bool = False) -> np.ndarray:
    """This rank's block of the file's matrix (or of its (conjugate) transpose),
    as a C-contiguous array in the file's dtype.

    With `transpose`, rows and columns index the transposed matrix, so a
    transposed operand is read straight into its layout with no exchange.
    Blocks of consecutive rows and columns (balanced blocks) are read with
    ``preadv`` on several threads straight into the result; others (block-
    cyclic) through a memory map.
    """
    if transpose:
        rows, cols = cols, rows  # indices of the stored matrix
    # A Fortran-ordered file stores the transpose in C order.
    stored_rows, stored_cols = (cols, rows) if header.fortran_order else (rows, cols)
    span_r, span_c = span(stored_rows), span(stored_cols)
    if span_r is None or span_c is None:
        data = memmap(header)
        block = take_block(data, rows, cols)
    else:
        pitch_items = header.shape[0] if header.fortran_order else header.shape[1]
        item = header.dtype.itemsize
        stored = np.empty((span_r[1] - span_r[0], span_c[1] - span_c[0]), dtype=header.dtype)
        fd = os.open(header.path, os.O_RDONLY)
        try:
            rows_io(fd, header.path, header.offset + span_r[0] * pitch_items * item,
                     pitch_items * item, span_c[0] * item, stored.shape[1] * item, stored,
                     write=False)
        finally:
            os.close(fd)
        block = stored.T if header.fortran_order else stored
    if transpose:
        block = block.T
    if not block.flags.c_contiguous:  # a transposing copy: in tiles, on host threads
        block, lying = np.empty(block.shape, block.dtype), block
        parallel_copy(block, lying)
    if conjugate and block.dtype.kind == "c":
        np.conj(block, out=block)
    return block
