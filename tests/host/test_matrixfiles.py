"""DistMatrix to and from .npy files: what summa.host.matrixfiles does beside
the file I/O of summa.host.npyio (the round trips: tests/api/test_multiply.py)."""

import numpy as np
import pytest

from helpers import random_array
from summa.device.backend import NumpyBackend
from summa.distribution import matrix
from summa.host import matrixfiles


def test_the_distribution_reads_and_writes_files_through_the_host_package():
    """DistMatrix.from_npy and to_npy are the host package's (loaded with summa)."""
    assert matrix.NPY_FILES.read is matrixfiles.read_npy
    assert matrix.NPY_FILES.write is matrixfiles.write_npy


@pytest.mark.parametrize("dtype", ["float64", "complex64"])
def test_file_rows_go_up_transposed_a_strip_at_a_time(rng, monkeypatch, dtype):
    """A block lying by columns in its file is made from the file's rows, a
    strip of them at a time (here on NumPy: the device's steps, no GPU):
    every strip and the last, shorter one land where they belong,
    conjugated where asked."""
    monkeypatch.setattr(matrixfiles, "TRANSPOSE_STRIP", 4)
    rows = random_array(rng, (11, 6), dtype)  # the file's rows: the block's columns
    for conjugate in (False, True):
        block = matrixfiles._uploaded(rows, True, conjugate, NumpyBackend())
        assert block.flags.c_contiguous
        assert np.array_equal(block, rows.conj().T if conjugate else rows.T)
