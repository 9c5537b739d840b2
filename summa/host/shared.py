"""Host arrays the ranks of a node share: one copy of the data, every rank
reading (or writing) its own block of it where it lies.

An array made here is a file in a memory file system (``/dev/shm``, or
``SUMMA_SHM_DIR``) mapped by every rank of the node and unlinked as soon as
all have mapped it, so the memory goes back to the system when the last rank
drops its array: no rank has to free it collectively, and the array one rank
keeps (a product returned on the root) stays valid on its own.
:func:`summa.matmul` recognises such arrays (the same one on every rank of a
node) and multiplies them without copying them; arrays on the root alone are
copied into one first, by host threads, where the node has the room.
"""

from __future__ import annotations

import mmap
import os

import numpy as np

from ..runtime.mpi import MPI
# (the submodule, not the package, which imports this module as it loads)
import summa.host.filemaps as filemaps
import summa.host.remote as remote
from .copies import parallel_copy, touched
from .npyio import read_header
from .. import options
from ..distribution.topology import Topology, topology_of
from ..runtime.agree import collectively
from ..runtime.cleanup import finalize, new_temporary_file, temporary_files

__all__ = ["empty", "load", "file_map", "attach_file", "attach_remote", "shared_token",
           "node_shared", "shm_dir", "parallel_copy", "touched", "named", "attach", "shared_name",
           "unlink_name", "remove_files_of", "transposed"]

#: Arrays made here, by id: their token (the node's leader and the file
#: name), the same on every rank that maps the array. Entries go with them.
_tokens: dict[int, tuple] = {}
#: Arrays made by :func:`named` in this process, by id: their file's path.
_names: dict[int, str] = {}


def shm_dir() -> str:
    """Where node-shared arrays live (``SUMMA_SHM_DIR``, default /dev/shm)."""
    return options.current().shm_dir


def _room(nbytes: int) -> bool:
    try:
        st = os.statvfs(shm_dir())
    except OSError:
        return False
    return st.f_bavail * st.f_frsize >= nbytes


def _new_file(nbytes: int) -> str:
    """A new file of `nbytes` (a hole: pages come as they are touched) in
    :func:`shm_dir`; its path. The name carries this process's id, so that
    whoever outlives a killed process (a pool's workers, a test) can tell
    which files were its (:func:`remove_files_of`). Until it is unlinked
    (:func:`_unlink`) a hard exit removes it too
    (:data:`summa.runtime.cleanup.temporary_files`): a signal or the watchdog
    ending the process while it lives leaves nothing in /dev/shm."""
    fd, name = new_temporary_file(shm_dir(), f"summa-{os.getpid()}-", ".shared")
    try:
        os.ftruncate(fd, nbytes)
    except BaseException:
        _unlink(name)
        raise
    finally:
        os.close(fd)
    return name


def _unlink(name: str) -> None:
    """Remove a file :func:`_new_file` made (gone already: nothing to do)."""
    try:
        os.unlink(name)
    except OSError:
        pass
    temporary_files.discard(name)


def node_shared(nbytes: int, comm: MPI.Intracomm, topology: Topology | None = None) -> bool:
    """Can every node of `comm` (as `topology` says, default
    :func:`summa.distribution.topology.topology_of`) hold `nbytes` more of shared arrays?
    Collective. Virtual nodes of one machine each ask for their own room."""
    ok = _room(nbytes) if (topology or topology_of(comm)).local_rank == 0 else True
    return comm.allreduce(bool(ok), op=MPI.LAND)


