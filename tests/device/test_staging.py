"""The stager's threads, rings and chunking (summa/device/staging.py) on a stand-in
for CuPy (tests/fake_cupy.py); the GPU runs the same code in test_gpu.py."""

import os
import threading

import numpy as np
import pytest

from fake_cupy import DeviceArray, FakeCupy
from summa.device.staging import Stager, copy_threads


def _stager(threads=4, chunk_bytes=4096, **fake):
    return Stager(0, threads, chunk_bytes=chunk_bytes, cupy=FakeCupy(**fake))


@pytest.mark.parametrize("threads", [1, 3, 8])
@pytest.mark.parametrize("chunk_bytes", [64, 4096, 1 << 20])
def test_uploads_and_downloads_move_every_byte_of_strided_rows(rng, threads, chunk_bytes):
    stager = _stager(threads, chunk_bytes)
    try:
        big = rng.uniform(-1, 1, (301, 97))
        src = big[3:250, 5:90]  # rows with a pitch: a slice of columns
        dev = DeviceArray(np.full(src.shape, np.nan))
        stager.upload(dev, src).wait()
        assert np.array_equal(dev.host, src)
        back = np.full((400, 120), np.nan)
        dst = back[10:257, 7:92]
        transfer = stager.download(dst, dev)
        transfer.event()
        transfer.wait()
        assert np.array_equal(dst, src)
        assert np.isnan(back[:10]).all() and np.isnan(back[:, :7]).all()  # nothing else written
    finally:
        stager.close()


def test_many_transfers_in_flight_at_once(rng):
    stager = _stager(threads=4, chunk_bytes=512)
    try:
        srcs = [rng.uniform(-1, 1, (int(rng.integers(1, 60)), int(rng.integers(1, 40))))
                for _ in range(40)]
        devs = [DeviceArray(np.zeros_like(s)) for s in srcs]
        ups = [stager.upload(d, s) for d, s in zip(devs, srcs)]
        outs = [np.zeros_like(s) for s in srcs]
        downs = []
        for u, d, o in zip(ups, devs, outs):
            u.wait()
            downs.append(stager.download(o, d, after=u.event()))
        for t in downs:
            t.wait()
        assert all(np.array_equal(o, s) for o, s in zip(outs, srcs))
    finally:
        stager.close()


def test_a_row_longer_than_a_chunk_grows_its_chunk(rng):
    stager = _stager(threads=2, chunk_bytes=64)  # 8 float64s, rows of 100
    try:
        src = rng.uniform(-1, 1, (7, 100))
        dev = DeviceArray(np.zeros_like(src))
        stager.upload(dev, src).wait()
        assert np.array_equal(dev.host, src)
    finally:
        stager.close()


def test_empty_transfers_are_done_at_once():
    stager = _stager()
    try:
        t = stager.upload(DeviceArray(np.zeros((0, 5))), np.zeros((0, 5)))
        t.wait()
        assert t.event() is None
    finally:
        stager.close()


def test_bad_shapes_and_strides_are_refused():
    stager = _stager()
    try:
        with pytest.raises(ValueError, match="copy between"):
            stager.upload(DeviceArray(np.zeros((3, 4))), np.zeros((4, 3)))
        with pytest.raises(ValueError, match="contiguous rows"):  # on the device side
            stager.upload(DeviceArray(np.zeros((4, 3)).T), np.zeros((3, 4)))
    finally:
        stager.close()
    with pytest.raises(RuntimeError, match="closed"):
        stager.upload(DeviceArray(np.zeros((3, 4))), np.zeros((3, 4)))


@pytest.mark.parametrize("direction", ["upload", "download"])
def test_a_failing_copy_fails_its_transfer_where_it_is_waited_for(rng, direction):
    stager = _stager(threads=3, chunk_bytes=256, fail_after=2)
    try:
        host = rng.uniform(-1, 1, (50, 16))
        dev = DeviceArray(np.zeros_like(host))
        t = getattr(stager, direction)(dev, host) if direction == "upload" else \
            stager.download(host, dev)
        with pytest.raises(RuntimeError, match="fake copy engine failure"):
            t.wait()
        with pytest.raises(RuntimeError, match="fake copy engine failure"):
            t.event()
    finally:
        stager.close()


