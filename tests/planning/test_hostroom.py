"""Host memory a run takes for itself, against what its machine has
available: refused before the first read, in one line."""

import io
import os

import numpy as np
import pytest

from summa import cli
from summa.api import files as files_module
from summa.planning import hostroom
from summa.planning.hostroom import check_host_room
from summa.planning.units import format_bytes
from test_multiply import save


@pytest.mark.mpi(min_size=1)
def test_the_ranks_of_a_machine_are_summed_against_what_it_has(comm, monkeypatch):
    ranks = comm.Get_size()  # (the test's ranks share one machine)
    monkeypatch.setattr(hostroom, "available_host_memory", lambda: 1000 * ranks)
    check_host_room(1000, comm)  # exactly what is available
    with pytest.raises(ValueError) as e:
        check_host_room(1001, comm, hint="use more nodes")
    assert str(e.value) == (f"the {ranks} rank{'s' if ranks > 1 else ''} on rank "
                            f"{comm.Get_size() - 1}'s machine need {format_bytes(1001 * ranks)} of "
                            f"host memory, and it has {format_bytes(1000 * ranks)} available; "
                            "free some "
                            "memory or use more nodes")


def test_a_system_that_does_not_say_is_not_refused(comm, monkeypatch):
    monkeypatch.setattr(hostroom, "available_host_memory", lambda: None)
    check_host_room(1 << 60, comm.Split(comm.Get_rank()))


def test_available_host_memory_is_meminfos_figure():
    with open("/proc/meminfo") as fh:
        said = [int(x.split()[1]) * 1024 for x in fh if x.startswith("MemAvailable:")]
    assert hostroom.available_host_memory() == (said[0] if said else None)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("out_of_core", [False, True])
def test_multiply_refuses_blocks_the_machine_cannot_take_before_reading(comm, folder,
                                                                       monkeypatch, out_of_core):
    pa = save(comm, folder, "A.npy", np.ones((40, 30)))
    pb = save(comm, folder, "B.npy", np.ones((30, 20)).astype(np.float32))  # read, not mapped
    monkeypatch.setattr(hostroom, "available_host_memory", lambda: 2048)
    reached = []
    monkeypatch.setattr(files_module, "_read_files", lambda *args: reached.append("read"))
    before = sorted(os.listdir(folder))
    with pytest.raises(ValueError, match=r"machine need [\d.]+ KiB of host memory, and it has "
                                         r"2.0 KiB available"):
        files_module.multiply_files(pa, pb, str(folder / "C.npy"), comm, quiet=True,
                                    backend="numpy", dtype="float64", out_of_core=out_of_core,
                                    device_memory="40KiB" if out_of_core else None,
                                    panel_width=4)
    assert reached == []
    comm.Barrier()
    assert sorted(os.listdir(folder)) == before


def test_bench_refuses_matrices_the_machine_cannot_take_before_making_them(comm, monkeypatch):
    monkeypatch.setattr(hostroom, "available_host_memory", lambda: 4096)
    with pytest.raises(cli.UsageError, match="of host memory, and it has 4.0 KiB available"):
        cli.main(["bench", "--size", "64", "--backend", "numpy"], comm, io.StringIO())


def test_matmul_refuses_a_product_the_machine_cannot_take(monkeypatch):
    import summa
    a, b = np.ones((64, 32)), np.ones((32, 48))
    product = 64 * 48 * 8
    monkeypatch.setattr(hostroom, "available_host_memory", lambda: product - 1)
    with pytest.raises(ValueError, match=f"need {product / 1024:.1f} KiB of host memory"):
        summa.matmul(a, b, backend="numpy", workers=1)
    out = np.empty((64, 48))  # written in place: nothing more to take
    assert summa.matmul(a, b, backend="numpy", workers=1, out=out) is out
    assert np.array_equal(out, a @ b)
