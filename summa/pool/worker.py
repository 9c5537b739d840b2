"""``python -m summa.pool.worker ADDRESS OWNER SEGMENTS``: one rank of the
pool that a plain Python process started (:mod:`summa.pool`).

The workers are an ordinary MPI job (``mpiexec -n P python -m summa.pool.worker
ADDRESS OWNER SEGMENTS``), one rank per GPU as under mpirun. Every rank connects
back to the pool's owner (process OWNER, whose MPI files are SEGMENTS, joined
by ``os.pathsep``) at ADDRESS (a local socket; the key comes in
``SUMMA_POOL_KEY``) and waits there, asleep, for each command; all run it
(a multiply of shared arrays, :mod:`summa.host.shared`; or the opening, an
execution or the freeing of a :class:`summa.Matmul` kept between commands by
id, :class:`summa.pool.PooledMatmul`), and rank 0 answers
``("done", record)``. The Matmuls kept are freed at stop; a worker that
ends otherwise takes them along. A rank that fails answers ``("error", rank, type,
message, traceback, dead)``, `dead` the ranks it found no longer running
(:func:`_dead_peers`), and ends with a non-zero status, which ends the job:
the others may be inside a collective it will never join. The owner then
starts a new pool. A signal (the owner stopping the job) or the owner's end
(killed, even mid-call) ends each worker at once, removing MPI's shared
memory (the owner's too) and the shared files the owner left
(:func:`summa.runtime.cleanup.hard_exit`). The job starts with SIGINT and
SIGTERM blocked (:mod:`summa.pool.job`): a worker takes them once its
signal handling is in place.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
import traceback
import warnings
from dataclasses import dataclass

from ..execution.jobprogress import library_reporting, pool_reporting
from ..execution.arrays import ArrayProduct, multiply
from ..device.backend import cupy_available, get_backend
from ..device.traits import traits
from ..distribution.grid import node_rank
from ..execution.algorithm import SummaStats
from ..planning.arrays import HeldArrays
from ..planning.request import PlanRequest
from ..precision.ozaki_gpu import check_moduli
from ..planning.precision import asked_moduli
from ..host import shared as host, remote
from ..options import Options, current, set as set_options
from ..runtime.cleanup import hard_exit, mapped_segments, process_alive, remove_segments
from ..runtime.mpi import MPI
from ..runtime.watchdog import handle_signals


def serve(conn, world, peers: dict) -> None:
    """Run the owner's commands until it says stop (or goes away); `peers`
    gets every rank's pid, which the owner sends with each command, as it
    does the ids of the Matmuls to free first. The Matmuls it opens are
    kept between commands, by id, and all freed at stop."""
    held: dict = {}  # id: _Held, a Matmul the owner opened (summa.pool.PooledMatmul)
    while True:
        command = _receive(conn)  # every rank's own: a sleeping wait (no MPI polling)
        received = time.perf_counter()
        if command[0] == "stop":
            _free(held, list(held))
            return
        kind, spec, pids, released = command
        peers.update(pids)
        _free(held, released)
        with pool_reporting(world, spec.get("progress"),
                            lambda state: _answer(conn, ("progress", state))):
            record = _run(world, kind, spec, held, received)
        if world.Get_rank() == 0:
            # None: the system does not let us read the owner (it asks again, with copies)
            _answer(conn, ("no-remote",) if record is None else ("done", record))


@dataclass
class _Held:
    """A Matmul the owner opened, kept between its executions: its
    :class:`summa.execution.arrays.ArrayProduct` and what it was asked."""

    product: object
    asked: "_Asked"
    executions: int = 0


@dataclass(frozen=True)
class _Asked:
    """What the owner's call asked: the plan (a PlanRequest), alpha, the
    backend and fp64-int8's moduli."""

    request: PlanRequest
    alpha: object = 1.0
    backend: str = "auto"
    moduli: int | None = None


def _free(held: dict, ids) -> None:
    """Free the Matmuls of `ids` in `held` (collective: every rank gets the
    same ids in the same command); an id no longer held is passed over."""
    for key in ids:
        kept = held.pop(key, None)
        if kept is not None:
            kept.product.free()