def empty(shape, dtype, comm: MPI.Intracomm | None = None,
          topology: Topology | None = None) -> np.ndarray:
    """A C-ordered array that every rank of a node of `comm` sees, one copy
    per node (as `topology` says, default
    :func:`summa.distribution.topology.topology_of`); collective. Its values are unset
    (zeros, as pages fault in).
    Without `comm` (a plain Python process): one that the workers of
    summa's pool (:mod:`summa.pool`) read and write where it lies, so that
    :func:`summa.matmul` copies nothing (:func:`named`).

    Raises
    ------
    ValueError
        The same on every rank, when some node's shared file system lacks
        the room (naming it and the bytes), before anything is allocated.
    """
    if comm is None:
        return named(shape, dtype)[0]
    shape = tuple(int(s) for s in shape)
    dtype = np.dtype(dtype)
    nbytes = max(1, int(np.prod(shape)) * dtype.itemsize)
    topology = topology or topology_of(comm)
    if not node_shared(nbytes, comm, topology):
        raise ValueError(f"a node's {shm_dir()} has less than {nbytes / 2**30:.1f} GiB free "
                         "for a node-shared array (SUMMA_SHM_DIR names another place)")
    node = topology.node_comm
    name = None
    if node.Get_rank() == 0:
        name = _new_file(nbytes)
    name = node.bcast(name, root=0)
    try:
        mapped = np.memmap(name, dtype=dtype, mode="r+", shape=shape if shape else (1,))
    finally:
        node.Barrier()  # every rank has it mapped (or failed): the name can go
        if node.Get_rank() == 0:
            _unlink(name)
    array = mapped if shape else mapped.reshape(())
    token = (topology.leader, os.path.basename(name))
    _tokens[id(array)] = token
    finalize(array, _tokens.pop, id(array), None)
    return array


def remove_files_of(pid: int) -> None:
    """Remove the shared files process `pid` made (:func:`named`, :func:`empty`)
    and left behind: called where it has ended without removing them."""
    prefix = f"summa-{int(pid)}-"
    try:
        names = os.listdir(shm_dir())
    except OSError:
        return
    for name in names:
        if name.startswith(prefix) and name.endswith(".shared"):
            try:
                os.unlink(os.path.join(shm_dir(), name))
            except OSError:
                pass


def named(shape, dtype) -> tuple[np.ndarray, str]:
    """An array in a named shared file, for processes that are not ranks of
    one communicator yet (summa's worker pool, :mod:`summa.pool`): returns
    it and the file's path, which :func:`attach` maps elsewhere. The file is
    removed when the array is garbage collected (the memory once every
    process has dropped its map)."""
    shape = tuple(int(x) for x in shape)
    dtype = np.dtype(dtype)
    nbytes = max(1, int(np.prod(shape)) * dtype.itemsize)
    if not _room(nbytes):
        raise ValueError(f"{shm_dir()} has less than {nbytes / 2**30:.1f} GiB free for a "
                         "shared array (SUMMA_SHM_DIR names another place)")
    # A Ctrl-C may land anywhere here (the pool's caller makes its copies
    # outside the pool's wait): until the finalizer holds the file, the
    # except removes it, or, between _new_file's return and `name`, the
    # exit (cleanup.temporary_files). test_pool's Ctrl-C test left one so.
    name = key = None
    try:
        name = _new_file(nbytes)
        array = np.memmap(name, dtype=dtype, mode="r+", shape=shape if shape else (1,))
        key = id(array)
        _tokens[key] = ("named", os.path.basename(name))
        _names[key] = name
        finalize(array, _forget, key, name)
    except BaseException:
        if name is not None:
            _forget(key, name)
        raise
    _register(array, name)
    return array, name


def shared_name(x) -> str | None:
    """The file of an array made by :func:`named` here (None for others)."""
    return _names.get(id(x))


def unlink_name(x) -> None:
    """Remove the file of a :func:`named` array now that no other process
    maps it (its memory stays with the array)."""
    name = _names.pop(id(x), None)
    if name is not None:
        _unlink(name)


def attach(name: str, shape, dtype) -> np.ndarray:
    """Map the shared file `name` made by :func:`named` in another process;
    the array has the same token there, so matmul sees one array."""
    shape = tuple(int(x) for x in shape)
    array = np.memmap(name, dtype=np.dtype(dtype), mode="r+", shape=shape if shape else (1,))
    _tokens[id(array)] = ("named", os.path.basename(name))
    finalize(array, _tokens.pop, id(array), None)
    _register(array, name)
    return array


