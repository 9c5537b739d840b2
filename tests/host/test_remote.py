"""summa.host.remote: another process's arrays read and written in place."""

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from summa.host import shared as host, remote

pytestmark = pytest.mark.skipif(remote.describe(np.empty(1)) is None,
                                reason="no process_vm_readv here")

#: A process holding A (random, from a seed) and a zeroed C; it prints where
#: they are, then, told to, whether C holds 2 * A's rows 5..1500, cols 3..40.
_OWNER = textwrap.dedent("""
    import json, sys
    import numpy as np
    from summa.host import remote
    a = np.random.default_rng(7).uniform(-1, 1, (1600, 50))
    c = np.zeros((1600, 50))
    print(json.dumps([remote.describe(a), remote.describe(c)]), flush=True)
    sys.stdin.readline()
    expect = np.zeros_like(c)
    expect[5:1500, 3:40] = 2 * a[5:1500, 3:40]
    print("same" if np.array_equal(c, expect) else "differs", flush=True)
""")


@pytest.fixture
def owner():
    proc = subprocess.Popen([sys.executable, "-c", _OWNER], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        where = json.loads(proc.stdout.readline())
        if not remote.readable(where[0]):  # a sandbox (seccomp, Yama scope 2-3) says no
            pytest.skip("this system does not let a process read another's memory")
        yield proc, where
    finally:
        proc.kill()
        proc.wait()


def test_rows_of_another_process_are_read_and_written_where_they_lie(owner):
    proc, (where_a, where_c) = owner
    assert remote.readable(where_a)
    a = host.attach_remote(where_a, (1600, 50), "float64")
    c = host.attach_remote(where_c, (1600, 50), "float64")
    assert host.shared_token(a) != host.shared_token(c) and a.flags.writeable
    expect = np.random.default_rng(7).uniform(-1, 1, (1600, 50))
    view = a[5:1500, 3:40]  # 1495 rows apart in memory: two calls of 1024 rows at most
    rows = remote.find(view)
    got = np.empty(view.shape)
    rows.read_into(got)
    np.testing.assert_array_equal(got, expect[5:1500, 3:40])
    whole = np.empty((1600, 50))
    remote.find(a).read_into(whole)  # contiguous: one range
    np.testing.assert_array_equal(whole, expect)
    remote.find(c[5:1500, 3:40]).write_from(2 * got)
    proc.stdin.write("check\n")
    proc.stdin.flush()
    assert proc.stdout.readline().strip() == "same"


def test_calls_that_move_less_than_asked_go_on_where_they_stopped(owner, monkeypatch):
    # the kernel may move less than asked (a page it cannot take at once):
    # here every call moves at most 1000 bytes, mid-row (rows are 296 bytes)
    import ctypes
    proc, (where_a, _) = owner
    real = remote._calls()

    class Short:
        calls = 0

        def process_vm_readv(self, pid, local, nlocal, iov, count, flags):
            Short.calls += 1
            piece = remote._Iovec(local._obj.iov_base, min(local._obj.iov_len, 1000))
            return real.process_vm_readv(pid, ctypes.byref(piece), 1, iov, count, flags)
    monkeypatch.setattr(remote, "_calls", lambda: Short())
    a = host.attach_remote(where_a, (1600, 50), "float64")
    view = a[5:1500, 3:40]
    got = np.empty(view.shape)
    remote.find(view).read_into(got)
    np.testing.assert_array_equal(got, np.random.default_rng(7).uniform(-1, 1, (1600, 50))[
        5:1500, 3:40])
    assert Short.calls >= got.nbytes // 1000


def test_a_gone_owner_fails_the_copy_in_words(owner):
    proc, (where_a, _) = owner
    a = host.attach_remote(where_a, (1600, 50), "float64")
    proc.kill()
    proc.wait()
    assert not remote.readable(where_a)
    with pytest.raises(OSError, match=r"pool's owner \(pid \d+\): its array cannot be read"):
        remote.find(a[:10]).read_into(np.empty((10, 50)))


def test_find_knows_only_placeholders_and_a_placeholder_cannot_be_touched(owner, tmp_path):
    _, (where_a, _) = owner
    assert remote.find(np.ones((4, 4))) is None
    with pytest.raises(ValueError, match="bytes"):
        remote.placeholder(where_a, (10, 10), "float64")
    # a stray read of a stand-in faults at once (never zeros read as data)
    script = textwrap.dedent(f"""
        import numpy as np
        from summa.host import remote
        a = remote.placeholder({where_a!r}, (1600, 50), "float64")
        print(float(a[0, 0]))
    """)
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert p.returncode != 0 and not p.stdout.strip()


def test_the_stager_moves_a_placeholder_views_rows_between_the_processes(owner, monkeypatch):
    from test_staging import DeviceArray, _stager
    proc, (where_a, where_c) = owner
    a = host.attach_remote(where_a, (1600, 50), "float64")
    c = host.attach_remote(where_c, (1600, 50), "float64")
    stager = _stager(threads=3, chunk_bytes=4096)
    try:
        dev = DeviceArray(np.zeros((1495, 37)))
        stager.upload(dev, a[5:1500, 3:40]).wait()
        expect = np.random.default_rng(7).uniform(-1, 1, (1600, 50))
        np.testing.assert_array_equal(dev.host, expect[5:1500, 3:40])
        assert stager.touch(c)._left == 0  # nothing here to fault in
        stager.download(c[5:1500, 3:40], DeviceArray(2 * dev.host)).wait()
    finally:
        stager.close()
    proc.stdin.write("check\n")
    proc.stdin.flush()
    assert proc.stdout.readline().strip() == "same"
