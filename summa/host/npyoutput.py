""".npy output, checked and then written atomically block by block.

Before anything is read, rank 0 checks that the output's path can be written
(:func:`check_output_path`: a writable folder, none of the inputs) and that
its folder has room for it (:func:`check_output_room`). Output goes to a
temporary file in the target's folder (:class:`AtomicNpyWriter`): rank 0
writes the header, every rank writes its block and flushes it to disk, and
only when all ranks report success does rank 0 rename the file into place.
On any failure the temporary file is removed, so a half-written product never
appears under the final name.
"""

from __future__ import annotations

import io
import os
import shutil

import numpy as np
from numpy.lib import format as npy_format

from ..runtime.mpi import MPI
from ..runtime.agree import Failure, RankFailure, from_root
from ..runtime.cleanup import new_temporary_file, temporary_files
from ..runtime.faults import inject
from ..distribution.layout import span
from ..runtime.watchdog import watch
from .npyio import NpyError, NpyHeader, map_rows, memmap, rows_io

__all__ = ["AtomicNpyWriter", "check_output_path", "check_output_room", "free_space",
           "npy_bytes"]


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
            block, mm = map_rows(self._tmp, self._header.offset + span_r[0] * pitch,
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
                rows_io(fd, self.path, self._header.offset + span_r[0] * self.shape[1] * item,
                         self.shape[1] * item, span_c[0] * item, block.shape[1] * item, block,
                         write=True)
                os.fsync(fd)
            finally:
                os.close(fd)
            return
        data = memmap(self._header, mode="r+")
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