def _register(array: np.ndarray, name: str) -> None:
    """Copies out of a named shared array read its file (:mod:`summa.host.filemaps`:
    one ``preadv`` where a first touch through the map faults page by page);
    copies into it go through the map, on threads: writes into one file take
    its lock in turn (2.3 GB/s on sixteen threads of the H200 machine)."""
    filemaps.register(array, name, 0, writable=False)


def file_map(x) -> tuple[str, int] | None:
    """``(path, offset)`` where `x` is a C-ordered memory map of a file, whole
    as :class:`numpy.memmap` made it (``np.load(path, mmap_mode="r")``): other
    processes map the same bytes (:func:`attach_file`); None for others."""
    if not (isinstance(x, np.memmap) and x.filename and x.size and x.flags.c_contiguous):
        return None
    mm = getattr(x, "_mmap", None)
    if mm is None:
        return None
    start = x.offset - x.offset % mmap.ALLOCATIONGRANULARITY
    if x.ctypes.data != np.frombuffer(mm, np.uint8).ctypes.data + (x.offset - start):
        return None  # a view into the map, not the map as made
    return os.path.realpath(x.filename), int(x.offset)


def attach_remote(where: dict, shape, dtype) -> np.ndarray:
    """A stand-in for another process's array (:func:`summa.host.remote.describe`):
    copies of its views move that process's bytes, and every process that
    attaches it has the same token (one array to matmul); it must be read and
    written only by such copies (:mod:`summa.host.remote`)."""
    array = remote.placeholder(where, tuple(int(x) for x in shape), dtype)
    _tokens[id(array)] = ("remote", int(where["pid"]), int(where["address"]))
    finalize(array, _tokens.pop, id(array), None)
    return array


def attach_file(path: str, offset: int, shape, dtype) -> np.ndarray:
    """Map the file bytes of another process's :func:`file_map` array, read
    only; every process that does has the same token (one array to matmul),
    and copies out of it read the file (:mod:`summa.host.filemaps`)."""
    shape = tuple(int(x) for x in shape)
    array = np.memmap(path, dtype=np.dtype(dtype), mode="r", offset=int(offset),
                      shape=shape if shape else (1,))
    _tokens[id(array)] = ("file", os.path.realpath(path), int(offset))
    finalize(array, _tokens.pop, id(array), None)
    filemaps.register(array, path, int(offset), writable=False)
    return array


def _forget(key: int, name: str) -> None:
    _unlink(name)  # first: nothing may be left in /dev/shm (see cleanup.finalize)
    _tokens.pop(key, None)
    _names.pop(key, None)


def shared_token(x) -> tuple | None:
    """The token of a node-shared array made by :func:`empty` (None for any
    other array): equal on the ranks that share it."""
    return _tokens.get(id(x))


def transposed(x: np.ndarray) -> np.ndarray:
    """``x.T``, the same array to matmul as `x` (its token, where it has one,
    :func:`shared_token`): an operand shared by the rows of its transpose is
    read so where it lies (:mod:`summa.host.storage`)."""
    view = x.T
    token = _tokens.get(id(x))
    if token is not None:
        _tokens[id(view)] = token + ("T",)
        finalize(view, _tokens.pop, id(view), None)
    return view


def load(path, comm: MPI.Intracomm, topology: Topology | None = None) -> np.ndarray:
    """An .npy file as a node-shared array in C order (Fortran-ordered files
    converted), each rank of a node (as `topology` says, :func:`empty`)
    reading its share of the rows on host threads; collective. A read that
    fails on any rank fails on every rank."""
    header = read_header(path, comm)
    topology = topology or topology_of(comm)
    out = empty(header.shape, header.dtype, comm, topology)
    node = topology.node_comm
    rows = out.shape[0] if out.ndim else 0
    r0 = rows * node.Get_rank() // node.Get_size()
    r1 = rows * (node.Get_rank() + 1) // node.Get_size()
    collectively(comm, _read_rows, path, out, r0, r1)
    node.Barrier()  # every rank's rows are in
    return out


def _read_rows(path, out: np.ndarray, r0: int, r1: int) -> None:
    data = np.load(path, mmap_mode="r")
    parallel_copy(out[r0:r1], data[r0:r1])
