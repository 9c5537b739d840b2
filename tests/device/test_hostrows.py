"""summa.device.hostrows: what the host-device copies ask about host rows."""

import numpy as np

from summa.device import hostrows
from summa.host import filemaps


def test_plain_memory_is_copied_itself_a_mapped_files_rows_by_the_file(tmp_path):
    """Rows of ordinary memory have no reader or writer; the rows of a
    registered map (summa.host.filemaps, loaded with summa) are the file's."""
    plain = np.zeros((8, 4))
    assert hostrows.reader(plain) is None and hostrows.writer(plain) is None
    path = tmp_path / "x.bin"
    np.arange(32.0).tofile(path)
    mapped = np.memmap(path, dtype=np.float64, mode="r+", shape=(8, 4))
    filemaps.register(mapped, str(path), 0, writable=True)
    out = np.empty((8, 4))
    hostrows.reader(mapped).read_into(out)
    assert np.array_equal(out, np.arange(32.0).reshape(8, 4))
    hostrows.writer(mapped[2:4]).write_from(np.full((2, 4), -1.0))
    assert np.array_equal(np.fromfile(path)[8:16], np.full(8, -1.0))