def _run(world, kind: str, spec: dict, held: dict, received: float) -> dict | None:
    """The command `kind` on every rank: its arrays attached, run with the
    owner's settings, and waited for on every rank. Returns this rank's
    record, with where rank 0's seconds went since `received`; None where
    the owner's arrays cannot be read here."""
    settings = Options.from_json(spec["settings"])  # the caller's
    arrays = _arrays(world, spec, settings) if "a" in spec else (None, None, None)
    if arrays is None:
        return None
    began = time.perf_counter()
    with set_options(settings):
        record = _COMMANDS[kind](world, spec, held, *arrays)
    ended = time.perf_counter()
    del arrays
    world.Barrier()  # every block of the product is in place
    record["extra"] = dict(record.get("extra") or {}, worker_attach_seconds=began - received,
                           worker_matmul_seconds=ended - began,
                           worker_after_seconds=time.perf_counter() - ended,
                           worker_matmuls_open=len(held))
    return record


def _arrays(world, spec: dict, settings) -> tuple | None:
    """A, B and C (None where the command makes no product) as the owner
    shipped them; None, on every rank, where some rank may not read the
    owner's memory (:mod:`summa.host.remote`)."""
    parts = [spec[x] for x in "abc"]
    owners = [p["remote"] for p in parts if isinstance(p, dict) and "remote" in p]
    if not world.allreduce(all(remote.allowed(settings) and remote.readable(w)
                               for w in owners), op=MPI.LAND):
        return None
    a = _attach(host, spec["a"], spec["a_shape"], spec["dtype"], spec.get("a_transposed"))
    b = _attach(host, spec["b"], spec["b_shape"], spec["dtype"], spec.get("b_transposed"))
    c = None if spec["c"] is None else _attach(host, spec["c"], spec["c_shape"], spec["dtype"])
    return a, b, c


def _asked(spec: dict) -> _Asked:
    """What the owner's call asked, of its options (a Matmul's ``moduli``
    among them; a multiply's come with the settings)."""
    options = dict(spec["options"])
    trans = {f"trans_{x}": str(options.pop(f"trans_{x}", "N")).upper() for x in "ab"}
    alpha, backend = options.pop("alpha", 1.0), options.pop("backend", "auto")
    moduli = check_moduli(options.pop("moduli", None), options.get("precision"))
    return _Asked(PlanRequest(**options, **trans), alpha, backend, moduli)


def _multiply(world, spec: dict, held: dict, a, b, c) -> dict:
    """``"matmul"``: one product of the owner's arrays into C, planned and
    run as ``summa.matmul`` on these ranks plans and runs it
    (:func:`summa.execution.arrays.multiply`); the record."""
    stats, called = SummaStats(), time.perf_counter()
    asked = _asked(spec)
    with asked_moduli(asked.moduli):
        multiply(HeldArrays(a, b, c), world, asked.request, asked.alpha, stats, asked.backend,
                 called=called)
    return stats.as_dict()


def _open(world, spec: dict, held: dict, a, b, c) -> dict:
    """``"open"``: the product of the owner's operands (a
    :class:`summa.Matmul`'s) planned over every rank, its grid made
    (:class:`summa.execution.arrays.ArrayProduct`), kept by its id until
    freed; the record holds its Plan. (The owner ships the operands with
    each execution: a map of a shared copy kept here would keep its memory.)"""
    asked = _asked(spec)
    with asked_moduli(asked.moduli):  # the plan counts their scratch
        product = ArrayProduct.planned(HeldArrays(a, b), world, 0, asked.request,
                                       asked.backend)
    if product.grid.core_note and product.grid.rank == 0:
        warnings.warn(product.grid.core_note, RuntimeWarning, stacklevel=2)
    held[spec["id"]] = _Held(product, asked)
    return {"plan": product.plan}


