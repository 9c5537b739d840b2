"""Where a host-resident multiply's blocks of A, B and C lie, for
:func:`summa.api.multiply.matmul_arrays`: views of the caller's own arrays (one
rank, or arrays every rank maps), read in place where the root holds them
(:mod:`summa.host.remote`), views of one node-shared copy, or scattered by MPI.

Every block of ``op(x)`` keeps the plan's storage (:mod:`summa.host.storage`):
the blocks of an operand stored by columns are views of its transpose's
rows (a copy, node-shared or scattered, copies those rows, never transposes),
and op H is conjugated by the GEMMs, not here."""

from __future__ import annotations

import os

import numpy as np

from ..runtime.mpi import MPI
# (the submodule, not the package, which imports this module as it loads)
import summa.host.shared as host_arrays
import summa.host.remote as remote
from ..device.numpy_backend import NumpyBackend
from ..distribution.layout import Layout, span
from ..distribution.matrix import DistMatrix
from .storage import as_rows, conjugated, op_view, rows_shape, transposed
from ..runtime.watchdog import watch

__all__ = ["node_shares", "mapped_everywhere", "operand_block", "result_block",
           "root_block", "root_result_block", "host_block", "own_range", "block_of",
           "stored_operand", "scattered"]


def node_shares(grid, shape, dtype) -> bool:
    """Do all ranks share one node (``grid.topology``) with room for
    node-shared copies of A, B and C (:mod:`summa.host.shared`)? Then blocks are
    views into one copy of each; else MPI scatters and gathers them.
    Collective."""
    m, n, k = shape
    need = (m * k + k * n + m * n) * np.dtype(dtype).itemsize
    return grid.topology.one_node and host_arrays.node_shared(need, grid.comm, grid.topology)


def own_range(dist, p: int) -> slice:
    """Process `p`'s indices of a balanced distribution, as a slice."""
    run = span(dist.global_indices(p))
    return slice(*run) if run else slice(0, 0)


def block_of(x: np.ndarray, layout: Layout, grid) -> np.ndarray:
    """This rank's block of the global `x` (balanced blocks: a view)."""
    return x[own_range(layout.rows, grid.row), own_range(layout.cols, grid.col)]


def mapped_everywhere(x, comm) -> bool:
    """Does every rank hold the same node-shared array `x` (:mod:`summa.host.shared`)?
    Collective."""
    token = host_arrays.shared_token(x) if x is not None else None
    return token is not None and all(t == token for t in comm.allgather(token))


def operand_block(x, trans: str, storage: str, shape, dtype, grid, root: int,
                  shares: bool) -> tuple:
    """``(this rank's host block of op(x), the whole op(x) or None)``: a view
    into a node-shared array (the caller's own, held by every rank, or one
    the root copies `x`'s rows into on host threads, in its `storage`), or
    where the node cannot share, scattered by MPI in its storage; op H's
    conjugation is left to the GEMMs."""
    layout, host = Layout(shape, grid.shape), NumpyBackend()
    if mapped_everywhere(x, grid.comm):
        whole = op_view(x, trans)
        return DistMatrix(grid, layout, block_of(whole, layout, grid), host), whole
    if not shares:
        return scattered(x, trans, storage, grid, host, root), None
    node = host_arrays.empty(rows_shape(shape, storage), dtype, grid.comm)
    if grid.comm.Get_rank() == root:  # rows to rows: no transposing copy
        host_arrays.parallel_copy(node, as_rows(op_view(x, trans), storage))
    with watch(f"rank {root} to copy an operand into node-shared memory"):
        grid.comm.Barrier()
    whole = as_rows(node, storage)
    return DistMatrix(grid, layout, block_of(whole, layout, grid), host), whole


def _in_place(x, shape, dtype, grid, root: int):
    """The root's array `x` (None elsewhere) where every rank of the grid may
    read and write it in place (:mod:`summa.host.remote`; one node,
    ``grid.topology``): `x` itself on the root, a stand-in on the others;
    None on every rank where some rank may not. Collective."""
    if not (grid.topology.one_node
            and grid.comm.allreduce(remote.allowed(), op=MPI.LAND)):
        return None
    rank = grid.comm.Get_rank()
    if rank == root:
        # The launcher's other children (the node's ranks) may read this one.
        remote.allow_readers(os.getppid())
    where = grid.comm.bcast(remote.describe(x) if rank == root else None, root=root)
    if where is None or not grid.comm.allreduce(rank == root or remote.readable(where),
                                                op=MPI.LAND):
        return None
    return x if rank == root else host_arrays.attach_remote(where, shape, dtype)


