""".npy files read and written block by block, with atomic output.

Rank 0 reads a file's header once (with NumPy's own ``numpy.lib.format``) and
checks it against the file's size; every rank then memory-maps the file and
copies out only its own block, C or Fortran order alike. Output goes to a
temporary file in the target's folder: rank 0 writes the header, every rank
writes its block and flushes it to disk, and only when all ranks report success
does rank 0 rename the file into place. On any failure the temporary file is
removed, so a half-written product never appears under the final name.
"""

from __future__ import annotations

import io
import mmap
import os
import shutil
from dataclasses import dataclass

import numpy as np
from numpy.lib import format as npy_format

from ..runtime.mpi import MPI
# (the submodule, not the package, which imports this module as it loads)
import summa.host.filemaps as filemaps
from .copies import parallel_copy
from .. import options
from ..runtime.agree import Failure, RankFailure, from_root
from ..runtime.cleanup import new_temporary_file, temporary_files
from ..runtime.faults import inject
from ..distribution.layout import span, take_block
from ..device.staging import ranks_on_node, usable_cores
from ..runtime.watchdog import watch

__all__ = ["NpyHeader", "NpyError", "read_header", "read_block", "map_block",
           "mapped_by_columns", "take_block",
           "AtomicNpyWriter",
           "check_output_path", "check_output_room", "free_space", "npy_bytes", "io_threads"]

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


def _memmap(header: NpyHeader, mode: str = "r") -> np.memmap:
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