def _execute(world, spec: dict, held: dict, a, b, c) -> dict:
    """``"execute"``: the product of the owner's arrays into C by the
    product of the spec's id (checked against its plan), planned again
    first where the GPUs' free memory no longer holds that plan; its
    record, with the executions of that product."""
    kept = held.get(spec["id"])
    if kept is None:  # the owner opens each in the pool it executes in: not to happen
        raise RuntimeError(f"no Matmul of id {spec['id']} is open in this pool")
    arrays, stats, called = HeldArrays(a, b, c), SummaStats(), time.perf_counter()
    product = kept.product
    product.check(arrays)
    with asked_moduli(kept.asked.moduli), library_reporting(world, product.plan):
        note = product.fitted(arrays)
        if note is not None:
            warnings.warn(note, RuntimeWarning, stacklevel=2)
        product.run(arrays, kept.asked.alpha, stats, called)
    kept.executions += 1
    record = stats.as_dict()
    record["extra"] = dict(record.get("extra") or {}, worker_executions=kept.executions)
    return record


def _nothing(world, spec: dict, held: dict, a, b, c) -> dict:
    """``"free"``: the Matmuls it names were freed as it came; nothing more."""
    return {}


#: What each command the owner sends runs (:func:`_run`).
_COMMANDS = {"matmul": _multiply, "open": _open, "execute": _execute, "free": _nothing}


class _OwnerGone(Exception):
    """The connection to the pool's owner broke: there is no one to answer."""


def _receive(conn):
    try:
        return conn.recv()
    except (EOFError, OSError) as exc:
        raise _OwnerGone from exc


def _answer(conn, message) -> None:
    try:
        conn.send(message)
    except OSError as exc:
        raise _OwnerGone from exc


#: Seconds a worker whose MPI call failed looks for the peer whose end caused
#: it: the peer's sockets close, which is how this worker learns, a moment
#: before the peer shows as dead.
DEATH_GRACE = 1.0


def _report(conn, rank: int, peers: dict, exc: BaseException) -> None:
    """Tell the owner that this worker failed with `exc`, and which of
    `peers` (``{rank: pid}``) have died.

    They are looked for here, before this worker ends: once it has, the
    launcher ends the others, and the owner could no longer tell a peer that
    died first (the likely cause of `exc`) from one the launcher ended."""
    detail = "".join(traceback.format_exception(exc)[-6:])
    dead = _dead_peers(peers, rank, DEATH_GRACE if _from_mpi(exc) else 0.0)
    try:
        conn.send(("error", rank, type(exc).__name__, str(exc), detail, dead))
    except OSError:
        pass


def _dead_peers(peers: dict, rank: int, grace: float) -> list[int]:
    """The ranks of `peers` (``{rank: pid}``) other than `rank` that are no
    longer running, looked for during up to `grace` seconds until one is."""
    deadline = time.monotonic() + grace
    while True:
        dead = [r for r, pid in sorted(peers.items()) if r != rank and not process_alive(pid)]
        if dead or time.monotonic() >= deadline:
            return dead
        time.sleep(0.01)


def _from_mpi(exc: BaseException | None) -> bool:
    """Is `exc`, or an exception it arose from, an MPI error (what a peer
    that vanished mid-call leaves the others)?"""
    seen = set()
    while exc is not None and id(exc) not in seen:  # a context chain may loop
        if isinstance(exc, MPI.Exception):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


def _attach(host, where, shape, dtype, transposed: bool = False):
    """An array as the owner shared it: a shared file's name, an .npy file's
    bytes (``{"file", "offset"}``), or its own memory (``{"remote"}``); its
    transpose where the owner shared the rows of that (a Fortran-ordered
    operand, :func:`summa.pool.calls._rows_array`)."""
    if isinstance(where, dict) and "remote" in where:
        array = host.attach_remote(where["remote"], shape, dtype)
    elif isinstance(where, dict):
        array = host.attach_file(where["file"], where["offset"], shape, dtype)
    else:
        array = host.attach(where, shape, dtype)
    return host.transposed(array) if transposed else array


