"""The .npy files workflow (:mod:`summa.api.files`): products of files
under MPI within the gauge, dtypes, bad input, NaN and overflow warnings,
streamed and out-of-core files, and whole `multiply` jobs for exit statuses,
atomic output and killed ranks."""

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from helpers import (data_warnings, gemm_scaled_error, random_array, spy_out_of_core,
                     without_launcher_banner)
from summa.api import fileplan, files as files_module
from summa.api.fileplan import check_is_cheap
from summa.api.files import CheckFailed, multiply_files
from summa.host import npyoutput
from summa.host.npyoutput import npy_bytes
from summa.planning import memorycheck
from test_cli import job
from test_multiply import save


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dtype", ["float64", "float32", "complex128", "complex64"])
def test_odd_shapes_equal_numpy_within_gauge(comm, rng, folder, dtype):
    a, b = random_array(rng, (137, 41), dtype), random_array(rng, (41, 203), dtype)
    pa = save(comm, folder, "A.npy", a)
    pb = save(comm, folder, "B.npy", b, fortran=True)
    record = multiply_files(pa, pb, str(folder / "C.npy"), comm, check=True, quiet=True,
                            panel_width=16)
    assert record["check_residual"] <= 1 and record["dtype"] == dtype
    parts = record["read_parts"]  # this rank's read, by operand: within the read phase
    assert set(parts) == {"A", "B", "C"} and sum(parts.values()) <= record["read_seconds"] + 1e-3
    if comm.rank == 0:
        c = np.load(folder / "C.npy")
        assert c.dtype == dtype and gemm_scaled_error(c, a, b) <= 1


@pytest.mark.mpi(min_size=1)
def test_auto_width_is_settled_in_the_set_up_not_by_the_multiply(comm, rng, folder,
                                                                  monkeypatch):
    """An "auto" width: measured once, by the planner in the set-up phase
    (summa.planning.distributed.settled_plan), never by the executor."""
    from summa.planning import tuning
    monkeypatch.setattr(tuning, "_cache", {})
    calls, running = [], []
    measure, run = tuning.auto_panel_width, files_module.run_in_memory

    def counted(*args, **kwargs):
        assert not running, "the executor measured a panel width"
        calls.append(1)
        return measure(*args, **kwargs)

    def executing(plan, *args, **kwargs):
        assert isinstance(plan.panel_width, int)
        running.append(1)
        return run(plan, *args, **kwargs)

    monkeypatch.setattr(tuning, "auto_panel_width", counted)
    monkeypatch.setattr(files_module, "run_in_memory", executing)
    a, b = random_array(rng, (57, 300), "float64"), random_array(rng, (300, 43), "float64")
    pa, pb = save(comm, folder, "A.npy", a), save(comm, folder, "B.npy", b)
    record = multiply_files(pa, pb, str(folder / "C.npy"), comm, check=True, quiet=True,
                            panel_width="auto")
    # (out of core, as one GPU rank takes files, nothing runs in memory to measure for)
    assert record["check_residual"] <= 1 and (running or record["out_of_core"])
    assert len(calls) == (1 if comm.Get_size() > 1 and running else 0)
    assert len(set(comm.allgather(record["panel_width"]))) == 1


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dtype", ["float64", "complex64"])
def test_fortran_ordered_and_transposed_files_stream_as_they_lie(comm, rng, folder, dtype):
    """Out of core, files read as they lie by columns (Fortran order, a C
    file transposed) are memory-mapped and streamed like C-ordered ones:
    their blocks are the GEMMs' transposed operands (the plan's storage
    says so), nothing read into C order first; op H of complex files is
    read (its conjugate would be a copy); every product right."""
    m, n, k = 37, 29, 31
    for (fa, ta), (fb, tb) in [((True, "N"), (False, "T")), ((False, "T"), (True, "N")),
                               ((True, "T"), (True, "H")), ((True, "H"), (False, "N"))]:
        a = random_array(rng, (m, k) if ta == "N" else (k, m), dtype)
        b = random_array(rng, (k, n) if tb == "N" else (n, k), dtype)
        pa, pb = save(comm, folder, "A.npy", a, fortran=fa), save(comm, folder, "B.npy", b,
                                                                   fortran=fb)
        record = multiply_files(pa, pb, str(folder / "C.npy"), comm, trans_a=ta, trans_b=tb,
                                device_memory="16KiB", backend="numpy", quiet=True,
                                panel_width=8)
        assert record["streamed"]
        mapped = [t != "H" or dtype == "float64" for t in (ta, tb)]
        cols = [x and (f != (t != "N")) for x, f, t in zip(mapped, (fa, fb), (ta, tb))]
        assert record["plan"]["storage"] == ["cols" if c else "rows" for c in cols], (ta, tb)
        if comm.rank == 0:
            c = np.load(folder / "C.npy")
            assert gemm_scaled_error(c, a, b, trans_a=ta, trans_b=tb) <= 1, (fa, ta, fb, tb)
        comm.Barrier()


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("ta,tb", [("T", "N"), ("N", "H"), ("H", "T")])
def test_transposes_alpha_beta_and_c0(comm, rng, folder, ta, tb):
    m, n, k = 23, 17, 11
    a = random_array(rng, (m, k) if ta == "N" else (k, m), "complex128")
    b = random_array(rng, (k, n) if tb == "N" else (n, k), "complex128")
    c0 = random_array(rng, (m, n), "complex128")
    pa, pb = save(comm, folder, "A.npy", a, fortran=True), save(comm, folder, "B.npy", b)
    pc = save(comm, folder, "C0.npy", c0)
    multiply_files(pa, pb, str(folder / "C.npy"), comm, alpha=2 - 1j, beta=0.5, c_path=pc,
                   trans_a=ta, trans_b=tb, check=True, quiet=True, panel_width=4)
    if comm.rank == 0:
        c = np.load(folder / "C.npy")
        assert gemm_scaled_error(c, a, b, c0, 2 - 1j, 0.5, ta, tb) <= 1


