"""A job a plain process launches and ends (summa/pool/job.py): started with
SIGINT and SIGTERM blocked, stopped by a signal its ranks take once they can
clean up, and killed, its files removed, where they do not end."""

import os
import signal
import sys
import textwrap
import threading
import time

import pytest

from leftovers import SEGMENT_DIR
from summa import pool
from summa.pool import job
from summa.runtime.cleanup import process_alive

# Serial only: a rank of the MPI runs ends on SIGINT, which test_run sends itself
pytestmark = pytest.mark.skipif(pool.launched() or not os.path.isdir(SEGMENT_DIR),
                                reason="under a launcher; no /dev/shm")

#: A launcher of one rank (its code the argument), in a session of its own as
#: MPI's launchers start theirs; its status as theirs is (128 + a signal).
LAUNCHER = textwrap.dedent("""
    import subprocess, sys
    rank = subprocess.Popen([sys.executable, "-c", sys.argv[1]], start_new_session=True)
    status = rank.wait()
    sys.exit(128 - status if status < 0 else status)
""")


def _launched(rank_code: str):
    return job.launch([sys.executable, "-c", LAUNCHER, rank_code], dict(os.environ))


def _blocked(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        return next(int(line.split()[1], 16) for line in fh if line.startswith("SigBlk:"))


def _rank(path) -> int:
    """The rank's pid, once it has written it to `path` (it is up; the file
    may be seen made and not yet written)."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            with open(path) as fh:
                return int(fh.read())
        except (OSError, ValueError):
            time.sleep(0.01)
    raise TimeoutError(f"the rank did not write {path}")


def test_a_job_starts_with_the_stop_signals_blocked_and_a_stop_reaches_its_ranks(tmp_path):
    """The rank inherits them blocked (a stop during its start waits); once
    it unblocks them, as summa's signal handling does, the stop ends it; the
    caller's own mask is as it was."""
    up = tmp_path / "up"
    code = textwrap.dedent(f"""
        import os, signal, time
        open({str(up)!r}, "w").write(str(os.getpid()))
        time.sleep(1.0)  # a stop during the start: held
        signal.pthread_sigmask(signal.SIG_UNBLOCK, (signal.SIGINT, signal.SIGTERM))
        time.sleep(60)
    """)
    proc = _launched(code)
    rank = _rank(up)
    mask = (1 << (signal.SIGINT - 1)) | (1 << (signal.SIGTERM - 1))
    assert _blocked(rank) & mask == mask and _blocked(proc.pid) & mask == mask
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) & {signal.SIGINT, signal.SIGTERM} == set()
    t0 = time.monotonic()
    seen = job.stop(proc, signum=signal.SIGTERM)
    took = time.monotonic() - t0
    assert rank in seen and not process_alive(rank)
    assert 0.5 < took < job.STOP_GRACE, took  # it waited for the rank, which then ended
    assert proc.returncode == 128 + signal.SIGTERM  # the rank's end, not a kill's


def test_a_job_that_does_not_end_is_killed_and_its_files_removed(tmp_path):
    """A rank that never takes the signal (it keeps it blocked) is killed after
    the grace, the launcher first, and the MPI file it held is removed."""
    seg, up = os.path.join(SEGMENT_DIR, f"mpich_shm_jobtest{os.getpid()}_0"), tmp_path / "up"
    code = textwrap.dedent(f"""
        import mmap, os, time
        fd = os.open({seg!r}, os.O_RDWR | os.O_CREAT, 0o600)
        os.ftruncate(fd, 4096)
        m = mmap.mmap(fd, 4096)
        open({str(up)!r}, "w").write(str(os.getpid()))
        time.sleep(60)
    """)
    try:
        proc = _launched(code)
        rank = _rank(up)
        seen = job.stop(proc, signum=signal.SIGINT, grace=0.5)
        assert rank in seen and not process_alive(rank)
        assert proc.returncode == -signal.SIGKILL and not os.path.exists(seg)
    finally:
        if os.path.exists(seg):
            os.unlink(seg)


def test_run_passes_a_stop_on_and_ends_with_its_status(tmp_path):
    """A command run in this process's place: its status, or 128 + the
    signal that stopped it (the signal passed to its ranks)."""
    assert job.run([sys.executable, "-c", "raise SystemExit(3)"], dict(os.environ)) == 3
    up = tmp_path / "up"
    code = textwrap.dedent(f"""
        import os, signal, sys, time
        signal.pthread_sigmask(signal.SIG_UNBLOCK, (signal.SIGINT, signal.SIGTERM))
        signal.signal(signal.SIGINT, lambda *_: sys.exit(130))
        open({str(up)!r}, "w").write(str(os.getpid()))
        time.sleep(60)
    """)
    def interrupt():  # Ctrl-C to this process once the rank is up
        _rank(up)
        os.kill(os.getpid(), signal.SIGINT)

    timer = threading.Thread(target=interrupt)
    timer.start()
    try:
        assert job.run([sys.executable, "-c", LAUNCHER, code], dict(os.environ)) == 130
    finally:
        timer.join()
