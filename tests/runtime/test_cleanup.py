"""What an abruptly ended process leaves behind (summa/runtime/cleanup.py), and the
test session's own guard against leftovers (tests/leftovers.py)."""

import mmap
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from leftovers import SEGMENT_DIR, stranded
from summa.runtime import cleanup

pytestmark = pytest.mark.skipif(not os.path.isdir(SEGMENT_DIR), reason="no /dev/shm")


def _segment(tag: str) -> Path:
    """A file named like MPICH's shared memory, unique to this test process."""
    path = Path(SEGMENT_DIR, f"mpich_shm_test{os.getpid()}{tag}_0")
    path.write_bytes(b"\0" * mmap.PAGESIZE)
    return path


def test_mapped_segments_names_the_mpi_files_a_process_maps_and_nothing_else():
    mine, other = _segment("a"), Path(SEGMENT_DIR, f"summa-test{os.getpid()}")
    other.write_bytes(b"\0" * mmap.PAGESIZE)
    try:
        with open(mine, "r+b") as f1, open(other, "r+b") as f2:
            maps = mmap.mmap(f1.fileno(), 0), mmap.mmap(f2.fileno(), 0)
            found = cleanup.mapped_segments()
            assert str(mine) in found and str(other) not in found
            assert cleanup.mapped_segments(os.getpid()) == found
            cleanup.remove_segments([str(mine), str(mine)])  # twice: the second is skipped
            assert not mine.exists()
            assert str(mine) not in cleanup.mapped_segments()  # now "(deleted)"
            for m in maps:
                m.close()
    finally:
        mine.unlink(missing_ok=True)
        other.unlink()
    assert cleanup.mapped_segments(2**22 + 1) == []  # no such process


def test_hard_exit_removes_outputs_and_segments_and_runs_no_exit_handlers(tmp_path):
    seg, out = _segment("b"), tmp_path / "C.npy.tmp"
    script = textwrap.dedent(f"""
        import atexit, mmap
        from summa.runtime import cleanup
        atexit.register(print, "exit handler ran")
        open({str(out)!r}, "w").close()
        cleanup.temporary_files.add({str(out)!r})
        f = open({str(seg)!r}, "r+b")
        m = mmap.mmap(f.fileno(), 0)
        cleanup.hard_exit(143)
    """)
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
    seg.unlink(missing_ok=True)
    assert p.returncode == 143 and "exit handler ran" not in p.stdout, p.stderr
    assert not out.exists()
    assert not p.stderr


@pytest.mark.parametrize("end", ["exit", "hard_exit"])
def test_a_process_removes_cuda_s_files_for_its_interprocess_events_when_it_ends(end):
    """The CUDA driver leaves ``cuda.shm.<n>.<pid hex>.<n>`` behind for every
    process that made an interprocess event; a process of ours removes its
    own as it ends (only its own: not one whose pid merely begins alike)."""
    script = textwrap.dedent(f"""
        import os, sys
        from summa.runtime import cleanup
        pid = f"{{os.getpid():x}}"
        for name in (f"cuda.shm.0.{{pid}}.1", f"cuda.shm.0.{{pid}}0.1", f"cuda.shm.1.{{pid}}.2"):
            open(os.path.join({SEGMENT_DIR!r}, name), "w").close()
        print(pid, flush=True)
        cleanup.remove_cuda_ipc_files_at_exit()
        cleanup.remove_cuda_ipc_files_at_exit()  # (asked again: one handler)
        if {end!r} == "hard_exit":
            cleanup.hard_exit(0)
    """)
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
    pid = p.stdout.strip()
    other = Path(SEGMENT_DIR, f"cuda.shm.0.{pid}0.1")
    try:
        assert p.returncode == 0 and not p.stderr, p.stderr
        assert other.exists()
        assert not Path(SEGMENT_DIR, f"cuda.shm.0.{pid}.1").exists()
        assert not Path(SEGMENT_DIR, f"cuda.shm.1.{pid}.2").exists()
    finally:
        for name in (f"cuda.shm.0.{pid}.1", f"cuda.shm.1.{pid}.2"):
            Path(SEGMENT_DIR, name).unlink(missing_ok=True)
        other.unlink(missing_ok=True)


def test_stranded_segments_are_new_unmapped_and_settled():
    before = set()
    old, fresh, held = _segment("c"), _segment("d"), _segment("e")
    try:
        past = time.time() - 10
        for p in (old, held):
            os.utime(p, (past, past))
        with open(held, "r+b") as f:
            m = mmap.mmap(f.fileno(), 0)
            found = stranded(before)
            m.close()
        assert str(old) in found
        assert str(fresh) not in found and str(held) not in found
        assert str(old) not in stranded({str(old)})  # there before: someone else's
    finally:
        for p in (old, fresh, held):
            p.unlink(missing_ok=True)


