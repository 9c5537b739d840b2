"""summa.host.npyio and summa.host.npyoutput: .npy headers, block reads and
atomic writes, serially (MPI.COMM_SELF)."""

import os

import numpy as np
import pytest
from mpi4py import MPI

from summa.host import npyoutput
from summa.host.npyio import NpyError, map_block, read_block, read_header
from summa.host.npyoutput import (AtomicNpyWriter, check_output_path, check_output_room,
                                  npy_bytes)

SELF = MPI.COMM_SELF


@pytest.fixture
def arrays(tmp_path):
    rng = np.random.default_rng()
    a = rng.uniform(-1, 1, (13, 7))
    np.save(tmp_path / "c.npy", a)
    np.save(tmp_path / "f.npy", np.asfortranarray(a))
    return a, tmp_path


@pytest.mark.parametrize("name", ["c.npy", "f.npy"])
def test_blocks_of_c_and_fortran_files(arrays, name):
    a, folder = arrays
    header = read_header(str(folder / name), SELF)
    assert header.shape == (13, 7) and header.fortran_order == (name == "f.npy")
    rows, cols = np.array([1, 2, 3, 9]), np.array([0, 6])
    assert np.array_equal(read_block(header, rows, cols), a[np.ix_(rows, cols)])
    assert np.array_equal(read_block(header, np.arange(2, 6), np.arange(7)), a[2:6])
    assert np.array_equal(read_block(header, np.arange(4), np.arange(3, 5), transpose=True),
                          a.T[0:4, 3:5])
    assert read_block(header, np.arange(0), np.arange(3)).shape == (0, 3)


def test_conjugate_transpose_read(tmp_path):
    z = np.arange(6).reshape(2, 3) * (1 + 2j)
    np.save(tmp_path / "z.npy", z)
    header = read_header(str(tmp_path / "z.npy"), SELF)
    got = read_block(header, np.arange(3), np.arange(2), transpose=True, conjugate=True)
    assert np.array_equal(got, z.conj().T)


