"""DistMatrix: one rank's block of a 2-D distributed matrix, with its layout
and grid; scatter, gather, random, zeros, and redistribution (transpose)."""

from __future__ import annotations

import numpy as np

from ..runtime.mpi import MPI
from ..device.base import Backend
from ..device.numpy_backend import NumpyBackend
from ..transports.comm import recv_array, send_array
from .layout import Layout, span, take_block
from ..runtime.watchdog import watch

__all__ = ["DistMatrix"]

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
#: Elements generated per step by :meth:`DistMatrix.random`.
RANDOM_CHUNK_ELEMENTS = 1 << 22


def _splitmix64(xp, x):
    """SplitMix64 finaliser: a counter-based hash of uint64 array `x`."""
    x = x + _GOLDEN
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _uniform(xp, counters, seed: int, dtype):
    """Values in [-1, 1) from the hash of (seed, counter); `dtype` real."""
    with np.errstate(over="ignore"):  # wrap-around is the point of the hash
        key = _splitmix64(np, np.uint64(seed % 2**64))
        h = _splitmix64(xp, counters ^ key)
    u = (h >> np.uint64(11)).astype(np.float64) * (2.0 ** -53)
    return (2.0 * u - 1.0).astype(dtype)


class DistMatrix:
    """A matrix distributed over a :class:`~summa.distribution.grid.ProcessGrid`.

    Parameters
    ----------
    grid : ProcessGrid
        The ranks holding the matrix.
    layout : Layout
        Global shape and distribution; its grid shape must equal ``grid.shape``.
    local : array
        This rank's block, of shape ``layout.local_shape(row, col)``:
        C-contiguous, or for a multiply's host-resident operands a view
        lying any way (its plan's storage, :mod:`summa.host.storage`).
    backend : Backend
        Where `local` lives.

    Examples
    --------
    >>> A = DistMatrix.random((1000, 500), "float64", grid, seed=1)  # doctest: +SKIP
    >>> a = A.gather()   # the full array on rank 0, None elsewhere  # doctest: +SKIP
    """

    def __init__(self, grid, layout: Layout, local, backend: Backend | None = None):
        backend = backend or NumpyBackend()
        if layout.grid_shape != tuple(grid.shape):
            raise ValueError(f"layout is for a {layout.grid_shape} grid, not {grid.shape}")
        expect = layout.local_shape(grid.row, grid.col)
        if tuple(local.shape) != expect:
            raise ValueError(f"local block has shape {tuple(local.shape)}, layout expects {expect}")
        self.grid, self.layout, self.local, self.backend = grid, layout, local, backend

    # -- descriptors -------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, int]:
        return self.layout.shape

    @property
    def dtype(self) -> np.dtype:
        return self.local.dtype

    def __repr__(self) -> str:
        return (f"DistMatrix(shape={self.shape}, dtype={self.dtype.name}, "
                f"grid={self.grid.shape[0]}x{self.grid.shape[1]}, block={self.layout.block}, "
                f"backend={self.backend.name})")

    def row_indices(self) -> np.ndarray:
        """Global rows stored on this rank, in local order."""
        return self.layout.rows.global_indices(self.grid.row)

    def col_indices(self) -> np.ndarray:
        """Global columns stored on this rank, in local order."""
        return self.layout.cols.global_indices(self.grid.col)

    # -- constructors ------------------------------------------------------------------
    @classmethod
    def zeros(cls, shape, dtype, grid, backend=None, block=None) -> "DistMatrix":
        """A distributed matrix of zeros."""
        backend = backend or NumpyBackend()
        dtype = backend.check_dtype(dtype)
        layout = Layout(shape, grid.shape, block)
        with backend.on_device():
            local = backend.xp.zeros(layout.local_shape(grid.row, grid.col), dtype=dtype)
        return cls(grid, layout, local, backend)

    @classmethod
    def random(cls, shape, dtype, grid, backend=None, seed: int = 0, block=None,
               compute=None) -> "DistMatrix":
        """Uniform values in [-1, 1) (real and imaginary parts) that depend only on
        `seed` and the global index, never on the grid or the layout.

        Each element is a counter-based hash of ``(seed, i * N + j)`` computed
        where the block lives, so generation costs O(local size) on every rank.
        `compute` (a GPU backend) computes the hash for host-held (`backend`
        NumPy) blocks, row chunk by row chunk: far faster for large matrices.
        """
        backend = backend or NumpyBackend()
        compute = compute or backend
        # The computing backend decides the dtype: host storage holds any (float16 too).
        dtype = compute.check_dtype(dtype)
        layout = Layout(shape, grid.shape, block)
        with compute.on_device(), backend.on_device():
            local = cls._random(layout, grid, (backend, compute), seed, dtype)
        return cls(grid, layout, local, backend)

    @staticmethod
    def _random(layout, grid, backends: tuple, seed: int, dtype):
        """This rank's block of :meth:`random`."""
        backend, compute = backends
        xp = compute.xp
        rows = xp.asarray(layout.rows.global_indices(grid.row).astype(np.uint64))
        cols = xp.asarray(layout.cols.global_indices(grid.col).astype(np.uint64))
        local = backend.xp.empty((rows.size, cols.size), dtype=dtype)
        # Row chunks keep the hash's temporaries small next to the matrix itself.
        step = max(1, RANDOM_CHUNK_ELEMENTS // max(1, cols.size))
        for r0 in range(0, rows.size, step):
            counter = rows[r0:r0 + step, None] * np.uint64(layout.shape[1]) + cols[None, :]
            if dtype.kind == "c":
                real = np.dtype(dtype.char.lower())
                values = _uniform(xp, 2 * counter, seed, real) \
                    + 1j * _uniform(xp, 2 * counter + np.uint64(1), seed, real)
            else:
                values = _uniform(xp, counter, seed, dtype)
            if compute is backend:
                local[r0:r0 + step] = values
            else:  # straight into the block: no host temporary
                compute.to_host(values, out=local[r0:r0 + step])
        return local

    @classmethod
    def from_global(cls, array, grid, backend=None, root: int = 0, block=None,
                    transposed: bool = False, held_only: bool = False) -> "DistMatrix":
        """Scatter a NumPy array held on rank `root` (pass None elsewhere).

        Shape and dtype travel from the root, so other ranks need nothing; an
        unsuitable array raises the same ValueError on every rank. With
        `transposed`, `array` is the matrix's transpose (its rows the
        matrix's columns, as an operand stored by columns lies,
        :mod:`summa.host.storage`): each block is copied from those rows and kept
        so, the rank's block being the transposed view of it. With
        `held_only`, `backend` only holds the blocks (a GPU multiply's host
        blocks: the GPU's backend checked the dtype), so any dtype it can
        hold is taken (float16 on the host for a GPU's GEMMs).
        """
        backend = backend or NumpyBackend()
        comm = grid.comm
        meta = None
        if comm.Get_rank() == root:
            try:
                if array is None:
                    raise ValueError("the root rank must pass an array to scatter")
                array = np.asarray(array)
                if array.ndim != 2:
                    raise ValueError(f"expected a 2-D array, got {array.ndim}-D")
                if not held_only:
                    backend.check_dtype(array.dtype)
                meta = (array.shape, array.dtype.str)
            except ValueError as exc:
                meta = str(exc)
        meta = comm.bcast(meta, root=root)
        if isinstance(meta, str):
            raise ValueError(meta)
        shape, dtype = meta
        layout = Layout(shape[::-1] if transposed else shape, grid.shape, block)
        mine = layout.local_shape(grid.row, grid.col)
        local = np.empty(mine[::-1] if transposed else mine, dtype=np.dtype(dtype))
        if comm.Get_rank() == root:
            for dest in range(comm.Get_size()):
                r, c = comm.Get_coords(dest)
                indices = (layout.rows.global_indices(r), layout.cols.global_indices(c))
                piece = take_block(array, *(indices[::-1] if transposed else indices))
                if dest == root:
                    local = piece  # a private copy already: no second one
                else:
                    with watch(f"rank {dest} to receive its block of the scatter"):
                        # one block in flight bounds the root's extra memory
                        MPI.Request.Waitall(send_array(comm, piece, dest))
        else:
            with watch(f"rank {root} to send this rank's block of the scatter"):
                MPI.Request.Waitall(recv_array(comm, local, root))
        local = backend.asarray(local)
        return cls(grid, layout, local.T if transposed else local, backend)

    @classmethod
    def from_npy(cls, path, grid, backend=None, block=None, trans: str = "N",
                 dtype=None) -> "DistMatrix":
        """Read an .npy file, each rank only its own block (memory-mapped).

        Parameters
        ----------
        path : str
            The file; C or Fortran order.
        trans : {"N", "T", "H"}
            Read the matrix, its transpose or its conjugate transpose; a
            transposed read goes straight into the transposed layout.
        dtype : dtype, optional
            Convert to this dtype (needed for integer files); default: the file's.

        Raises the same ValueError on every rank for a missing, truncated or
        unsuitable file, naming it.
        """
        return _npy_files().read(cls, path, grid, backend, block, trans, dtype)

    def to_npy(self, path) -> None:
        """Write to an .npy file: each rank its own block into a temporary file in
        the target's folder, renamed into place once every rank has succeeded."""
        _npy_files().write(self, path)

    # -- collective operations ---------------------------------------------------------
    def gather(self, root: int = 0, out: np.ndarray | None = None):
        """Assemble the global matrix as a NumPy array on `root` (into `out`,
        of its shape and dtype, where given); None elsewhere."""
        comm = self.grid.comm
        local = np.ascontiguousarray(self.backend.to_host(self.local))
        if comm.Get_rank() != root:
            with watch(f"rank {root} to receive this rank's block of the gather"):
                MPI.Request.Waitall(send_array(comm, local, root))
            return None
        if out is None:
            out = np.empty(self.shape, dtype=self.dtype)
        elif out.shape != tuple(self.shape) or out.dtype != self.dtype:
            raise ValueError(f"out is {out.shape} {out.dtype.name}, the matrix "
                             f"{tuple(self.shape)} {self.dtype.name}")
        for src in range(comm.Get_size()):
            r, c = comm.Get_coords(src)
            rows = self.layout.rows.global_indices(r)
            cols = self.layout.cols.global_indices(c)
            if src == root:
                piece = local
            else:
                piece = np.empty((rows.size, cols.size), dtype=self.dtype)
                with watch(f"rank {src} to send its block of the gather"):
                    MPI.Request.Waitall(recv_array(comm, piece, src))
            out[_block_index(rows, cols)] = piece
        return out

    def copy(self) -> "DistMatrix":
        return DistMatrix(self.grid, self.layout, self.local.copy(), self.backend)

    def transpose(self, conj: bool = False, layout: Layout | None = None) -> "DistMatrix":
        """The (conjugate) transpose on the same grid.

        Parameters
        ----------
        conj : bool
            Conjugate as well.
        layout : Layout, optional
            Layout of the result (shape ``N x M``); by default the natural one
            with block sizes swapped.

        Every rank exchanges with every rank whose blocks intersect its own, one
        message per pair (point-to-point, chunked), through host memory.
        """
        comm = self.grid.comm
        src = self.layout
        dst = src.transposed() if layout is None else layout
        if dst.shape != src.shape[::-1] or dst.grid_shape != src.grid_shape:
            raise ValueError(f"cannot transpose a {src.shape} matrix on {src.grid_shape} "
                             f"into layout {dst}")
        me = comm.Get_rank()
        my_rows = src.rows.global_indices(self.grid.row)
        my_cols = src.cols.global_indices(self.grid.col)
        out_rows = dst.rows.global_indices(self.grid.row)
        out_cols = dst.cols.global_indices(self.grid.col)
        local = np.ascontiguousarray(self.backend.to_host(self.local))
        if conj:
            local = np.conj(local)
        out = np.empty((out_rows.size, out_cols.size), dtype=self.dtype)
        reqs, recvs = [], []
        for peer in range(comm.Get_size()):
            pr, pc = comm.Get_coords(peer)
            # What I send to peer: my src rows among peer's dst cols, and
            # my src cols among peer's dst rows; it arrives transposed.
            _, si, _ = np.intersect1d(my_rows, dst.cols.global_indices(pc), return_indices=True)
            _, sj, _ = np.intersect1d(my_cols, dst.rows.global_indices(pr), return_indices=True)
            # What I receive from peer: its src rows among my dst cols, etc.
            _, _, ri = np.intersect1d(src.cols.global_indices(pc), out_rows, return_indices=True)
            _, _, rj = np.intersect1d(src.rows.global_indices(pr), out_cols, return_indices=True)
            send = np.ascontiguousarray(local[np.ix_(si, sj)].T)
            if peer == me:
                out[np.ix_(ri, rj)] = send
                continue
            if send.size:
                reqs += send_array(comm, send, peer, tag=7)
            if ri.size and rj.size:
                buf = np.empty((ri.size, rj.size), dtype=self.dtype)
                reqs += recv_array(comm, buf, peer, tag=7)
                recvs.append((ri, rj, buf))
        with watch("the other ranks' blocks of a transpose"):
            MPI.Request.Waitall(reqs)
        for ri, rj, buf in recvs:
            out[np.ix_(ri, rj)] = buf
        return DistMatrix(self.grid, dst, self.backend.asarray(out), self.backend)


def _block_index(rows: np.ndarray, cols: np.ndarray):
    """Where a block of `rows` x `cols` goes: two slices where both are
    consecutive (balanced blocks: a plain block copy, not NumPy's gather of
    every element), else NumPy's outer indices."""
    r, c = span(rows), span(cols)
    if r is not None and c is not None:
        return slice(*r), slice(*c)
    return np.ix_(rows, cols)


#: How :class:`DistMatrix` reads and writes ``.npy`` files: files lie above
#: the distribution (:mod:`summa.host.matrixfiles`, which sets this as it
#: loads; summa's own initialisation loads it), so nothing here imports them.
NPY_FILES = None


def _npy_files():
    if NPY_FILES is None:
        raise RuntimeError("summa.host.matrixfiles is not loaded (import summa first)")
    return NPY_FILES