def test_close_leaves_no_thread_running(rng):
    before = {t.name for t in threading.enumerate()}
    stager = _stager(threads=5)
    src = rng.uniform(-1, 1, (200, 30))
    stager.upload(DeviceArray(np.zeros_like(src)), src)  # not waited for: close finishes it
    stager.close()
    left = {t.name for t in threading.enumerate()} - before
    assert not [n for n in left if n.startswith("summa-")], left


def test_copy_threads_share_the_cores(monkeypatch):
    monkeypatch.delenv("SUMMA_COPY_THREADS", raising=False)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(32)))
    assert copy_threads(1) == 12 and copy_threads(4) == 6 and copy_threads(64) == 1
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(8)))
    monkeypatch.setattr("os.cpu_count", lambda: 32)  # the machine's, not this process's
    assert copy_threads(1) == 6 and copy_threads(2) == 3
    # another machine's node (a profile's cores), not this process's
    assert copy_threads(2, cores=48) == 12 and copy_threads(8, cores=48) == 4
    monkeypatch.setenv("SUMMA_COPY_THREADS", "3")
    assert copy_threads(1) == 3 and copy_threads(8, cores=48) == 3


def test_touch_faults_in_every_page(rng):
    stager = _stager(threads=3)
    try:
        x = np.full((1000, 301), 7.1)  # (no zero byte: 7.0's first is one)
        stager.touch(x).wait()
        flat = x.reshape(-1).view(np.uint8)
        assert (flat[::4096] == 0).all()           # one byte a page, every page
        y = np.full((50, 40), 7.0)[:, :30]          # no contiguous whole: rows
        stager.touch(y).wait()
        assert (y == 0).all()
    finally:
        stager.close()


def test_both_rings_are_made_at_the_first_copy_and_locked_at_once(rng):
    """Allocating page-locked memory piece by piece is slow: the rings are one
    array, page-locked in one call at the first copy and unlocked at close;
    a row longer than a chunk gets a longer chunk of its own."""
    stager = _stager(threads=2, chunk_bytes=64)  # rings of 2 + RING_EXTRA chunks
    fake = stager.cupy
    assert fake.registered == []
    try:
        src = rng.uniform(-1, 1, (400, 8))  # 400 chunks of one row
        stager.upload(DeviceArray(np.zeros_like(src)), src).wait()
        arena = stager._arena[0]
        assert fake.registered == [(arena.ctypes.data, 2 * stager._ring * 64)]
        assert stager._free[2].qsize() == stager._ring  # the download ring, unused so far
        out = np.zeros_like(src)
        stager.download(out, DeviceArray(src.copy())).wait()
        long_rows = rng.uniform(-1, 1, (3, 50))
        back = np.zeros_like(long_rows)
        stager.download(back, DeviceArray(long_rows.copy())).wait()
        assert np.array_equal(out, src) and np.array_equal(back, long_rows)
        assert len(fake.registered) == 1
    finally:
        stager.close()
    assert fake.registered == []


def test_a_touch_hurried_is_finished_by_the_copy_threads():
    """Where the touch's own threads are busy, Stager.hurry lets the free copy
    threads fault in the rest (before the first download into the array),
    each part once."""
    stager = _stager(threads=4)  # one touch thread
    held = threading.Event()
    try:
        stager.touch(np.empty((8, 8))).wait()  # (makes the touch's pool)
        stager._touch_pool.submit(held.wait)  # its one thread taken
        x = np.full((2000, 300), 7.1)
        touch = stager.touch(x)
        assert not touch._done.wait(0.2)  # waiting behind the taken thread
        stager.hurry(touch)
        assert touch._done.wait(10) and touch.error is None
        assert (x.reshape(-1).view(np.uint8)[::4096] == 0).all()  # a byte a page
        held.set()
    finally:
        held.set()
        stager.close()
    assert touch._left == 0  # every part counted once, though offered twice