@pytest.mark.mpi(min_size=1)
def test_dtype_conversion_and_integers(comm, rng, folder):
    a = rng.integers(-5, 5, (9, 8))
    b = random_array(rng, (8, 6), "float32")
    pa, pb = save(comm, folder, "A.npy", a), save(comm, folder, "B.npy", b)
    # the message names the file, not the operand's letter
    with pytest.raises(ValueError, match=f"^{re.escape(pa)}: integer dtype int64; pass --dtype"):
        multiply_files(pa, pb, str(folder / "C.npy"), comm, quiet=True)
    multiply_files(pa, pb, str(folder / "C.npy"), comm, dtype="float64", quiet=True)
    if comm.rank == 0:
        c = np.load(folder / "C.npy")
        assert c.dtype == np.float64 and gemm_scaled_error(c, a.astype(float), b) <= 1


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("streamed", [False, True])
def test_files_of_two_dtypes_multiply_in_their_common_type(comm, rng, folder, streamed):
    """A float32 file and a complex128 one multiply as NumPy's matmul
    multiplies them: in complex128, the product's file of that type."""
    a, b = random_array(rng, (9, 8), "float32"), random_array(rng, (8, 6), "complex128")
    pa, pb = save(comm, folder, "A.npy", a), save(comm, folder, "B.npy", b)
    multiply_files(pa, pb, str(folder / "C.npy"), comm, quiet=True, panel_width=3,
                   out_of_core=streamed, device_memory="2KiB" if streamed else None)
    if comm.rank == 0:
        c = np.load(folder / "C.npy")
        assert c.dtype == np.complex128 and gemm_scaled_error(c, a.astype(complex), b) <= 1


@pytest.mark.mpi(min_size=1)
def test_bad_input_raises_everywhere_and_writes_nothing(comm, rng, folder):
    a, b = random_array(rng, (6, 5), "float64"), random_array(rng, (4, 3), "float64")
    pa, pb = save(comm, folder, "A.npy", a), save(comm, folder, "B.npy", b)
    pb32 = save(comm, folder, "B32.npy", random_array(rng, (4, 3), "float32"))
    pb5 = save(comm, folder, "B5.npy", random_array(rng, (5, 3), "float64"))
    out = str(folder / "C.npy")
    cases = [
        ((pa, pb, out), {}, "inner dimensions differ: op\\(.*A.npy\\) is 6x5 but op\\(.*B.npy\\) is 4x3"),
        ((pa, pb32, out), {}, "inner dimensions differ"),
        ((pa, str(folder / "nope.npy"), out), {}, "nope.npy: no such file"),
        ((pa, pb5, str(folder / "missing" / "C.npy")), {}, "does not exist"),
        ((pa, pb5, pa), {}, "would overwrite the input"),
        ((pa, pb5, out), {"beta": 1.0}, "C0 is needed"),
        ((pa, pb5, out), {"beta": 1.0, "c_path": pb5}, "is 5x3, but the product is 6x3"),
        ((pa, pb5, out), {"grid": (comm.Get_size() + 1, 1)}, "needs"),
        ((pa, pb5, out), {"trans_a": "X"}, "trans_a must be"),
        ((pa, pb5, out), {"schedule": "strips", "out_of_core": True}, "device memory only"),
    ] + ([((pa, pb5, out), {"schedule": "strips", "grid": (1, comm.Get_size())},
           "one column")] if comm.Get_size() > 1 else [])
    for args, kwargs, match in cases:
        with pytest.raises(ValueError, match=match):
            multiply_files(*args, comm, quiet=True, **kwargs)
    if comm.rank == 0:
        assert sorted(p.name for p in folder.iterdir()) == ["A.npy", "B.npy", "B32.npy",
                                                            "B5.npy"]


