"""summa.host.filemaps and summa.host.remote's registries of maps, where the
garbage collector may forget a map at any allocation."""

import subprocess
import sys
import textwrap

import pytest

#: A map (a file's or another process's placeholder) left in a reference
#: cycle is forgotten whenever the collector runs: here while `find` holds
#: the registry's lock, in the thread that holds it (as a copy thread did in
#: test_copies_of_mapped_files_..., which then waited on itself for good).
_COLLECT_INSIDE_FIND = textwrap.dedent("""
    import gc, sys
    import numpy as np
    from mpi4py import MPI
    from summa.host import filemaps, remote
    from summa.host.npyio import map_block, read_header

    def collecting(cls):
        class Collecting(cls):
            def __init__(self, *args, **kwargs):
                gc.collect()  # as any allocation may
                super().__init__(*args, **kwargs)
        return Collecting

    path = sys.argv[1]
    np.save(path, np.arange(600.0).reshape(20, 30))
    header = read_header(path, MPI.COMM_SELF)
    keep = map_block(header, np.arange(20), np.arange(30))
    doomed = [map_block(header, np.arange(2, 10), np.arange(5, 20))]
    doomed.append(doomed)
    del doomed
    filemaps.FileRows = collecting(filemaps.FileRows)
    rows = filemaps.find(keep[3:9])
    assert rows is not None and rows.rows == 6 and len(filemaps._maps) == 1, filemaps._maps

    x = np.arange(600.0).reshape(20, 30)
    where = remote.describe(x)
    if where is not None:  # (a system without process_vm_readv: no placeholders)
        keep = remote.placeholder(where, x.shape, x.dtype)
        doomed = [remote.placeholder(where, x.shape, x.dtype)]
        doomed.append(doomed)
        del doomed
        remote.RemoteRows = collecting(remote.RemoteRows)
        rows = remote.find(keep[3:9])
        assert rows is not None and len(remote._maps) == 1, remote._maps
    print("found")
""")


def test_a_map_forgotten_inside_find_by_the_collector_does_not_deadlock(tmp_path):
    try:
        done = subprocess.run([sys.executable, "-c", _COLLECT_INSIDE_FIND,
                               str(tmp_path / "A.npy")], capture_output=True, text=True,
                              timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("find deadlocked on its own lock when the collector forgot a map")
    assert done.returncode == 0 and done.stdout.strip() == "found", done.stderr


def test_a_read_ahead_holds_no_more_host_memory_than_its_scratch_bound(tmp_path):
    """A read-ahead reads into scratch of at most
    :func:`summa.host.filemaps.prefetch_scratch` (what a files run's account
    allows beside its plan): a small file's readers take its size, not a
    whole chunk each (8 MiB each went past a streamed plan's account)."""
    import threading
    import tracemalloc
    import numpy as np
    from summa.host import filemaps
    path = tmp_path / "x.bin"
    size = 300_000
    path.write_bytes(np.random.default_rng(0).bytes(size))
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        # every chunk read (resident None: as from a cold page cache)
        filemaps._read_ahead(str(path), 0, size, None, 4, threading.Event(), None)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert 0 < filemaps.prefetch_scratch(size) < filemaps.PREFETCH_CHUNK
    assert peak <= filemaps.prefetch_scratch(size) + (64 << 10)