def test_a_download_into_a_touched_array_waits_only_for_the_pages_it_writes(rng):
    """A download given the touch writes each chunk once the touch's zeros
    under it have landed: the rows it writes are the product's, whatever the
    touch threads still do elsewhere, and it never waits for parts it does
    not write (they stay the touch's: its own threads are held here)."""
    stager = _stager(threads=4, chunk_bytes=1 << 16)  # one touch thread
    held = threading.Event()
    try:
        stager.touch(np.empty((8, 8))).wait()  # (makes the touch's pool)
        stager._touch_pool.submit(held.wait)  # its one thread taken: nothing touched
        c = np.full((4096, 512), 7.1)  # 16 MiB, 4 * 4 parts
        touch = stager.touch(c)
        strip = c[1000:1300, 128:384]  # a strip of a tile: a part or two of C
        product = rng.uniform(-1, 1, strip.shape)
        stager.download(strip, DeviceArray(product.copy()), touch=touch).wait()
        assert np.array_equal(strip, product)
        assert 0 < touch._left < len(touch._parts)  # the strip's parts alone
        rest = c[3000:3100]
        stager.download(rest, DeviceArray(product[:100, :1].repeat(512, 1)), touch=touch).wait()
        held.set()
        touch.wait()  # the rest of C: zeros, the strips' rows kept
        assert np.array_equal(strip, product) and (rest == product[:100, :1]).all()
        assert (c[:900].reshape(-1).view(np.uint8)[::4096] == 0).all()  # touched, a byte a page
    finally:
        held.set()
        stager.close()


def test_byte_extent_spans_the_bytes_of_any_view():
    from summa.device.transfers import byte_extent
    x = np.zeros((10, 12))
    base = x.ctypes.data
    assert byte_extent(x) == (base, base + x.nbytes)
    assert byte_extent(x[2:4, 3:5]) == (base + 2 * 96 + 24, base + 3 * 96 + 5 * 8)
    assert byte_extent(x[::-1, ::-1]) == (base, base + x.nbytes)
    assert byte_extent(x.T) == (base, base + x.nbytes)
    lo, hi = byte_extent(x[3:3])
    assert lo == hi  # none


def test_touch_leaves_most_threads_to_the_uploads():
    from summa.device import staging
    stager = _stager(threads=8)
    try:
        stager.touch(np.empty((64, 64))).wait()
        assert stager._touch_pool._max_workers == round(8 * staging.TOUCH_SHARE) < 8
    finally:
        stager.close()