@pytest.mark.mpi(min_size=1)
def test_nan_inputs_compute_but_warn(comm, rng, folder):
    a = random_array(rng, (7, 4), "float64")
    a[2, 1] = np.nan
    a[5, 3] = np.inf
    pa = save(comm, folder, "A.npy", a)
    pb = save(comm, folder, "B.npy", random_array(rng, (4, 5), "float64"))
    warnings = []
    multiply_files(pa, pb, str(folder / "C.npy"), comm, quiet=True, check=False,
                   warn=warnings.append)
    warnings = data_warnings(warnings)
    if comm.rank == 0:
        assert len(warnings) == 1 and "A.npy contains 2 NaN/Inf" in warnings[0]
        c = np.load(folder / "C.npy")
        assert np.isnan(c[2]).all() and not np.isnan(c[0]).any()
    else:
        assert warnings == []


@pytest.mark.mpi(min_size=1)
def test_failed_check_writes_nothing(comm, rng, folder, monkeypatch):
    import summa.api.files as mod
    monkeypatch.setattr(mod, "freivalds", lambda *a, **k: 7.5)
    pa = save(comm, folder, "A.npy", random_array(rng, (5, 5), "float64"))
    with pytest.raises(CheckFailed, match="scaled residual 7.500e\\+00 > 1"):
        multiply_files(pa, pa, str(folder / "C.npy"), comm, check=True, quiet=True)
    if comm.rank == 0:
        assert not (folder / "C.npy").exists()
        assert [p.name for p in folder.iterdir()] == ["A.npy"]


def test_check_cost_rule():
    # O(N^2) check against O(N^3) multiply: off for small products, on for large ones
    for backend, small, large in (("cupy", 1000, 100_000), ("numpy", 300, 50_000)):
        assert not check_is_cheap(small, small, small, 8, backend)
        assert check_is_cheap(large, large, large, 8, backend)
    # a thin inner dimension makes the multiply cheap and the check relatively dear
    assert not check_is_cheap(100_000, 100_000, 16, 8, "cupy")


# -- whole jobs --------------------------------------------------------------------------

def _files(tmp_path, shape_a=(37, 21), shape_b=(21, 29)):
    rng = np.random.default_rng()
    np.save(tmp_path / "A.npy", rng.uniform(-1, 1, shape_a))
    np.save(tmp_path / "B.npy", rng.uniform(-1, 1, shape_b))
    return str(tmp_path / "A.npy"), str(tmp_path / "B.npy"), str(tmp_path / "C.npy")


def test_multiply_job_integer_file_is_named(tmp_path):
    a, b, c = _files(tmp_path)
    np.save(tmp_path / "I.npy", np.arange(37 * 21).reshape(37, 21))
    p = job(2, "multiply", str(tmp_path / "I.npy"), b, "-o", c, "--backend", "numpy")
    assert p.returncode == 2, p.stderr
    assert f"summa: error: {tmp_path / 'I.npy'}: integer dtype int64; pass --dtype" in p.stderr
    assert not Path(c).exists()


def test_multiply_job_reads_big_endian_files_into_native_order(tmp_path):
    """.npy files stored big-endian (another machine's) multiply in their
    type, read into native order; the product is written native."""
    rng = np.random.default_rng()
    x, y, z = (rng.uniform(-1, 1, s) for s in ((37, 21), (21, 29), (37, 29)))
    for name, v in (("A", x), ("B", y), ("C0", z)):
        np.save(tmp_path / f"{name}.npy", v.astype(">f8"))
    c = tmp_path / "C.npy"
    p = job(2, "multiply", str(tmp_path / "A.npy"), str(tmp_path / "B.npy"), "-o", str(c),
            "--beta", "0.5", "--c", str(tmp_path / "C0.npy"), "--device-memory", "8KiB",
            "--backend", "numpy")
    assert p.returncode == 0, p.stderr
    product = np.load(c)
    assert product.dtype == np.dtype("=f8")
    assert gemm_scaled_error(product, x, y, z, 1.0, 0.5) <= 1


