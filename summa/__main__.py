"""``python -m summa``: run the CLI; never leave a rank hanging.

* A ValueError (bad input) is raised identically on every rank by design: the
  ranks confirm that on a private communicator, rank 0 prints one line and all
  exit with status 2. If some rank does not confirm within the grace period,
  the error was not collective, so the job is aborted instead of left hanging.
* A failure that the ranks already agreed on (:class:`~summa.runtime.agree.RankFailure`)
  is reported once and exits with status 1.
* Any other exception prints the rank and the traceback, then aborts the job.
* SIGINT/SIGTERM stop every rank promptly, even inside MPI calls, removing
  temporary output files (status 128 + signal number); see summa.runtime.watchdog.
* Help, ``plan``, ``model`` and ``options`` start no MPI (they run where none is
  installed); a command that needs one says, where it is missing, what to install.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
import time
import traceback

EXIT_USAGE = 2
#: Seconds the ranks wait for each other to confirm a collective error
#: (``SUMMA_ERROR_GRACE`` overrides).
ERROR_GRACE_SECONDS = 10.0


def _grace() -> float:
    """``SUMMA_ERROR_GRACE``, or the default where a setting is bad (asked
    while an error is handled: a bad value must not hide that error; the
    command refuses it on its own)."""
    from .options import current
    try:
        return current().error_grace
    except ValueError:
        return ERROR_GRACE_SECONDS


def _all_ranks_failed(ctl, grace: float) -> bool:
    """True when every rank of `ctl` reaches this point within `grace` seconds."""
    request = ctl.Ibarrier()
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if request.Test():
            return True
        time.sleep(0.01)
    return False


#: Commands that, started without a launcher, run on every GPU (or SUMMA_WORKERS ranks).
_RELAUNCHED = ("multiply",)


def _relaunch(argv) -> int | None:
    """``python -m summa multiply ...`` without mpirun on a machine with several
    GPUs: the same command again under the MPI's own mpiexec, one rank per
    GPU (``SUMMA_GPUS``; on CPUs ``SUMMA_WORKERS``, else one per 8 cores), the
    rule of summa.matmul's pool in a script; returns its exit status. Does
    nothing (None) under a launcher or for one rank.

    This process stays the job's parent (:func:`summa.pool.job.run`): a
    Ctrl-C, SIGTERM or SIGHUP reaches the ranks as a signal they clean up
    after, also while they start. Its own MPI is finalized first: an exec
    into the launcher, or a kill, left MPI's file of this process's start
    in /dev/shm."""
    args = sys.argv[1:] if argv is None else list(argv)
    if not args or args[0] not in _RELAUNCHED:
        return None
    if importlib.util.find_spec("mpi4py") is None:  # no MPI to launch: main says so
        return None
    from .pool import WorkerError, launched, mpiexec_command, pool_size
    from .device.traits import traits
    if launched():
        return None
    backend = next((args[i + 1] for i, a in enumerate(args[:-1]) if a == "--backend"), "auto")
    try:
        size = pool_size(None, None, use_gpus=not traits(backend).cpu_only)  # summa.matmul's rule
    except ValueError:  # a bad setting: the command says so, in one line
        return None
    if size <= 1:
        return None
    try:
        command = mpiexec_command() + ["-n", str(size), sys.executable, "-m", "summa", *args]
    except WorkerError:  # no launcher: no MPI either, which main says in one line
        return None
    sys.stdout.flush()
    # The environment as the process began, not as MPI's start in this process
    # left it: Open MPI's singleton start sets variables (PMIX_*, OMPI_*) that
    # made the launcher exit 1 without a word.
    env = dict(os.environ)
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    from .pool.job import run
    from .runtime.mpi import load
    load().Finalize()  # started as any plain process's MPI (its guardian first)
    fd, told = tempfile.mkstemp(prefix="summa-status-")
    os.close(fd)
    try:
        env[JOB_STATUS] = told
        return run(command, env) or _status_told(told)
    finally:
        os.unlink(told)


#: The file where the ranks of a job :func:`_relaunch` started tell it how
#: they ended (:func:`_told`).
JOB_STATUS = "SUMMA_JOB_STATUS"


def _told(world, status: int) -> int:
    """`status`, or 0 where this rank's job was started by ``python -m
    summa`` itself (:func:`_relaunch`) and it failed as agreed (bad input,
    a failed check) or was stopped (the parent's Ctrl-C passed on: MPICH's
    launcher printed "BAD TERMINATION" for a rank that exited 130 before it
    took the signal itself): the status is written to its parent's file
    instead, which the parent exits with. Its launcher then sees ranks that ended
    well and adds nothing to the command's one line (Open MPI's mpirun
    prints a 12-line banner after any rank exits non-zero)."""
    told = os.environ.get(JOB_STATUS)
    if not told or status == 0:
        return status
    with open(told, "a") as fh:  # (a line of its own from each rank: appended whole)
        fh.write(f"{world.Get_rank()} {status}\n")
    return 0


def _status_told(told: str) -> int:
    """The status the ranks wrote to `told` (:func:`_told`): the highest; 0
    where none wrote one."""
    with open(told) as fh:
        return max((int(line.split()[1]) for line in fh if line.strip()), default=0)


def main(argv=None) -> int:
    from .cli import runs_alone
    if runs_alone(argv):  # help, plan, model, options: no MPI started, none needed
        return _alone(argv)
    relaunched = _relaunch(argv)
    if relaunched is not None:
        return relaunched
    from .runtime.mpi import MPIUnavailable, load
    try:
        MPI = load()
    except MPIUnavailable as exc:  # installed without an MPI: say which to install
        print(f"summa: error: {exc}", file=sys.stderr, flush=True)
        return EXIT_USAGE

    from .runtime.watchdog import handle_signals, wait_if_stopping

    world = MPI.COMM_WORLD
    # first: a signal before it ends the process as Python's default; a rank
    # of a job this command started itself tells its parent (no launcher's
    # banner after a rank that ended by the stop its parent asked)
    handle_signals(world, told=lambda status: _told(world, status))

    from . import cli

    ctl = world.Dup()  # error agreement never collides with the job's own messages
    try:
        status = cli.main(argv, world)
    except Exception as exc:
        wait_if_stopping()  # an error the stop itself caused (its output removed) says nothing
        return _told(world, _failed(world, ctl, exc))
    wait_if_stopping()  # a stopping process ends with the signal's status, not this one
    return _told(world, status)


def _alone(argv) -> int:
    """Run a command that needs no MPI (:func:`summa.cli.runs_alone`) in this
    process alone: bad input one line from the launcher's rank 0, status 2."""
    from . import cli
    from .runtime.mpi import launcher_rank
    try:
        return cli.main(argv)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # output piped into head & co.: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except ValueError as exc:
        if launcher_rank() == 0:
            print(f"summa: error: {exc}", file=sys.stderr, flush=True)
        return EXIT_USAGE