@pytest.mark.parametrize("cached", [False, True])
def test_copies_of_mapped_files_read_and_write_the_files(rng, tmp_path, monkeypatch, cached):
    """Blocks memory-mapped from .npy files (summa.host.npyio) are read with preadv
    and written with pwrite, rows as they lie (strided too, unless they are
    all in the page cache: then through the map); the result's touch leaves
    a mapped output alone; a file cut short fails the copy."""
    from mpi4py import MPI

    from summa.host import filemaps
    from summa.host.npyio import map_block, read_header
    from summa.host.npyoutput import AtomicNpyWriter
    a = rng.uniform(-1, 1, (300, 170))
    np.save(tmp_path / "A.npy", a)
    header = read_header(str(tmp_path / "A.npy"), MPI.COMM_SELF)
    block = map_block(header, np.arange(20, 290), np.arange(10, 150))
    assert filemaps.find(block) is not None and filemaps.find(block, writable=True) is None
    stager = _stager(threads=3, chunk_bytes=2048)
    reads = []
    real = filemaps.FileRows.read_into
    monkeypatch.setattr(filemaps.FileRows, "read_into",
                        lambda self, dest: (reads.append(1), real(self, dest)))
    if not cached:  # as if the pages were on the disk only
        monkeypatch.setattr(filemaps, "_resident", lambda start, end: None)
    resident = filemaps._resident(block.ctypes.data, block.ctypes.data + block.nbytes)
    try:
        dev = DeviceArray(np.zeros(block.shape))
        stager.upload(dev, block).wait()
        assert np.array_equal(dev.host, a[20:290, 10:150])
        # a system call per row only for rows not all in memory
        assert bool(reads) == (resident is None or not resident(0, block.nbytes))
        with AtomicNpyWriter(str(tmp_path / "C.npy"), (300, 170), np.float64,
                             MPI.COMM_SELF) as out:
            target = out.map_block(np.arange(300), np.arange(170))
            assert filemaps.find(target[5:200, 3:100], writable=True) is not None
            touched = stager.touch(target)
            assert touched._left == 0  # nothing to fault in: pwrite writes the file
            src = DeviceArray(a.copy())
            stager.download(target, src).wait()
            out.flush()
        assert np.array_equal(np.load(tmp_path / "C.npy"), a)
        del target
        # a file cut short under its map: the copy fails, with the file's words
        cut = map_block(header, np.arange(300), np.arange(170))
        os.truncate(tmp_path / "A.npy", header.offset + 1000)
        with pytest.raises(OSError, match=r"A\.npy: ends .* early"):
            stager.upload(DeviceArray(np.zeros(cut[250:].shape)), cut[250:]).wait()
    finally:
        stager.close()