def _bad_files(folder):
    np.save(folder / "v.npy", np.zeros(5))
    np.save(folder / "t.npy", np.zeros((2, 2, 2)))
    np.save(folder / "o.npy", np.array([[1, "x"]], dtype=object), allow_pickle=True)
    np.save(folder / "s.npy", np.array([["a", "b"]]))
    np.save(folder / "b.npy", np.ones((2, 2), dtype=bool))
    (folder / "text.npy").write_text("this is not numpy\n")
    np.save(folder / "full.npy", np.ones((40, 40)))
    data = (folder / "full.npy").read_bytes()
    (folder / "cut.npy").write_bytes(data[: len(data) // 2])
    (folder / "short.npy").write_bytes(data[:5])


@pytest.mark.parametrize("name,match", [
    ("missing.npy", "no such file"), ("v.npy", "1-D"), ("t.npy", "3-D"),
    ("o.npy", "dtype object cannot be multiplied"), ("s.npy", "cannot be multiplied"),
    ("b.npy", "dtype bool cannot be multiplied"), ("text.npy", "not an .npy file"),
    ("cut.npy", "truncated"), ("short.npy", "not an .npy file"), (".", "is a folder")])
def test_bad_files_name_the_file_and_problem(tmp_path, name, match):
    _bad_files(tmp_path)
    path = str(tmp_path / name)
    with pytest.raises(NpyError, match=match) as info:
        read_header(path, SELF)
    assert path in str(info.value) or name == "."
    assert isinstance(info.value, ValueError)


def test_output_path_checks(arrays):
    a, folder = arrays
    inp = str(folder / "c.npy")
    with pytest.raises(NpyError, match="does not exist"):
        check_output_path(str(folder / "nope" / "out.npy"), [inp], SELF)
    with pytest.raises(NpyError, match="overwrite the input"):
        check_output_path(inp, [inp], SELF)
    os.symlink(inp, folder / "link.npy")
    with pytest.raises(NpyError, match="overwrite the input"):
        check_output_path(str(folder / "link.npy"), [inp], SELF)
    with pytest.raises(NpyError, match="is a folder"):
        check_output_path(str(folder), [inp], SELF)
    assert check_output_path(str(folder / "new.npy"), [inp], SELF).endswith("new.npy")


def test_atomic_writer_renames_only_on_success(tmp_path):
    target = tmp_path / "out.npy"
    x = np.arange(12.0).reshape(3, 4)
    with AtomicNpyWriter(str(target), (3, 4), np.float64, SELF) as out:
        out.write_block(x[:, :2], np.arange(3), np.arange(2))
        assert not target.exists(), "nothing may appear under the final name before the end"
        out.write_block(x[:, 2:], np.arange(3), np.arange(2, 4))
    assert np.array_equal(np.load(target), x)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.npy"]
    mode = target.stat().st_mode & 0o777
    assert mode & 0o044, "the output gets the usual permissions, not a private 0600"

    with pytest.raises(RuntimeError, match="rank 0 failed while writing .*RuntimeError: boom"):
        with AtomicNpyWriter(str(tmp_path / "failed.npy"), (3, 4), np.float64, SELF) as out:
            out.write_block(x[:1], np.arange(1), np.arange(4))
            raise RuntimeError("boom")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.npy"], "temp file removed"


@pytest.mark.parametrize("shape,dtype", [((3, 4), "float64"), ((1000, 7), "complex128"),
                                         ((0, 5), "float32"), ((17, 1), ">f8")])
def test_npy_bytes_is_the_size_of_the_file_numpy_writes(tmp_path, shape, dtype):
    np.save(tmp_path / "x.npy", np.zeros(shape, dtype=dtype))
    assert npy_bytes(shape, dtype) == os.path.getsize(tmp_path / "x.npy")


def test_an_output_the_disk_cannot_hold_is_refused_saying_need_and_free(tmp_path, monkeypatch):
    out = str(tmp_path / "C.npy")
    need = npy_bytes((3000, 2000), "float64")
    free = need // 3
    monkeypatch.setattr(npyoutput, "free_space", lambda folder: free)
    with pytest.raises(ValueError) as e:
        check_output_room(out, (3000, 2000), "float64", SELF)
    assert str(e.value) == (f"{out}: the output needs {need / 2**20:.1f} MiB of disk space, and "
                            f"{tmp_path} has {free / 2**20:.1f} MiB free; free some space or "
                            "write the output elsewhere")
    monkeypatch.setattr(npyoutput, "free_space", lambda folder: need - 1)
    with pytest.raises(ValueError, match="needs"):
        check_output_room(out, (3000, 2000), "float64", SELF)
    monkeypatch.setattr(npyoutput, "free_space", lambda folder: need)
    check_output_room(out, (3000, 2000), "float64", SELF)  # exactly enough


def test_an_output_it_replaces_is_not_counted_as_room(tmp_path, monkeypatch):
    # the temporary file is written beside the old output, which goes only
    # once the new one is renamed over it
    out = tmp_path / "C.npy"
    np.save(out, np.zeros((100, 100)))
    old = out.read_bytes()
    monkeypatch.setattr(npyoutput, "free_space", lambda folder: npy_bytes((100, 100), "f8") - 1)
    with pytest.raises(ValueError, match=rf"the existing C.npy's {len(old) / 2**10:.1f} KiB are "
                                         r"freed only once the new file replaces it"):
        check_output_room(str(out), (100, 100), "float64", SELF)
    assert out.read_bytes() == old


def test_a_file_system_that_does_not_say_its_free_space_is_not_refused(tmp_path, monkeypatch):
    def unknown(folder):
        raise OSError(38, "Function not implemented")
    monkeypatch.setattr(npyoutput, "free_space", unknown)
    check_output_room(str(tmp_path / "C.npy"), (10, 10), "float64", SELF)


def test_the_writer_refuses_an_output_the_disk_cannot_hold_and_makes_no_file(tmp_path,
                                                                              monkeypatch):
    monkeypatch.setattr(npyoutput, "free_space", lambda folder: 1000)
    need = npy_bytes((12, 12), "float64")
    with pytest.raises(NpyError, match=f"the output needs {need / 2**10:.1f} KiB of disk space, "
                                       ".* 1000 bytes free"):
        with AtomicNpyWriter(str(tmp_path / "out.npy"), (12, 12), np.float64, SELF):
            pytest.fail("the block runs only where the output fits")
    assert list(tmp_path.iterdir()) == []


def test_writer_scattered_rows(tmp_path):
    x = np.random.default_rng().uniform(size=(6, 5))
    rows, cols = np.array([0, 2, 5]), np.array([1, 3])
    with AtomicNpyWriter(str(tmp_path / "o.npy"), (6, 5), np.float64, SELF) as out:
        out.write_block(x[np.ix_(rows, cols)], rows, cols)
    y = np.load(tmp_path / "o.npy")
    assert np.array_equal(y[np.ix_(rows, cols)], x[np.ix_(rows, cols)])


@pytest.mark.parametrize("threads", ["1", "3", "16"])
@pytest.mark.parametrize("order", ["C", "F"])
def test_threaded_block_reads_are_byte_identical_to_numpy(tmp_path, monkeypatch, threads, order):
    monkeypatch.setenv("SUMMA_IO_THREADS", threads)
    rng = np.random.default_rng()
    a = (rng.uniform(-1, 1, (57, 41)) + 1j * rng.uniform(-1, 1, (57, 41))).astype(np.complex64)
    np.save(tmp_path / "a.npy", np.asfortranarray(a) if order == "F" else a)
    header = read_header(str(tmp_path / "a.npy"), SELF)
    for _ in range(20):
        r0, c0 = rng.integers(0, 57), rng.integers(0, 41)
        r1, c1 = rng.integers(r0, 58), rng.integers(c0, 42)
        rows, cols = np.arange(r0, r1), np.arange(c0, c1)
        got = read_block(header, rows, cols)
        assert got.flags.c_contiguous and got.tobytes() == a[r0:r1, c0:c1].tobytes()
        t = read_block(header, cols, rows, transpose=True, conjugate=True)
        assert t.tobytes() == a[r0:r1, c0:c1].conj().T.tobytes()
    cyclic = np.array([0, 1, 8, 9, 16])  # block-cyclic indices: the memory map path
    assert read_block(header, cyclic, np.arange(41)).tobytes() == a[cyclic].tobytes()


def test_a_file_cut_short_after_its_header_was_read_fails_the_read(tmp_path, monkeypatch):
    monkeypatch.setenv("SUMMA_IO_THREADS", "4")
    np.save(tmp_path / "a.npy", np.ones((200, 50)))
    header = read_header(str(tmp_path / "a.npy"), SELF)
    os.truncate(tmp_path / "a.npy", header.offset + 100 * 50 * 8 + 3)
    with pytest.raises(NpyError, match="shorter than its header"):
        read_block(header, np.arange(200), np.arange(50))
    with pytest.raises(NpyError, match="shorter than its header"):
        read_block(header, np.arange(150, 200), np.arange(10, 20))
    import threading
    assert not [t for t in threading.enumerate() if t.name.startswith("summa-io")]


@pytest.mark.parametrize("threads", ["1", "5"])
def test_threaded_block_writes_land_where_they_belong(tmp_path, monkeypatch, threads):
    monkeypatch.setenv("SUMMA_IO_THREADS", threads)
    rng = np.random.default_rng()
    a = rng.uniform(-1, 1, (33, 29))
    out = tmp_path / "out.npy"
    with AtomicNpyWriter(str(out), a.shape, a.dtype, SELF) as w:
        for (r0, r1), (c0, c1) in (((0, 20), (0, 29)), ((20, 33), (0, 11)), ((20, 33), (11, 29))):
            w.write_block(a[r0:r1, c0:c1].copy(), np.arange(r0, r1), np.arange(c0, c1))
    assert np.load(out).tobytes() == a.tobytes()


def test_a_mapped_block_is_read_ahead_whole_and_unchanged(tmp_path, monkeypatch):
    from summa.host import filemaps
    a = np.random.default_rng(3).uniform(-1, 1, (700, 300))
    np.save(tmp_path / "A.npy", a)
    header = read_header(str(tmp_path / "A.npy"), SELF)
    started = []
    real = filemaps.prefetch
    monkeypatch.setattr(filemaps, "prefetch", lambda v: started.append(real(v)) or started[-1])
    monkeypatch.setattr(filemaps, "PREFETCH_CHUNK", 4096 * 3)  # many chunks, several threads
    block = map_block(header, np.arange(50, 650), np.arange(100, 250))
    assert len(started) == 1 and started[0] is not None
    started[0].join(timeout=30)
    assert not started[0].is_alive()
    np.testing.assert_array_equal(block, a[50:650, 100:250])
    resident = filemaps._resident(block.ctypes.data, block.ctypes.data + block.nbytes)
    assert resident is None or resident(0, block.shape[1] * 8)
    # nothing to read ahead: not a file's map, or more than half the free memory
    assert filemaps.prefetch(np.ones((4, 4))) is None
    monkeypatch.setattr(filemaps, "available_memory", lambda: 1000)
    assert real(block) is None


def test_the_read_ahead_stops_once_its_map_is_gone(tmp_path, monkeypatch):
    # A multiply that fails (or ends) drops its maps: no thread goes on
    # reading its files behind it.
    import gc
    import threading
    import time

    from summa.host import filemaps
    np.save(tmp_path / "A.npy", np.zeros((1000, 512)))
    header = read_header(str(tmp_path / "A.npy"), SELF)
    monkeypatch.setattr(filemaps, "PREFETCH_CHUNK", 4096)
    monkeypatch.setattr(filemaps, "_resident", lambda start, end: None)  # every chunk read
    real = os.preadv
    monkeypatch.setattr(filemaps.os, "preadv",
                        lambda *a: (time.sleep(0.02), real(*a))[1])  # ~5 s for all of it
    started = []
    prefetch = filemaps.prefetch
    monkeypatch.setattr(filemaps, "prefetch", lambda v: started.append(prefetch(v)))
    block = map_block(header, np.arange(1000), np.arange(512))
    assert started[0].is_alive()
    del block
    gc.collect()
    started[0].join(timeout=2)
    assert not started[0].is_alive()
    assert not any(t.name == "summa-prefetch" for t in threading.enumerate())


def test_read_aheads_read_one_file_after_the_other(tmp_path, monkeypatch):
    from summa.host import filemaps
    for name in "AB":
        np.save(tmp_path / f"{name}.npy", np.zeros((200, 256)))
    monkeypatch.setattr(filemaps, "PREFETCH_CHUNK", 4096)
    monkeypatch.setattr(filemaps, "_resident", lambda start, end: None)
    order, fds = [], {}
    real_open, real_preadv = os.open, os.preadv

    def opened(path, *args):
        fd = real_open(path, *args)
        fds[fd] = os.path.basename(path)
        return fd

    def read(fd, buffers, at):
        order.append(fds.get(fd))
        return real_preadv(fd, buffers, at)
    monkeypatch.setattr(filemaps.os, "open", opened)
    monkeypatch.setattr(filemaps.os, "preadv", read)
    started = []
    prefetch = filemaps.prefetch
    monkeypatch.setattr(filemaps, "prefetch", lambda v: started.append(prefetch(v)))
    blocks = [map_block(read_header(str(tmp_path / f"{n}.npy"), SELF), np.arange(200),
                        np.arange(256)) for n in "AB"]
    for t in started:
        t.join(timeout=30)
    reads = [name for name in order if name in ("A.npy", "B.npy")]
    assert reads == ["A.npy"] * reads.count("A.npy") + ["B.npy"] * reads.count("B.npy")
    assert reads.count("A.npy") == reads.count("B.npy") == 200 * 256 * 8 // 4096
    del blocks


def test_written_rows_are_sent_to_the_disk_as_they_are_written(tmp_path, monkeypatch):
    # The disk starts on each written range at once (sync_file_range), not
    # only at the final fsync; the bytes land where they belong either way.
    from summa.host import filemaps, npyio as io
    started = []
    real = filemaps.write_out
    monkeypatch.setattr(filemaps, "write_out",
                        lambda fd, at, n: (started.append((at, n)), real(fd, at, n)))
    monkeypatch.setattr(io, "io_threads", lambda: 3)
    a = np.random.default_rng(5).uniform(-1, 1, (90, 40))
    with AtomicNpyWriter(str(tmp_path / "C.npy"), (90, 40), np.float64, SELF) as out:
        out.write_block(a, np.arange(90), np.arange(40))
    np.testing.assert_array_equal(np.load(tmp_path / "C.npy"), a)
    assert started and sum(n for _, n in started) >= a.nbytes