def _failed(world, ctl, exc: Exception) -> int:
    """Say once why the command failed with `exc`, and return the exit status
    (or end the job where other ranks may be left waiting)."""
    from .device.account import DeviceMemoryError
    from .runtime.agree import RankFailure
    if isinstance(exc, BrokenPipeError):  # output piped into head & co.: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        if world.Get_size() > 1:
            # the others may wait in a collective this rank leaves, and MPI_Finalize
            # for them: end as a failed rank does, MPI's files removed first
            from .runtime.cleanup import hard_exit
            hard_exit(1)
        return 1
    if isinstance(exc, RankFailure):  # already agreed by every rank: one report, clean exit
        if world.Get_rank() == 0:
            print(f"summa: error: {exc}", file=sys.stderr, flush=True)
        return 1
    if isinstance(exc, ValueError):
        if world.Get_size() == 1 or _all_ranks_failed(ctl, _grace()):
            if world.Get_rank() == 0:
                print(f"summa: error: {exc}", file=sys.stderr, flush=True)
            return EXIT_USAGE
        _abort(world, f"error: {exc} (other ranks did not stop; aborting the job)", EXIT_USAGE)
    elif isinstance(exc, DeviceMemoryError) and world.Get_size() == 1:
        print(f"summa: error: {exc}", file=sys.stderr, flush=True)  # the GPU was taken
    elif isinstance(exc, (OSError, DeviceMemoryError)):  # a disk full, a file gone, a GPU
        _abort(world, f"error: {exc} (aborting the job)", 1)  # taken: one line, end every rank
    else:  # anything unexpected: say where, then end every rank
        tb = "".join(traceback.format_exception(exc))
        _abort(world, f"unexpected {type(exc).__name__}: {exc}\n{tb}summa: aborting the job", 1)
    return 1


def _abort(world, message: str, status: int) -> None:
    """Say `message` from this rank, then end every rank of the job."""
    from .runtime.cleanup import end_job
    end_job(world, f"summa: rank {world.Get_rank()}: {message}", status)


if __name__ == "__main__":
    sys.exit(main())