@pytest.mark.parametrize("view", ["strided", "reversed", "transposed", "broadcast"])
def test_any_strided_host_array_is_gathered_and_scattered_through_the_chunks(rng, view,
                                                                            monkeypatch):
    """Strided views go up (and come down) through the page-locked chunks,
    row blocks gathered by the copy threads: no copy of the whole first."""
    cupy = FakeCupy()
    stager = Stager(0, 3, chunk_bytes=512, cupy=cupy)
    try:
        big = rng.uniform(-1, 1, (90, 70))
        src = {"strided": big[1::2, 3::3], "reversed": big[::-1, ::-2],
               "transposed": big[:40].T, "broadcast": np.broadcast_to(big[0], (30, 70))}[view]
        made = []
        for name in ("ascontiguousarray", "array", "copy"):  # a whole copy would show here
            real = getattr(np, name)
            monkeypatch.setattr(np, name, lambda x, *a, _real=real, **k: (
                made.append(np.shape(x)), _real(x, *a, **k))[1])
        dev = DeviceArray(np.full(src.shape, np.nan))
        stager.upload(dev, src).wait()
        assert np.array_equal(dev.host, src) and src.shape not in made
        rows = max(1, 512 // (src.shape[1] * 8))
        assert cupy.copies == -(-src.shape[0] // rows)  # chunk by chunk
        back = np.full((2 * src.shape[0], 3 * src.shape[1]), np.nan)
        dst = back[::-2, 1::3]  # a strided, reversed target
        transfer = stager.download(dst, dev)
        transfer.event()
        transfer.wait()
        monkeypatch.undo()
        assert np.array_equal(dst, src) and np.isnan(back[::2]).all()
        assert np.isnan(back[:, ::3]).all()  # nothing else written
    finally:
        stager.close()


#: Integer and boolean host types the stager converts into float64 and back.
_INTS = ["int8", "int16", "int32", "int64", "uint8", "bool"]


def _integers(rng, dtype, shape):
    """Random values of `dtype` over its whole range (int64: near 2**53, the
    float64 products' exact bound; bool: both)."""
    dtype = np.dtype(dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, shape).astype(bool)
    info = np.iinfo(dtype)
    low, high = (max(info.min, -2**53), min(info.max, 2**53))
    return rng.integers(low, high, shape, dtype=np.int64, endpoint=True).astype(dtype)


@pytest.mark.parametrize("dtype", _INTS)
def test_integer_rows_are_converted_into_float64_as_the_chunks_fill(rng, dtype):
    """An integer (or bool) host array goes up into a float64 device array,
    converted inside the copy into the page-locked chunk (rows of a strided
    view too), the chunks cut by float64's row bytes; nothing else converts
    it whole first."""
    cupy = FakeCupy()
    stager = Stager(0, 3, chunk_bytes=1024, cupy=cupy)
    try:
        big = _integers(rng, dtype, (97, 61))
        src = big[2::2, 1:60]
        dev = DeviceArray(np.full(src.shape, np.nan))
        stager.upload(dev, src).wait()
        assert np.array_equal(dev.host, src.astype(np.float64))
        assert dev.host.dtype == np.float64
        rows = 1024 // (src.shape[1] * 8)  # a chunk holds float64 rows
        assert cupy.copies == -(-src.shape[0] // rows)
    finally:
        stager.close()


@pytest.mark.parametrize("dtype", _INTS + ["uint16", "uint64"])
def test_a_float64_product_drains_into_integers_as_numpy_matmul_gives_them(rng, dtype):
    """A float64 product of integers, exact, comes down into an integer (or
    bool) host array converted as its chunks drain: wrapped as NumPy's
    integer matmul wraps a product beyond the type (an int8 product of
    int8s overflowing), nonzero for bools; strided targets too."""
    dtype = np.dtype(dtype)
    stager = _stager(threads=3, chunk_bytes=2048)
    try:
        if dtype.kind == "b":
            a, b = _integers(rng, bool, (70, 40)), _integers(rng, bool, (40, 50))
        else:
            info = np.iinfo(dtype)
            bound = min(int(info.max), 2**20)  # products beyond narrow types: they wrap
            a = rng.integers(max(int(info.min), -bound), bound, (70, 40)).astype(dtype)
            b = rng.integers(max(int(info.min), -bound), bound, (40, 50)).astype(dtype)
        want = a @ b  # NumPy's integer matmul, in dtype
        exact = a.astype(np.float64) @ b.astype(np.float64)
        if dtype.kind == "i" and dtype.itemsize < 8:
            assert (np.abs(exact) > np.iinfo(dtype).max).any()  # some do wrap
        back = np.zeros((140, 150), dtype)
        dst = back[::2, 1::3]
        transfer = stager.download(dst, DeviceArray(exact))
        transfer.event()
        transfer.wait()
        assert dst.dtype == dtype and np.array_equal(dst, want)
        assert not back[1::2].any()  # nothing else written
    finally:
        stager.close()


def test_values_at_the_exact_bound_survive_both_ways(rng):
    """int64 values up to 2**53 (float64 holds each exactly) go up and come
    back unchanged, in rows longer than the drain's int64 slab too."""
    from summa.device.casts import EXACT_SLAB
    stager = _stager(threads=2, chunk_bytes=1 << 16)
    try:
        for cols in (37, EXACT_SLAB + 3):
            src = rng.integers(-2**53, 2**53, (5, cols), endpoint=True)
            src[0, :2] = 2**53, -2**53
            dev = DeviceArray(np.zeros(src.shape))
            stager.upload(dev, src).wait()
            back = np.zeros(src.shape, np.int32)  # wraps: int32's low bits of each
            stager.download(back, dev).wait()
            assert np.array_equal(dev.host, src.astype(np.float64))
            assert np.array_equal(back, src.astype(np.int32))
    finally:
        stager.close()


def test_other_type_pairs_are_refused():
    """Only integers or bools against float64 convert: float32 host rows
    and a float64 device array are a mistake, refused."""
    stager = _stager()
    try:
        with pytest.raises(ValueError, match="copy between"):
            stager.upload(DeviceArray(np.zeros((3, 4))), np.zeros((3, 4), np.float32))
        with pytest.raises(ValueError, match="copy between"):
            stager.download(np.zeros((3, 4), np.int32), DeviceArray(np.zeros((3, 4), np.float32)))
    finally:
        stager.close()