def test_multiply_job_with_check(tmp_path):
    import json
    a, b, c = _files(tmp_path)
    log = tmp_path / "runs.jsonl"
    p = job(3, "multiply", a, b, "-o", c, "--check", "--quiet", "--json", str(log))
    assert p.returncode == 0, p.stderr
    assert "scaled residual" in p.stdout and Path(c).exists()
    record = json.loads(log.read_text())
    assert (record["m"], record["n"], record["k"], record["ranks"]) == (37, 29, 21, 3)
    assert record["check_residual"] <= 1
    assert all(record[f"{phase}_seconds"] > 0 for phase in ("read", "compute", "check", "write"))


@pytest.mark.parametrize("args,match", [
    (["--grid", "2x2"], "grid 2x2 needs 4 ranks, but 2 were started"),
    (["--beta", "1"], "C0 is needed"),
    (["--alpha", "x"], "--alpha: expected a number"),
    (["--schedule", "strips", "--grid", "1x2"], "needs a grid of one column (P x 1), not 1x2"),
    (["--schedule", "strips", "--out-of-core"], "runs in device memory only, not out of core"),
])
def test_multiply_job_bad_input_exit_2(tmp_path, args, match):
    a, b, c = _files(tmp_path)
    p = job(2, "multiply", a, b, "-o", c, *args)
    assert p.returncode == 2, p.stderr
    ours = [line for line in p.stderr.splitlines() if "summa" in line or "Traceback" in line]
    assert len(ours) == 1 and match in ours[0]
    assert not Path(c).exists()


