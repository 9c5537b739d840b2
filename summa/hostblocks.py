"""Where a host-resident multiply's blocks of A, B and C lie, for
:func:`summa.multiply.matmul_arrays`: views of the caller's own arrays (one
rank, or arrays every rank maps), read in place where the root holds them
(:mod:`summa.remote`), views of one node-shared copy, or scattered by MPI."""

from __future__ import annotations

import os

import numpy as np
from mpi4py import MPI

from . import host as host_arrays
from . import remote
from .backend import NumpyBackend
from .layout import Layout, span
from .matrix import DistMatrix
from .watchdog import watch

__all__ = ["node_shares", "mapped_everywhere", "operand_block", "result_block",
           "root_block", "root_result_block", "host_block", "own_range", "block_of", "op_view"]


def node_shares(grid, shape, dtype) -> bool:
    """Do all ranks share one node (``grid.topology``) with room for
    node-shared copies of A, B and C (:mod:`summa.host`)? Then blocks are
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
    """Does every rank hold the same node-shared array `x` (:mod:`summa.host`)?
    Collective."""
    token = host_arrays.shared_token(x) if x is not None else None
    return token is not None and all(t == token for t in comm.allgather(token))


def operand_block(x, trans: str, shape, dtype, grid, root: int, shares: bool) -> DistMatrix:
    """This rank's host block of ``op(x)``: a view into a node-shared array
    (the caller's own, held by every rank, or one the root copies `x` into
    on host threads), or where the node cannot share, scattered by MPI."""
    layout, host = Layout(shape, grid.shape), NumpyBackend()
    mapped = mapped_everywhere(x, grid.comm)
    if mapped and trans == "N":
        return DistMatrix(grid, layout, block_of(x, layout, grid), host), x
    if mapped:
        block = block_of(x.T, layout, grid)
        block = np.ascontiguousarray(block.conj() if trans == "H" else block)
        return DistMatrix(grid, layout, block, host), None
    if not shares:
        return _scatter_op(x, trans, grid, host, root), None
    node = host_arrays.empty(shape, dtype, grid.comm)
    if grid.comm.Get_rank() == root:
        host_arrays.parallel_copy(node, op_view(x, trans))
    with watch(f"rank {root} to copy an operand into node-shared memory"):
        grid.comm.Barrier()
    return DistMatrix(grid, layout, block_of(node, layout, grid), host), node


def _in_place(x, shape, dtype, grid, root: int):
    """The root's array `x` (None elsewhere) where every rank of the grid may
    read and write it in place (:mod:`summa.remote`; one node,
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


def root_block(x, trans: str, shape, dtype, grid, root: int):
    """``(block, the whole)`` of an untransposed operand held by the root,
    read where it lies (:func:`_in_place`: no copy into node-shared memory,
    which cost as much as the copy of the pool's owner, a third of its time
    on one H200); None where it cannot be. Collective."""
    if mapped_everywhere(x, grid.comm):
        return None  # node-shared already: every rank maps it
    if grid.comm.allreduce(trans == "N" and (grid.comm.Get_rank() != root or bool(
            x.size and x.flags.c_contiguous)), op=MPI.LAND):
        whole = _in_place(x, shape, dtype, grid, root)
        if whole is not None:
            return DistMatrix(grid, Layout(shape, grid.shape), block_of(whole, Layout(
                shape, grid.shape), grid), NumpyBackend()), whole
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
    """``op(x)`` as the one block of a 1 x 1 grid: `x` itself where its rows
    are contiguous, else one copy."""
    x = op_view(np.asarray(x), trans)
    if x.size and x.strides[1] != x.itemsize:
        x = np.ascontiguousarray(x)
    return DistMatrix(grid, Layout(x.shape, grid.shape), x, NumpyBackend())


def op_view(x: np.ndarray, trans: str) -> np.ndarray:
    """``op(x)``: `x`, or its transpose, both views; only ``"H"`` of a
    complex `x` makes a (conjugated) copy. (A table of all three built
    ``x.conj()`` for every complex operand: 5.3 of 7.7 s of a complex128
    24576³ ``summa.matmul`` on one H200, whose SUMMA itself ran at
    ``cupy.matmul``'s rate.)"""
    if trans == "N":
        return x
    return x.conj().T if trans == "H" and x.dtype.kind == "c" else x.T


def _scatter_op(x, trans: str, grid, host, root: int) -> DistMatrix:
    """``op(x)`` held on `root`, scattered into host blocks."""
    if grid.comm.Get_rank() == root:
        x = op_view(x, trans)
    return DistMatrix.from_global(x, grid, host, root=root)