def test_a_ctrl_c_landing_in_a_finalizer_is_raised_after_it():
    """Python prints and drops an exception raised in a finalizer: a Ctrl-C
    that lands there (a shared copy's file being removed) must come back
    once the finalizer has returned, and what the finalizer did stays done."""
    done = []

    def removing():
        done.append("removed")
        raise KeyboardInterrupt  # as Python raises Ctrl-C in whatever code runs

    class Held:
        pass
    held = Held()
    cleanup.finalize(held, removing)
    with pytest.raises(KeyboardInterrupt):
        del held
        for _ in range(100):  # the interrupt comes at Python's next check
            time.sleep(0.001)
    assert done == ["removed"]


@pytest.fixture
def python_ctrl_c():
    """Python's own SIGINT handler in place for the test, the one before put back."""
    import signal
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def test_a_ctrl_c_landing_in_weakref_finalize_before_the_callback_is_raised_after(python_ctrl_c):
    """A Ctrl-C can land in ``weakref.finalize.__call__`` itself, before the
    callback's own guard (test_pool's Ctrl-C test lost one so in CI): the
    handler summa puts in place of Python's (where Python's is in place)
    puts it off there, and raises it once the finalizer is done; outside
    finalizers it raises at once, as Python's does."""
    import signal
    import weakref

    class Held:
        pass
    held = Held()
    cleanup.finalize(held, lambda: None)
    handler = signal.getsignal(signal.SIGINT)
    assert handler is not signal.default_int_handler and cleanup.raises_ctrl_c(handler)
    outcome = []

    def hook(frame, event, arg):  # the moment __call__ starts, before the callback
        if event == "call" and frame.f_code is weakref.finalize.__call__.__code__:
            try:
                handler(signal.SIGINT, frame)
                outcome.append("put off")
            except KeyboardInterrupt:
                outcome.append("raised in the finalizer")
    with pytest.raises(KeyboardInterrupt):
        sys.setprofile(hook)
        try:
            del held
        finally:
            sys.setprofile(None)
        for _ in range(100):  # it comes again at Python's next check
            time.sleep(0.001)
    assert outcome == ["put off"]
    with pytest.raises(KeyboardInterrupt):
        handler(signal.SIGINT, sys._getframe())


def test_a_handler_of_the_callers_is_left_alone():
    """Where the caller put its own SIGINT handler, making a finalizer keeps it."""
    import signal
    mine = lambda *_: None  # noqa: E731
    before = signal.signal(signal.SIGINT, mine)
    try:
        cleanup.finalize(object.__new__(type("Held", (), {})), lambda: None)
        assert signal.getsignal(signal.SIGINT) is mine and not cleanup.raises_ctrl_c(mine)
    finally:
        signal.signal(signal.SIGINT, before)


def test_a_temporary_file_is_named_for_the_clean_up_before_it_exists(tmp_path, monkeypatch):
    """The clean-up of a signal on another thread finds a new temporary file
    whenever it comes: the name is in temporary_files before the file is
    made; one made once the process is ending removes itself and waits for
    the end (no file outlives the process unnamed)."""
    import threading
    seen = []
    real_open = os.open

    def watched_open(path, *args, **kwargs):
        seen.append(str(path) in cleanup.temporary_files)
        return real_open(path, *args, **kwargs)
    monkeypatch.setattr(cleanup.os, "open", watched_open)
    fd, path = cleanup.new_temporary_file(str(tmp_path), ".out.", ".tmp")
    os.close(fd)
    assert seen == [True] and path in cleanup.temporary_files and os.path.exists(path)
    assert os.stat(path).st_mode & 0o777 == 0o600
    cleanup.remove_temporary_files()
    assert not os.path.exists(path) and path not in cleanup.temporary_files
    monkeypatch.setattr(cleanup, "_ending", threading.Event())
    cleanup._ending.set()  # as hard_exit sets it, its clean-up under way
    made = threading.Thread(target=cleanup.new_temporary_file,
                            args=(str(tmp_path), ".late.", ".tmp"), daemon=True)
    made.start()
    made.join(1.0)
    assert made.is_alive() and os.listdir(tmp_path) == []  # removed itself, waits for the end


def test_held_segments_names_a_file_open_but_not_yet_mapped_and_descendants_its_children():
    """MPI's start opens its file, sizes it, then maps it: a process stopped
    in between holds it only as a descriptor. A process's descendants are
    found through their parents, grandchildren too."""
    seg = _segment("f")
    script = textwrap.dedent(f"""
        import subprocess, sys, time
        f = open({str(seg)!r}, "r+b")
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        print(child.pid, flush=True)
        time.sleep(60)
    """)
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        child = int(p.stdout.readline())
        assert cleanup.held_segments(p.pid) == [str(seg)]
        assert cleanup.mapped_segments(p.pid) == []
        assert cleanup.descendants(p.pid) == [child]
        assert child in cleanup.descendants(os.getpid())
    finally:
        subprocess.run(["kill", "-9", str(p.pid), str(child)])
        p.wait()
        seg.unlink(missing_ok=True)