def root_block(x, trans: str, storage: str, shape, dtype, grid, root: int):
    """``(block, the whole op(x))`` of an operand held by the root whose rows
    in its `storage` (:func:`summa.host.storage.as_rows`) are one C-ordered
    array, read where it lies (:func:`_in_place`: no copy into node-shared
    memory, which cost as much as the copy of the pool's owner, a third of
    its time on one H200); None where it cannot be. Collective."""
    if mapped_everywhere(x, grid.comm):
        return None  # node-shared already: every rank maps it
    rows = as_rows(op_view(x, trans), storage) if grid.comm.Get_rank() == root else None
    if grid.comm.allreduce(rows is None or bool(rows.size and rows.flags.c_contiguous),
                           op=MPI.LAND):
        rows = _in_place(rows, rows_shape(shape, storage), dtype, grid, root)
        if rows is not None:
            layout = Layout(shape, grid.shape)
            whole = as_rows(rows, storage)
            return DistMatrix(grid, layout, block_of(whole, layout, grid), NumpyBackend()), whole
    return None


def root_result_block(out, shape, dtype, grid, root: int):
    """``(block, the whole)`` of the product in the root's own array (`out`,
    or a new one touched on its threads), every rank writing its block there
    in place (:func:`_in_place`); None where it cannot be. Collective."""
    rank = grid.comm.Get_rank()
    if mapped_everywhere(out, grid.comm) or not grid.comm.allreduce(
            rank != root or out is None or out.flags.c_contiguous, op=MPI.LAND):
        return None
    whole = out if rank != root or out is not None else host_arrays.touched(shape, dtype)
    whole = _in_place(whole, shape, dtype, grid, root)
    if whole is None:
        return None
    layout = Layout(shape, grid.shape)
    return DistMatrix(grid, layout, block_of(whole, layout, grid), NumpyBackend()), whole


def result_block(out, shape, dtype, grid, shares: bool):
    """This rank's block of the product and the node-shared array it lies in
    (`out` itself where every rank maps it; None: gathered by MPI)."""
    layout, host = Layout(shape, grid.shape), NumpyBackend()
    if mapped_everywhere(out, grid.comm):
        node = out
    elif shares:
        node = host_arrays.empty(shape, dtype, grid.comm)
    else:
        return DistMatrix(grid, layout, np.empty(layout.local_shape(grid.row, grid.col), dtype),
                          host), None
    return DistMatrix(grid, layout, block_of(node, layout, grid), host), node


def host_block(x: np.ndarray, trans: str, grid) -> DistMatrix:
    """``op(x)`` as the one block of a 1 x 1 grid: a view of `x` as it lies,
    whatever its strides (the plan's storage says how it is read; op H is
    conjugated by the GEMMs), never a copy."""
    x = op_view(np.asarray(x), trans)
    return DistMatrix(grid, Layout(x.shape, grid.shape), x, NumpyBackend())


def scattered(x, trans: str, storage: str, grid, backend, root: int) -> DistMatrix:
    """``op(x)`` held on `root` (None elsewhere), scattered by MPI into
    blocks on `backend`: each block copied from `x`'s rows in its `storage`
    (no transposing copy), and kept so: a block stored by columns is the
    transposed view of the rows it came as. The entry point checked the
    dtype against the backend that multiplies. Collective."""
    rows = as_rows(op_view(x, trans), storage) if grid.comm.Get_rank() == root else None
    return DistMatrix.from_global(rows, grid, backend, root=root,
                                  transposed=transposed(storage), held_only=True)


def stored_operand(x, trans: str, storage: str, grid, backend, root: int) -> tuple:
    """``(op(x) of the root's x on `backend`, whether the GEMMs still
    conjugate it)`` for an in-memory multiply.

    One rank: `x` as it lies, on the device its rows as they lie
    (:func:`summa.host.storage.as_rows`; NumPy: `x` itself, no copy), the GEMMs
    reading it transposed, and conjugating it where it is (cuBLAS's op C;
    NumPy a strip at a time) but for a device copy by rows, conjugated in
    place (cuBLAS has no conjugate without transpose). A grid: scattered in
    its storage (:func:`scattered`), then each block made C-ordered and
    conjugated on its device (a transpose there runs at memory speed), for
    the broadcasts of panels. Collective.
    """
    if grid.size == 1:
        x = np.asarray(x)
        local = as_rows(backend.asarray(as_rows(op_view(x, trans), storage)), storage)
        conj = conjugated(trans, x.dtype)
        if conj and backend.is_gpu and not transposed(storage):
            backend.conjugate(local)  # the upload: its own memory
            conj = False
        return DistMatrix(grid, Layout(local.shape, grid.shape), local, backend), conj
    X = scattered(x, trans, storage, grid, backend, root)
    conj = conjugated(trans, X.dtype)
    if transposed(storage):
        local = backend.xp.empty(X.local.shape, X.dtype)
        backend.transpose(X.local.T, local, conj)
        X = DistMatrix(grid, X.layout, local, backend)
    elif conj:
        backend.conjugate(X.local)  # its own block: scattered, never the caller's
    return X, False