def _rows_io(fd: int, path: str, offset: int, pitch: int, first: int, width: int,
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


def _map_rows(path: str, offset: int, shape, dtype, writable: bool, cols, with_map=False):
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
        block = _map_rows(header.path, header.offset + span_r[0] * pitch,
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
        data = _memmap(header)
        block = take_block(data, rows, cols)
    else:
        pitch_items = header.shape[0] if header.fortran_order else header.shape[1]
        item = header.dtype.itemsize
        stored = np.empty((span_r[1] - span_r[0], span_c[1] - span_c[0]), dtype=header.dtype)
        fd = os.open(header.path, os.O_RDONLY)
        try:
            _rows_io(fd, header.path, header.offset + span_r[0] * pitch_items * item,
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


def check_output_path(out: str, inputs: list[str], comm: MPI.Comm, root: int = 0) -> str:
    """Check on `root` that `out` can be written and is none of `inputs`; raise the
    same ValueError everywhere otherwise. Returns the absolute path."""
    problem = None
    path = os.path.abspath(out)
    if comm.Get_rank() == root:
        folder = os.path.dirname(path)
        if os.path.isdir(path):
            problem = f"{out}: is a folder; give a file name for the output"
        elif not os.path.isdir(folder):
            problem = f"{out}: folder {folder} does not exist"
        elif not os.access(folder, os.W_OK):
            problem = f"{out}: folder {folder} is not writable"
        else:
            for name in inputs:
                if name and os.path.exists(name) and (
                        os.path.abspath(name) == path
                        or (os.path.exists(path) and os.path.samefile(name, path))):
                    problem = f"{out}: output would overwrite the input {name}"
                    break
    problem = comm.bcast(problem, root=root)
    if problem:
        raise NpyError(problem)
    return path


def free_space(folder: str) -> int:
    """Bytes a user (not root, whose reserve this leaves out) can still
    write in the file system holding `folder`."""
    return shutil.disk_usage(folder).free


def npy_bytes(shape, dtype) -> int:
    """Size of the .npy file of a C-ordered matrix of `shape` and `dtype`:
    its header (as NumPy writes it) and its data."""
    dtype = np.dtype(dtype)
    header = {"descr": npy_format.dtype_to_descr(dtype), "fortran_order": False,
              "shape": tuple(int(x) for x in shape)}
    buffer = io.BytesIO()
    try:
        npy_format.write_array_header_1_0(buffer, header)
    except ValueError:  # a header over 64 KiB takes format 2.0, as NumPy writes it
        buffer = io.BytesIO()
        npy_format.write_array_header_2_0(buffer, header)
    return buffer.tell() + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize


def _size(nbytes: int) -> str:
    """`nbytes` for a message, in the largest binary unit it reaches."""
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= size:
            return f"{nbytes / size:.1f} {unit}"
    return f"{int(nbytes)} bytes"


def _room_problem(path: str, shape, dtype) -> str | None:
    """Why the .npy file of `shape` and `dtype` cannot be written as
    `path` (its temporary name lies in the same folder), or None. An
    existing `path` is freed only when the new file replaces it, so its
    bytes do not count as room."""
    folder = os.path.dirname(path)
    try:
        free = free_space(folder)
    except OSError:
        return None  # a file system that does not say: the write itself will
    need = npy_bytes(shape, dtype)
    if need <= free:
        return None
    replaced = os.path.getsize(path) if os.path.isfile(path) else 0
    kept = (f" (the existing {os.path.basename(path)}'s {_size(replaced)} are freed only "
            "once the new file replaces it)") if replaced else ""
    return (f"{path}: the output needs {_size(need)} of disk space, and {folder} has "
            f"{_size(free)} free{kept}; free some space or write the output elsewhere")


def check_output_room(out: str, shape, dtype, comm: MPI.Comm, root: int = 0) -> None:
    """Refuse, on every rank, an output of `shape` and `dtype` that the free
    disk space of its folder cannot hold (decided on `root`; collective).

    Raises
    ------
    ValueError
        One line saying what the output needs and what is free, the same
        on every rank, before anything is read or written.
    """
    decided = None
    if comm.Get_rank() == root:
        problem = _room_problem(os.path.abspath(out), shape, dtype)
        decided = Failure.of(NpyError(problem)) if problem else None
    from_root(comm, root, decided)


class AtomicNpyWriter:
    """Collective writer of one distributed matrix to an .npy file, atomically.

    Use as a context manager on every rank::

        with AtomicNpyWriter(path, shape, dtype, comm) as out:
            out.write_block(local, rows, cols)

    Leaving the block normally on every rank renames the file into place;
    an exception anywhere (agreed collectively) removes the temporary file
    and raises :class:`RankFailure` (with `keep_errors`, the exception
    itself goes on, and nothing is exchanged: for blocks whose errors are
    agreed on, or abort the job, by themselves). :meth:`map_block` and :meth:`flush`
    let the product be written in place instead of by :meth:`write_block`.
    """

    def __init__(self, path: str, shape, dtype, comm: MPI.Comm, root: int = 0,
                 keep_errors: bool = False):
        self.path, self.comm, self.root = os.path.abspath(path), comm, root
        self.keep_errors = keep_errors  # an error inside goes on as it is, uncollectively
        self.shape, self.dtype = tuple(int(x) for x in shape), np.dtype(dtype)
        self._tmp = None
        self._header = None
        self._maps: list = []  # blocks written in place (map_block), and their maps
        self._mmaps: list = []
        self._abandoned = False

    def __enter__(self) -> "AtomicNpyWriter":
        made = None
        if self.comm.Get_rank() == self.root:
            # a clear refusal where the disk cannot hold it, not a write that fails part way
            made = _room_problem(self.path, self.shape, self.dtype)
        if self.comm.Get_rank() == self.root and made is None:
            try:
                fd, tmp = new_temporary_file(os.path.dirname(self.path),
                                             f".{os.path.basename(self.path)}.", ".tmp")
                os.close(fd)
                mm = npy_format.open_memmap(tmp, mode="w+", dtype=self.dtype, shape=self.shape)
                made = (tmp, int(mm.offset))
                del mm
                umask = os.umask(0)  # made private; give it the usual mode
                os.umask(umask)
                os.chmod(tmp, 0o666 & ~umask)
            except OSError as exc:
                made = f"{self.path}: cannot create the output ({exc.strerror or exc})"
        made = self.comm.bcast(made, root=self.root)
        if isinstance(made, str):
            raise NpyError(made)
        self._tmp, offset = made
        temporary_files.add(self._tmp)  # any rank's abort removes it
        self._header = NpyHeader(self._tmp, self.shape, self.dtype, False, offset)
        return self

    def map_block(self, rows: np.ndarray, cols: np.ndarray) -> np.ndarray | None:
        """A writable memory map of this rank's block of the output (one range
        of rows and of columns; None otherwise), for the product to be
        written in place; :meth:`flush` puts it on disk."""
        span_r, span_c = span(rows), span(cols)
        if (rows.size and span_r is None) or (cols.size and span_c is None):
            return None
        span_r, span_c = span_r or (0, 0), span_c or (0, 0)
        pitch = self.shape[1] * self.dtype.itemsize
        try:
            block, mm = _map_rows(self._tmp, self._header.offset + span_r[0] * pitch,
                                  (span_r[1] - span_r[0], self.shape[1]), self.dtype, True,
                                  span_c, with_map=True)
        except OSError as exc:
            raise NpyError(f"{self.path}: cannot map the output ({exc.strerror or exc})") \
                from None
        self._maps.append(block)
        if mm is not None:
            self._mmaps.append(mm)
        return block

    def flush(self) -> None:
        """Put the blocks written through :meth:`map_block` on disk."""
        inject("write")
        for mm in self._mmaps:
            mm.flush()
        self._maps, self._mmaps = [], []
        fd = os.open(self._tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def abandon(self) -> None:
        """Give the output up on every rank (collective): the temporary file
        goes, nothing is renamed, and leaving the ``with`` block raises nothing."""
        self._maps, self._mmaps = [], []
        self.comm.Barrier()
        if self.comm.Get_rank() == self.root and os.path.exists(self._tmp):
            os.unlink(self._tmp)
        temporary_files.discard(self._tmp)
        self._abandoned = True

    def write_block(self, block: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> None:
        """Write this rank's block (global `rows` x `cols`) and flush it to disk."""
        inject("write")
        if block.size == 0:
            return
        span_r, span_c = span(rows), span(cols)
        if span_r is not None and span_c is not None:
            # Consecutive rows and columns: pwrite on several threads.
            item = self.dtype.itemsize
            block = np.ascontiguousarray(block)
            fd = os.open(self._tmp, os.O_WRONLY)
            try:
                _rows_io(fd, self.path, self._header.offset + span_r[0] * self.shape[1] * item,
                         self.shape[1] * item, span_c[0] * item, block.shape[1] * item, block,
                         write=True)
                os.fsync(fd)
            finally:
                os.close(fd)
            return
        data = _memmap(self._header, mode="r+")
        data[np.ix_(rows, cols)] = block
        data.flush()
        del data
        fd = os.open(self._tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def __exit__(self, exc_type, exc, tb) -> bool:
        if self._abandoned:
            return False
        self._maps, self._mmaps = [], []
        if exc_type is not None and self.keep_errors:
            # The caller's error goes on as it is, and without a collective here:
            # the other ranks may be elsewhere (an unexpected error aborts the
            # job, whose signal handlers remove the temporary file).
            if self.comm.Get_rank() == self.root:
                if os.path.exists(self._tmp):
                    os.unlink(self._tmp)
                temporary_files.discard(self._tmp)
            return False  # elsewhere it stays listed, for this rank's abort to remove
        mine = None if exc_type is None else f"{exc_type.__name__}: {exc}"
        with watch(f"all ranks to finish writing {self.path}"):
            failures = self.comm.allgather(mine)
        ok = all(f is None for f in failures)
        if self.comm.Get_rank() == self.root:
            if ok:
                os.replace(self._tmp, self.path)
                _fsync_folder(os.path.dirname(self.path))
            elif os.path.exists(self._tmp):
                os.unlink(self._tmp)
        temporary_files.discard(self._tmp)
        with watch(f"rank {self.root} to rename {self.path} into place"):
            self.comm.Barrier()
        if not ok:
            bad = [r for r, f in enumerate(failures) if f is not None]
            raise RankFailure(f"rank {bad[0]} failed while writing {self.path} "
                              f"({failures[bad[0]]}); no output was written") from exc
        return False


def _fsync_folder(folder: str) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