def _warm(world, backend: str) -> None:
    """Get the backend ready while the owner prepares the first call's arrays:
    on GPUs, CuPy imported and CUDA started on this worker's GPU (~1 s of a
    first call otherwise). Whatever fails here fails again, and is reported,
    in the call itself."""
    if traits(backend).cpu_only:
        return
    try:
        if cupy_available():
            get_backend("cupy", node_rank(world)[0])
    except Exception:  # noqa: BLE001 -- see above
        pass


#: MPI's shared memory of the owner (a singleton MPI process of its own), and
#: the folder of its socket
_owner_segments: list = []
_owner_folder: list = []


def _owner_gone(owner: int) -> None:
    """End this worker, removing the shared files and MPI memory its owner
    left (that process has ended, killed perhaps: no one else will) and
    MPI's shared memory of the workers; the launcher then ends the others."""
    host.remove_files_of(owner)
    remove_segments(_owner_segments)
    for folder in _owner_folder:
        shutil.rmtree(folder, ignore_errors=True)
    hard_exit(1)


#: Seconds a worker whose owner's socket closed waits for the owner to show
#: as ended: a killed process's sockets close before its state does.
OWNER_GRACE = 2.0


def _ends(owner: int) -> bool:
    """Does process `owner` end within :data:`OWNER_GRACE` seconds?"""
    deadline = time.monotonic() + OWNER_GRACE
    while process_alive(owner):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


#: The kernel's flag of a process that has begun to exit (``PF_EXITING``).
_PF_EXITING = 0x4


def _dying(pid: int) -> bool:
    """Has process `pid` ended or begun to (killed: its memory is released,
    then its sockets closed, before it shows as ended)?"""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return True
    return fields[0] in ("Z", "X") or bool(int(fields[6]) & _PF_EXITING)


def watch_owner(owner: int) -> None:
    """A thread that ends this worker when process `owner` ends, also while
    a call runs (the socket tells only once the worker reads it again)."""
    import threading

    def wait():
        try:
            fd = os.pidfd_open(owner)
        except (AttributeError, OSError):  # an old kernel: look twice a second
            while process_alive(owner):
                time.sleep(0.5)
        else:
            import select
            select.select([fd], [], [])  # readable once the process has ended
        _owner_gone(owner)

    threading.Thread(target=wait, name="summa-owner", daemon=True).start()


def main(argv=None) -> int:
    from multiprocessing.connection import Client

    args = sys.argv[1:] if argv is None else argv
    key = current().pool_key
    if len(args) != 3 or not key or not args[1].isdigit():
        print("summa.pool.worker: started by summa's pool (summa.matmul in a plain Python "
              "process), not by hand", file=sys.stderr)
        return 2
    world = MPI.COMM_WORLD  # MPI starts here, its guardian first (summa.runtime.mpi.load)
    handle_signals(world, announce=False)  # the owner stops the job so: no word
    owner = int(args[1])
    # as the owner named them: read from its maps they would be lost where it
    # was killed before this worker started
    _owner_segments.extend(filter(None, args[2].split(os.pathsep)))
    if os.path.basename(os.path.dirname(args[0])).startswith("summa-pool-"):
        _owner_folder.append(os.path.dirname(args[0]))
    watch_owner(owner)
    try:
        conn = Client(args[0], authkey=bytes.fromhex(key))
    except OSError:  # its socket gone with it: an owner killed while this worker started
        _owner_gone(owner) if _ends(owner) else hard_exit(1)
    conn.send(("hello", world.Get_rank(), os.getpid(), os.getppid(), mapped_segments()))
    _warm(world, current().pool_warm)
    peers: dict[int, int] = {}
    try:
        serve(conn, world, peers)
    except _OwnerGone:  # nothing to answer (an OSError of the multiply is told, below)
        _owner_gone(owner) if _ends(owner) else hard_exit(1)
    except BaseException as exc:  # noqa: BLE001 -- told to the owner, then the job ends
        _report(conn, world.Get_rank(), peers, exc)
        if _dying(owner):  # the cause, likely: its memory went first, the process next
            _owner_gone(owner)
        hard_exit(1)  # no MPI_Finalize: the others may be stuck in a collective
    conn.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