def test_multiply_job_in_column_strips(tmp_path):
    import json
    a, b, c = _files(tmp_path)
    log = tmp_path / "runs.jsonl"
    p = job(2, "multiply", a, b, "-o", c, "--schedule", "strips", "--nb", "4", "--check",
            "--quiet", "--json", str(log))
    assert p.returncode == 0, p.stderr
    got = np.load(c)
    assert got.shape == (37, 29) and gemm_scaled_error(got, np.load(a), np.load(b)) <= 1
    record = json.loads(log.read_text())
    # on GPUs the first strip goes in HEAD_PIECES pieces
    from summa.planning.schedule import HEAD_PIECES
    pieces = HEAD_PIECES - 1 if record["backend"] == "cupy" else 0
    assert record["schedule"] == "strips" and record["panels"] == -(-29 // 4) + pieces
    assert record["transposed_a"] is False  # strips read A as it is


def test_multiply_job_records_transposed_panels(tmp_path):
    import json
    a, b, c = _files(tmp_path)
    log = tmp_path / "runs.jsonl"
    p = job(2, "multiply", a, b, "-o", c, "--nb", "4", "--check", "--quiet", "--json", str(log),
            env={"SUMMA_TRANSPOSE_A": "yes"})
    assert p.returncode == 0, p.stderr
    assert gemm_scaled_error(np.load(c), np.load(a), np.load(b)) <= 1
    assert json.loads(log.read_text())["transposed_a"] is True


def test_multiply_job_dtype_mismatch_names_both_files(tmp_path):
    """Two types whose common one summa does not compute in (float64 and
    long double): refused, naming both files (float32 and float64 multiply
    in float64, test_files_of_two_dtypes_multiply_in_their_common_type)."""
    a, b, c = _files(tmp_path)
    np.save(b, np.ones((21, 29), dtype=np.longdouble))
    p = job(2, "multiply", a, b, "-o", c)
    assert p.returncode == 2
    assert f"{a} is float64 but {b} is {np.dtype(np.longdouble).name}" in p.stderr


@pytest.mark.parametrize("phase", ["read", "multiply", "write"])
def test_killed_rank_leaves_no_output(tmp_path, phase):
    a, b, c = _files(tmp_path)
    p = job(3, "multiply", a, b, "-o", c, "--quiet",
            env={"SUMMA_INJECT_FAULT": f"{phase}:1:kill"}, timeout=90)
    assert p.returncode != 0
    assert not Path(c).exists()


@pytest.mark.parametrize("phase", ["read", "check", "write"])
def test_rank_raising_ends_the_job_with_its_message(tmp_path, phase):
    a, b, c = _files(tmp_path)
    p = job(3, "multiply", a, b, "-o", c, "--quiet", "--check",
            env={"SUMMA_INJECT_FAULT": f"{phase}:2:raise"}, timeout=90)
    assert p.returncode != 0
    assert f"injected fault in {phase} on rank 2" in p.stderr, (p.returncode, p.stderr)
    assert not Path(c).exists()


@pytest.mark.parametrize("extra", [[], ["--device-memory", "16KiB"]])
def test_a_full_disk_on_one_rank_ends_the_job_in_one_line(tmp_path, extra):
    """An OSError (a disk full while the product is written, a file gone):
    that rank says it in one line, with no traceback, the job ends with
    status 1 and no output under any name."""
    a, b, c = _files(tmp_path)
    p = job(3, "multiply", a, b, "-o", c, "--quiet", "--backend", "numpy", *extra,
            env={"SUMMA_INJECT_FAULT": "write:1:ioerror"}, timeout=90)
    assert p.returncode == 1, p.stderr
    assert "rank 1" in p.stderr and "No space left on device (injected in write)" in p.stderr
    assert "Traceback" not in p.stderr and p.stderr.count("No space left") == 1
    assert not Path(c).exists() and not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("fortran_b,trans_b", [(False, "N"), (True, "N"), (False, "T")])
def test_out_of_core_files_stream_from_and_into_the_files(comm, rng, folder, monkeypatch,
                                                          fortran_b, trans_b):
    seen = spy_out_of_core(monkeypatch)
    a = random_array(rng, (43, 31), "float64")
    b = random_array(rng, (31, 27) if trans_b == "N" else (27, 31), "float64")
    pa, pb = save(comm, folder, "A.npy", a), save(comm, folder, "B.npy", b, fortran=fortran_b)
    record = multiply_files(pa, pb, str(folder / "C.npy"), comm, trans_b=trans_b,
                            out_of_core=True, device_memory="40KiB", panel_width=4,
                            check=True, quiet=True, backend="numpy")
    (A, B, C), = seen
    assert record["streamed"] and record["check_residual"] <= 1
    assert isinstance(A.base, memoryview) or A.base is not None  # a view of the file's map
    assert not A.flags.writeable and C.flags.writeable
    # B is mapped however it lies: by columns (the GEMMs' transposed operand)
    # where the file is Fortran-ordered or read transposed, not both
    from summa.host.storage import storage_of
    assert not B.flags.writeable
    assert storage_of(B) == ("cols" if fortran_b != (trans_b != "N") else "rows")
    if comm.rank == 0:
        got = np.load(folder / "C.npy")
        assert gemm_scaled_error(got, a, b, trans_b=trans_b) <= 1
        assert sorted(p.name for p in folder.iterdir()) == ["A.npy", "B.npy", "C.npy"]


@pytest.mark.mpi(min_size=1)
def test_a_failed_check_of_a_streamed_product_leaves_no_file(comm, rng, folder, monkeypatch):
    import summa.api.files as mod
    monkeypatch.setattr(mod, "freivalds", lambda *a, **k: 3.0)
    pa = save(comm, folder, "A.npy", random_array(rng, (9, 9), "float64"))
    with pytest.raises(CheckFailed, match="scaled residual"):
        multiply_files(pa, pa, str(folder / "C.npy"), comm, out_of_core=True, check=True,
                       quiet=True, backend="numpy", device_memory="8KiB", panel_width=2)
    if comm.rank == 0:
        assert [p.name for p in folder.iterdir()] == ["A.npy"]


@pytest.mark.mpi(min_size=1)
def test_nan_in_a_streamed_input_is_still_reported(comm, rng, folder):
    a = random_array(rng, (6, 4), "float64")
    a[1, 2] = np.inf
    pa = save(comm, folder, "A.npy", a)
    pb = save(comm, folder, "B.npy", random_array(rng, (4, 5), "float64"))
    warnings = []
    multiply_files(pa, pb, str(folder / "C.npy"), comm, quiet=True, check=False,
                   warn=warnings.append, out_of_core=True, backend="numpy")
    warnings = data_warnings(warnings)
    if comm.rank == 0:
        assert len(warnings) == 1 and "A.npy contains 1 NaN/Inf" in warnings[0]


@pytest.mark.parametrize("phase", ["read", "multiply", "write"])
def test_a_streamed_job_killed_or_raising_leaves_no_output(tmp_path, phase):
    a, b, c = _files(tmp_path)
    for action in ("kill", "raise"):
        p = job(3, "multiply", a, b, "-o", c, "--quiet", "--device-memory", "16KiB",
                "--backend", "numpy", env={"SUMMA_INJECT_FAULT": f"{phase}:1:{action}"},
                timeout=90)
        assert p.returncode != 0, p.stderr
        assert not Path(c).exists()
        left = [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]
        assert action == "kill" or not left  # a killed rank may leave its hidden .tmp
        for f in left:
            os.unlink(tmp_path / f)


def test_multiply_accounts_for_its_wall_time(tmp_path):
    a, b, c = _files(tmp_path)
    p = job(2, "multiply", a, b, "-o", c, "--quiet", "--device-memory", "16KiB",
            "--backend", "numpy")
    assert p.returncode == 0, p.stderr
    assert "blocks mapped from the files" in p.stdout
    start = float(re.search(r"start-up ([\d.]+) s", p.stdout).group(1))
    found = re.search(r"wall ([\d.]+) s so far(?:, ([\d.]+) s of it in none)?", p.stdout)
    wall, rest = float(found.group(1)), float(found.group(2) or 0)
    assert 0 < start < wall and 0 <= rest < wall  # the phases are a share of the wall time


@pytest.mark.parametrize("wall,shown", [
    (2.0, ", 0.500 s of it in none of the phases"),  # time outside the phases
    (1.5005, ""),    # under a millisecond: not worth a word
    (1.498, ""),     # the slowest ranks' phases passing the wall time: no negative residue
])
def test_wall_line_never_shows_a_negative_or_tiny_rest(wall, shown):
    from summa.cli.multiply import wall_line
    record = {"wall_seconds": wall, "startup_seconds": 0.5, "prepare_seconds": 0.25,
              "read_seconds": 0.25, "setup_seconds": 0.1, "compute_seconds": 0.4,
              "check_seconds": None, "write_seconds": None, "scan_seconds": 0.0}
    assert wall_line(record) == f"  wall {wall:.3f} s so far{shown}"


def test_multiply_streams_files_through_gpus_by_default_where_it_can():
    from summa.host.npyio import NpyHeader
    from summa.api.fileplan import streams_by_default
    f64 = np.dtype("float64")
    c_order = NpyHeader("A.npy", (10, 10), f64, False, 128)
    fortran = NpyHeader("B.npy", (10, 10), f64, True, 128)
    files = {"A": c_order, "B": c_order, "C0": None}
    assert streams_by_default("cupy", files, "N", "N", f64)
    assert not streams_by_default("numpy", files, "N", "N", f64)      # CPUs: in memory
    # transposed reads and Fortran order: blocks lying by columns, mapped too
    assert streams_by_default("cupy", files, "T", "H", f64)
    assert streams_by_default("cupy", dict(files, B=fortran), "N", "T", f64)
    c128 = np.dtype("complex128")  # op H of complex: its conjugate would be a copy
    complex_files = {name: NpyHeader("A.npy", (10, 10), c128, False, 128) for name in "AB"}
    assert streams_by_default("cupy", dict(complex_files, C0=None), "T", "N", c128)
    assert not streams_by_default("cupy", dict(complex_files, C0=None), "H", "N", c128)
    assert not streams_by_default("cupy", files, "N", "N", np.dtype("float32"))  # converted
    assert not streams_by_default("cupy", dict(files, C0=c_order), "N", "N", f64)
    assert not streams_by_default("cupy", files, "N", "N", f64, block=(4, 4))
    assert not streams_by_default("cupy", files, "N", "N", f64, schedule="strips")


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("out_of_core", [False, True])
def test_an_overflowing_product_of_finite_inputs_is_reported(comm, rng, folder, out_of_core):
    # Finite inputs whose products pass float64's largest value: the product
    # has Inf, and the warning says it overflowed, not that an input is bad.
    a = random_array(rng, (6, 4), "float64") + 2.0
    a[3] *= 1e300
    pa = save(comm, folder, "A.npy", a)
    pb = save(comm, folder, "B.npy", (random_array(rng, (4, 5), "float64") + 2.0) * 1e300)
    warnings = []
    multiply_files(pa, pb, str(folder / "C.npy"), comm, quiet=True, check=False,
                   warn=warnings.append, out_of_core=out_of_core, backend="numpy")
    warnings = data_warnings(warnings)
    if comm.rank == 0:
        assert len(warnings) == 1 and "overflowed" in warnings[0], warnings
        assert np.isinf(np.load(folder / "C.npy")).any()


@pytest.mark.mpi(min_size=1)
def test_a_finite_streamed_product_reads_its_inputs_once(comm, rng, folder, monkeypatch):
    # The product's finiteness stands for the inputs': their scan (a second
    # read of the files) is never made.
    from summa.api import files as files_module
    pa = save(comm, folder, "A.npy", random_array(rng, (8, 6), "float64"))
    pb = save(comm, folder, "B.npy", random_array(rng, (6, 7), "float64"))

    def scanned(*args, **kwargs):
        raise AssertionError("the inputs were scanned")
    monkeypatch.setattr(files_module, "_warn_nonfinite", scanned)
    record = multiply_files(pa, pb, str(folder / "C.npy"), comm, quiet=True, check=False,
                            out_of_core=True, backend="numpy")
    assert record["streamed"]


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("fails", [False, True])
def test_the_inputs_are_read_ahead_and_no_reader_outlives_the_call(comm, rng, folder,
                                                                     monkeypatch, fails):
    # Each rank of a node reads its share of A's and B's bytes ahead (the
    # disk starts while CUDA starts); done or failed, no reading thread stays.
    import threading
    import time

    from summa.host import filemaps
    from summa.distribution.grid import node_rank
    pa = save(comm, folder, "A.npy", random_array(rng, (300, 200), "float64"))
    pb = save(comm, folder, "B.npy", random_array(rng, (200, 100), "float64"))
    asked = []
    real = filemaps.read_ahead
    monkeypatch.setattr(fileplan, "read_ahead",
                        lambda path, first, last: asked.append((path, first, last)) or
                        real(path, first, last))
    monkeypatch.setattr(filemaps, "PREFETCH_CHUNK", 4096)
    monkeypatch.setattr(filemaps, "_file_resident", lambda path, first, last: None)
    slow = os.preadv

    def read(*args):  # the read-ahead's reads take long: it must be stopped, not finish
        if threading.current_thread().name == "summa-prefetch":
            time.sleep(0.2)
        return slow(*args)
    monkeypatch.setattr(filemaps.os, "preadv", read)
    if fails:  # on every rank alike (one rank's raise would leave the others waiting)
        monkeypatch.setenv("SUMMA_INJECT_FAULT",
                           ",".join(f"read:{r}:raise" for r in range(comm.Get_size())))
    try:
        multiply_files(pa, pb, str(folder / "C.npy"), comm, quiet=True, check=False,
                       backend="numpy")
    except RuntimeError:
        assert fails
    assert [os.path.basename(p) for p, _, _ in asked] == ["A.npy", "B.npy"]
    local, size = node_rank(comm)
    a_bytes = 300 * 200 * 8  # this rank's share of A's bytes
    assert asked[0][2] - asked[0][1] == a_bytes * (local + 1) // size - a_bytes * local // size
    deadline = time.monotonic() + 2
    while any(t.name == "summa-prefetch" for t in threading.enumerate()) and \
            time.monotonic() < deadline:
        time.sleep(0.02)
    assert not any(t.name == "summa-prefetch" for t in threading.enumerate())


def _no_work(monkeypatch) -> list:
    """Steps of a multiply of files after its checks (the read-ahead, the
    backend's start, the read phase, the output's writer), each noted in
    the list returned where reached, none of them run."""
    done = []

    def step(name):
        def noted(*args, **kwargs):
            done.append(name)
            raise AssertionError(f"{name} reached")
        return noted
    for module, name in ((fileplan, "read_ahead"), (fileplan, "get_backend"),
                         (files_module, "_read_files"), (files_module, "AtomicNpyWriter")):
        monkeypatch.setattr(module, name, step(name))
    return done


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("replaces", [False, True])
def test_an_output_the_disk_cannot_hold_is_refused_before_anything_is_read(
        comm, rng, folder, monkeypatch, replaces):
    # an existing output is freed only by the rename: it is no room for the new one
    pa = save(comm, folder, "A.npy", random_array(rng, (40, 30), "float64"))
    pb = save(comm, folder, "B.npy", random_array(rng, (30, 20), "float32"))
    old = save(comm, folder, "C.npy", np.ones((40, 20))) if replaces else None
    need = npy_bytes((40, 20), "float64")  # float64 and float32 multiply in float64
    monkeypatch.setattr(npyoutput, "free_space", lambda where: need - 1)
    done = _no_work(monkeypatch)
    before = sorted(os.listdir(folder))
    with pytest.raises(ValueError) as refused:
        multiply_files(pa, pb, str(folder / "C.npy"), comm, quiet=True)
    message = str(refused.value)
    assert message.startswith(f"{folder / 'C.npy'}: the output needs {need / 1024:.1f} KiB "
                              f"of disk space, and {folder} has {(need - 1) / 1024:.1f} KiB free")
    assert ("freed only once the new file replaces it" in message) == replaces
    assert "\n" not in message and done == []
    comm.Barrier()
    assert sorted(os.listdir(folder)) == before
    if replaces:
        assert np.array_equal(np.load(old), np.ones((40, 20)))


@pytest.mark.mpi(min_size=1)
def test_an_output_that_just_fits_the_disk_is_written(comm, rng, folder, monkeypatch):
    a, b = random_array(rng, (40, 30), "float64"), random_array(rng, (30, 20), "float64")
    pa, pb = save(comm, folder, "A.npy", a), save(comm, folder, "B.npy", b)
    monkeypatch.setattr(npyoutput, "free_space", lambda where: npy_bytes((40, 20), "float64"))
    multiply_files(pa, pb, str(folder / "C.npy"), comm, quiet=True, backend="numpy")
    if comm.rank == 0:
        assert gemm_scaled_error(np.load(folder / "C.npy"), a, b) <= 1


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("out_of_core", [False, True])
def test_a_plan_the_nodes_memory_cannot_hold_is_refused_before_the_read(
        comm, rng, folder, monkeypatch, out_of_core):
    pa = save(comm, folder, "A.npy", random_array(rng, (40, 30), "float64"))
    pb = save(comm, folder, "B.npy", random_array(rng, (30, 20), "float64"))
    total = 4096  # a node too small for the ranks' blocks of A, B and C
    monkeypatch.setattr(memorycheck, "host_memory_total", lambda: total)
    reached = []
    for name in ("_read_files", "AtomicNpyWriter"):
        monkeypatch.setattr(files_module, name, lambda *args, name=name, **kwargs:
                            reached.append(name))
    before = sorted(os.listdir(folder))
    with pytest.raises(ValueError, match=rf"rank\(s\) on rank \d+'s node need [\d.]+ KiB of "
                                         rf"host memory, and the node has {total / 1024:.1f} "
                                         "KiB in all; use more nodes"):
        multiply_files(pa, pb, str(folder / "C.npy"), comm, quiet=True, backend="numpy",
                       out_of_core=out_of_core, device_memory="40KiB" if out_of_core else None,
                       panel_width=4)
    assert reached == []
    comm.Barrier()
    assert sorted(os.listdir(folder)) == before


@pytest.mark.parametrize("launch", ["mpiexec", "workers"])
def test_the_multiply_command_refuses_an_output_larger_than_the_free_disk(tmp_path, launch):
    """No hook: a product of two thin files whose output is twice the disk's
    free space, refused in one line with status 2 at once, on 2 ranks under
    mpiexec or in the pool the command starts by itself."""
    free = shutil.disk_usage(tmp_path).free
    if free > 2**45:
        pytest.skip("a file system with over 32 TiB free")
    side = int((2 * free / 8) ** 0.5) + 1  # side x side float64: twice what is free
    np.save(tmp_path / "A.npy", np.ones((side, 1)))
    np.save(tmp_path / "B.npy", np.ones((1, side)))
    args = ("multiply", str(tmp_path / "A.npy"), str(tmp_path / "B.npy"), "-o",
            str(tmp_path / "C.npy"), "--backend", "numpy")
    t0 = time.monotonic()
    if launch == "mpiexec":
        p = job(2, *args, timeout=90)
    else:  # without a launcher: the command starts its own two ranks
        p = subprocess.run([sys.executable, "-m", "summa", *args], capture_output=True,
                           text=True, timeout=90, env=dict(
                               os.environ, SUMMA_WORKERS="2",
                               PYTHONPATH=str(Path(files_module.__file__).parents[2])))
    assert p.returncode == 2, p.stderr
    said = without_launcher_banner(p.stderr)
    assert said.count("\n") == 1 and said.startswith(
        f"summa: error: {tmp_path / 'C.npy'}: the output needs "), p.stderr
    assert f"of disk space, and {tmp_path} has " in said and " free; " in said
    assert time.monotonic() - t0 < 60
    assert sorted(os.listdir(tmp_path)) == ["A.npy", "B.npy"]
