"""The command line: in-process under MPI, and whole jobs under mpiexec for exit
statuses and messages."""

import io
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from summa.cli import bench, benchrun, ideal
from summa import cli
from summa.device.backend import cupy_available
from helpers import LAUNCHER_VARIABLES
from leftovers import job_pids

ROOT = Path(__file__).resolve().parents[2]


def mpiexec() -> list[str]:
    """The launcher ./run chose, else one next to this Python or on PATH."""
    if os.environ.get("SUMMA_MPIEXEC"):
        return shlex.split(os.environ["SUMMA_MPIEXEC"])
    beside = Path(sys.executable).with_name("mpiexec")
    found = str(beside) if beside.exists() else shutil.which("mpiexec")
    if not found:
        pytest.skip("no mpiexec")
    return [found]


#: On every launched job's PYTHONPATH: SIGUSR2 dumps a rank's stacks (a hang's trace).
HANG_TRACES = Path(__file__).resolve().parents[1] / "hang_traces"


def job(nprocs: int, *args: str, env=None, timeout=120, module=True):
    """Run ``mpiexec -n nprocs python -m summa args`` and return the completed
    process. A job still running after `timeout` seconds fails the test with
    where each rank waits (:func:`hang_trace`), and leaves no process."""
    full_env = dict(os.environ, PYTHONPATH=os.pathsep.join((str(ROOT), str(HANG_TRACES))),
                    **(env or {}))
    cmd = mpiexec() + ["-n", str(nprocs), sys.executable]
    cmd += (["-m", "summa"] if module else []) + list(args)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=full_env, cwd=ROOT)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"still running after {timeout} s: {' '.join(cmd)}\n{hang_trace(proc)}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def hang_trace(proc: subprocess.Popen) -> str:
    """Every Python process of `proc`'s job dumps its threads' stacks (SIGUSR2,
    :data:`HANG_TRACES`); then the job is killed; what it printed, last."""
    pids, python = job_pids(proc.pid), os.path.realpath(sys.executable)
    for pid in pids:  # the ranks (not the launcher, which SIGUSR2 would end)
        try:
            if os.path.realpath(f"/proc/{pid}/exe") == python:
                os.kill(pid, signal.SIGUSR2)
                # one rank at a time: faulthandler writes in many small pieces,
                # and two ranks dumping at once interleaved them ("Current
                # thread 0xCurrent thread 0x...") in a fresh-clone CI run
                time.sleep(0.5)
        except OSError:
            pass
    time.sleep(1)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    out, err = proc.communicate()
    return f"stdout:\n{out[-2000:]}\nstderr:\n{err[-12000:]}"


def test_a_job_past_its_timeout_fails_with_where_each_rank_waits():
    """A hung job's test fails with every rank's Python stack and leaves no
    process (a CI hang otherwise says only "timed out")."""
    hang = "import time\ndef waits_here():\n    time.sleep(120)\nwaits_here()"
    t0 = time.monotonic()
    with pytest.raises(pytest.fail.Exception) as failed:
        job(2, "-c", hang, module=False, timeout=5)
    text = str(failed.value)
    assert "still running after 5 s" in text and time.monotonic() - t0 < 30
    assert text.count("in waits_here") == 2, text  # both ranks' stacks
    me = os.getpid()
    assert not [p for p in job_pids(me) if p != me and "waits_here" in _cmdline(p)]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text()
    except OSError:
        return ""


# -- in-process, under MPI ---------------------------------------------------------------

@pytest.mark.mpi(min_size=1)
def test_bench_prints_table_and_appends_json(comm):
    path = comm.bcast(tempfile.mkstemp(suffix=".jsonl")[1] if comm.rank == 0 else None)
    out = io.StringIO()
    for _ in range(2):
        rc = cli.main(["bench", "--m", "37", "--n", "29", "--k", "19", "--dtype", "complex64",
                       "--check", "--repeat", "2", "--warmup", "0", "--nb", "4",
                       "--json", path], comm, out)
        assert rc == 0
    if comm.rank == 0:
        text = out.getvalue()
        assert "37 x 29 x 19" in text and "complex64" in text and " ok" in text
        records = [json.loads(line) for line in Path(path).read_text().splitlines()]
        assert len(records) == 2
        r = records[0]
        assert (r["m"], r["n"], r["k"], r["dtype"], r["ranks"]) == (37, 29, 19, "complex64",
                                                                    comm.Get_size())
        assert len(r["times"]) == 2 and r["tflops"] > 0 and r["check_passed"] is True
        assert len(r["ranks_detail"]) == comm.Get_size()
        assert {"compute", "wait", "seconds"} <= set(r["ranks_detail"][0])
        assert "mpi" in r["versions"] and "numpy" in r["versions"]
        os.unlink(path)
    else:
        assert out.getvalue() == ""


@pytest.mark.mpi(min_size=1)
def test_bench_default_grid_follows_the_product_shape(comm, backend):
    # C of 96 x 24: blocks as square as the ranks allow (4 ranks: 4x1, not 2x2)
    from summa.distribution.grid import grid_for
    path = comm.bcast(tempfile.mkstemp(suffix=".jsonl")[1] if comm.rank == 0 else None)
    assert cli.main(["bench", "--backend", backend.name, "--m", "96", "--n", "24", "--k", "16",
                     "--repeat", "1", "--warmup", "0", "--no-ideal", "--json", path], comm,
                    io.StringIO()) == 0
    if comm.rank == 0:
        record = json.loads(Path(path).read_text())
        p = comm.Get_size()
        assert tuple(record["grid"]) == grid_for(p, 96, 24, backend.name, "float64")
        assert p != 4 or record["grid"] == [4, 1]
        os.unlink(path)


@pytest.mark.mpi(min_size=1)
def test_default_run_verifies(comm, monkeypatch):
    monkeypatch.setattr(bench, "DEFAULT_SIZE_CPU", 48)
    monkeypatch.setattr(bench, "DEFAULT_SIZE_GPU", 48)
    out = io.StringIO()
    assert cli.main([], comm, out) == 0
    if comm.rank == 0:
        assert "48 x 48 x 48" in out.getvalue() and " ok" in out.getvalue()


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("free", [None, 10**9, 2_000])
def test_an_ideal_that_does_not_fit_is_skipped_not_the_run(comm, monkeypatch, free):
    """Out of core on a small GPU, or in memory near its size, the one-device
    product the ideal times may not fit: the run reports, the ideal says why."""
    from summa.device.backend import NumpyBackend
    monkeypatch.setattr(NumpyBackend, "memory_free", lambda self: free)
    # 40 x 40 x 40 float64: a rank's ideal needs over 2,000 bytes on any grid up to 6 ranks
    path = comm.bcast(tempfile.mkstemp(suffix=".jsonl")[1] if comm.rank == 0 else None)
    out = io.StringIO()
    # NumPy's backend, whose free memory is patched, also on a machine with a GPU
    assert cli.main(["bench", "--size", "40", "--repeat", "1", "--warmup", "0", "--nb", "8",
                     "--backend", "numpy", "--json", path], comm, out) == 0
    if comm.rank == 0:
        text = out.getvalue()
        record = json.loads(Path(path).read_text())
        os.unlink(path)
        fits = free is None or free > 10**6
        assert ("efficiency" in text) == fits and (record["efficiency"] is None) != fits
        if not fits:
            need = ideal.ideal_bytes((*record["ranks_detail"][0]["local_shape"], 40), "float64")
            assert need > 0.95 * free
            assert re.search(r"ideal: not measured: one device's product of the per-rank shape "
                             r"needs [\d.]+ GiB, more than its free memory", text)
        assert record["tflops"] > 0


@pytest.mark.mpi(min_size=1)
def test_failed_check_exits_3(comm, monkeypatch):
    monkeypatch.setattr(benchrun, "freivalds", lambda *a, **k: 5.0)
    assert cli.main(["bench", "--size", "16", "--check", "--repeat", "1"], comm,
                    io.StringIO()) == 3


@pytest.mark.mpi(min_size=1)
def test_info(comm, monkeypatch):
    monkeypatch.setenv("SUMMA_GEMM", "cublaslt")
    monkeypatch.setenv("SUMMA_COMPUTE_PRIORITY", "high")
    monkeypatch.setenv("SUMMA_TRANSPOSE_A", "no")
    out = io.StringIO()
    assert cli.main(["info"], comm, out) == 0
    if comm.rank == 0:
        text = out.getvalue()
        assert "MPI library" in text and f"ranks: {comm.Get_size()}" in text
        assert text.count("  rank ") == comm.Get_size()
        assert "GPU GEMM: cublaslt (SUMMA_GEMM), compute stream priority: high" in text
        assert "copied transposed (read column-major): no (SUMMA_TRANSPOSE_A)" in text
        assert "lie by columns copied row-major: auto (SUMMA_TRANSPOSE_B; auto: complex128 and float32" \
            in text
    monkeypatch.setenv("SUMMA_CUBLASLT", __file__)  # a file, but no library
    out = io.StringIO()
    if cupy_available():  # the GPU backend loads it: one clear usage error on every rank
        with pytest.raises(cli.UsageError, match="SUMMA_CUBLASLT=.*cannot be loaded"):
            cli.main(["info"], comm, out)
        return
    assert cli.main(["info"], comm, out) == 0  # NumPy never loads it; info names it
    if comm.rank == 0:
        assert f"GPU GEMM: cublaslt from {__file__} (SUMMA_CUBLASLT)" in out.getvalue()


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("argv,match", [
    (["bench", "--grid", "7x9"], "grid 7x9 needs 63 ranks"),
    (["bench", "--grid", "banana"], "grid must look like"),
    (["bench", "--nb", "0"], "--nb: must be >= 1"),
    (["bench", "--size", "-3"], "--size: must be >= 1"),
    (["bench", "--dtype", "int8"], "invalid choice"),
    (["bench", "--dtype", "float16", "--backend", "numpy"], "float16 is not supported"),
    (["bench", "--lookahead", "-1"], "--lookahead: must be >= 0"),
    (["bench", "--precision", "tf32", "--dtype", "float64"], "tf32 applies to"),
    (["bench", "--comm", "nccl", "--backend", "numpy"], "needs the cupy backend"),
    (["frobnicate"], "invalid choice"),
    (["bench", "--sizes", "1024,2048"], "--sizes lists a series: it needs --sweep"),
    (["bench", "--grids", "1x1"], "--grids lists a series: it needs --sweep"),
    (["bench", "--size", "64", "--device-memory", "nanGiB"], "a finite number of bytes"),
    (["bench", "--size", "64", "--device-memory", "infGiB"], "a finite number of bytes"),
    (["bench", "--size", "64", "--device-memory", "1B"], "a device budget of 1 byte is too"),
])
def test_usage_errors_raise_on_every_rank(comm, argv, match):
    with pytest.raises(cli.UsageError, match=match):
        cli.main(argv, comm, io.StringIO())


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("out_of_core", [None, True])
def test_matmul_warns_of_nonfinite_operands_as_multiply_warns_of_its_files(comm, rng, folder,
                                                                           out_of_core):
    """summa.matmul on arrays with NaN/Inf warns (RuntimeWarning, on the
    root) which operand holds how many, in the words ``summa multiply``
    uses for its files; finite operands warn of nothing; a product that
    overflows says so. In memory and host-resident (out of core) alike."""
    import warnings
    import summa
    from helpers import data_warnings
    from summa.api.files import multiply_files
    a, b = rng.uniform(-1, 1, (37, 20)), rng.uniform(-1, 1, (20, 29))
    a[2, 1], a[5, 3], b[7, 7] = np.nan, np.inf, -np.inf
    root = comm.rank == 0
    kwargs = dict(comm=comm, backend="numpy", out_of_core=out_of_core)

    def caught(x, y):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            summa.matmul(x if root else None, y if root else None, **kwargs)
        return data_warnings([str(w.message) for w in seen
                              if issubclass(w.category, RuntimeWarning)])
    said = caught(a, b)
    if root:
        np.save(folder / "A.npy", a)
        np.save(folder / "B.npy", b)
    comm.Barrier()
    files = []
    multiply_files(str(folder / "A.npy"), str(folder / "B.npy"), str(folder / "C.npy"), comm,
                   quiet=True, check=False, warn=files.append)
    finite = caught(np.nan_to_num(a), np.nan_to_num(b, posinf=1, neginf=-1))
    huge = np.full((16, 16), np.finfo(np.float64).max / 4)
    overflow = caught(huge, huge)
    if not root:
        assert said == finite == overflow == []
        return
    assert said == ["a contains 2 NaN/Inf value(s); the product will contain NaN/Inf too",
                    "b contains 1 NaN/Inf value(s); the product will contain NaN/Inf too"]
    assert [w.split(" contains ", 1)[1] for w in data_warnings(files)] == \
        [w.split(" contains ", 1)[1] for w in said]
    assert finite == []
    assert len(overflow) == 1 and "overflowed" in overflow[0]


def test_help_of_matmul_lists_every_parameter_it_takes():
    """help(summa.matmul) documents, in its Parameters section, every
    parameter of the calls it makes (matmul_arrays's, their options, the
    DistMatrix paths')."""
    import inspect
    import summa
    from summa.api import multiply
    doc = inspect.getdoc(summa.matmul)
    params = doc.split("Parameters\n----------\n", 1)[1].split("\n\n")[0]
    named = set(re.findall(r"^(\w[\w, ]*?)(?: :|$)", params, re.M))
    listed = {name.strip() for line in named for name in line.split(",")}
    wanted = {p for p in inspect.signature(multiply.matmul_arrays).parameters
              if p != "kwargs"} | set(multiply._MATMUL_OPTIONS) | {
        p for f in (multiply.host_matmul, summa.gemm) for p in inspect.signature(f).parameters}
    wanted = {"A" if p == "a" else "B" if p == "b" else p for p in wanted} | {"options"}
    assert wanted <= listed, wanted - listed


# -- whole jobs --------------------------------------------------------------------------

def test_help_prints_once_and_exits_0():
    p = job(2, "bench", "--help")
    assert p.returncode == 0, p.stderr
    assert p.stdout.count("usage:") == 1 and "--repeat" in p.stdout


@pytest.mark.parametrize("args,match", [
    (["bench", "--grid", "3x1"], "grid 3x1 needs 3 ranks, but 2 were started"),
    (["bench", "--nb", "0"], "--nb: must be >= 1"),
    (["bench", "--dtype", "float16", "--backend", "numpy"], "float16 is not supported"),
])
def test_user_error_is_one_line_and_exit_2(args, match):
    p = job(2, *args)
    assert p.returncode == 2, p.stderr
    # Only our own lines count: some launchers (Open MPI) add their own notice.
    lines = [line for line in p.stderr.splitlines() if "summa" in line or "Traceback" in line]
    assert len(lines) == 1 and match in lines[0] and lines[0].startswith("summa: error:")


def test_one_rank_is_one_rank_in_the_grid_error():
    p = job(1, "bench", "--grid", "3x3", "--backend", "numpy")
    assert p.returncode == 2, p.stderr
    assert "summa: error: grid 3x3 needs 9 ranks, but 1 was started" in p.stderr


@pytest.mark.parametrize("entry", ["bench", "multiply"])
@pytest.mark.parametrize("setting,message", [
    ("SUMMA_GEMM=cublasxt", "SUMMA_GEMM='cublasxt' is not one of cublas, cublaslt"),
    ("SUMMA_INT8_GEMM=cublas", "SUMMA_INT8_GEMM must be one of auto, gemmex, cublaslt"),
    ("SUMMA_FP64_INT8_MODULI=many", "SUMMA_FP64_INT8_MODULI='many': moduli must be an integer"),
    ("SUMMA_COPY_THREADS=lots", "SUMMA_COPY_THREADS must be an integer, got 'lots'")])
def test_bad_gemm_library_is_one_line_and_exit_2(entry, tmp_path, setting, message):
    command = ["bench", "--size", "16"]
    if entry == "multiply":
        for name in ("a", "b"):
            np.save(tmp_path / f"{name}.npy", np.ones((4, 4)))
        command = ["multiply", str(tmp_path / "a.npy"), str(tmp_path / "b.npy"), "-o",
                   str(tmp_path / "c.npy")]
    p = job(2, *command, env=dict([setting.split("=")]))
    assert p.returncode == 2, p.stderr
    lines = [line for line in p.stderr.splitlines() if "summa" in line or "Traceback" in line]
    assert len(lines) == 1 and message in lines[0]
    assert not (tmp_path / "c.npy").exists()


def test_bench_job_passes_check_on_6_ranks_complex():
    p = job(6, "bench", "--m", "101", "--n", "97", "--k", "53", "--dtype", "complex64",
            "--check", "--grid", "1x6", "--repeat", "1")
    assert p.returncode == 0, p.stderr
    assert "grid 1x6" in p.stdout and " ok" in p.stdout


FAULTY = """
import sys
from summa import __main__ as entry, cli
from mpi4py import MPI
kind = sys.argv[1]
def broken(argv, comm, out=None):
    if comm.Get_rank() == 1:
        raise (RuntimeError if kind == "unexpected" else ValueError)("injected fault")
    comm.Barrier()  # the healthy rank waits in a collective the faulty one never joins
    return 0
cli.main = broken
sys.exit(entry.main([]))
"""


@pytest.mark.parametrize("kind", ["unexpected", "one-rank-usage"])
def test_fault_on_one_rank_aborts_the_job(kind, tmp_path):
    script = tmp_path / "faulty.py"
    script.write_text(FAULTY)
    p = job(2, str(script), kind, env={"SUMMA_ERROR_GRACE": "1"}, module=False, timeout=60)
    assert p.returncode != 0
    assert "rank 1" in p.stderr and "injected fault" in p.stderr
    assert "aborting the job" in p.stderr


@pytest.mark.mpi(min_size=1)
def test_bench_sweep_runs_sizes_times_grids(comm):
    path = comm.bcast(tempfile.mkstemp(suffix=".jsonl")[1] if comm.rank == 0 else None)
    out = io.StringIO()
    assert cli.main(["bench", "--sweep", "--sizes", "40,64", "--json", path, "--repeat", "1",
                     "--warmup", "0", "--no-ideal"], comm, out) == 0
    p = comm.Get_size()
    grids = [(r, p // r) for r in range(1, p + 1) if p % r == 0]
    if comm.rank == 0:
        records = [json.loads(line) for line in Path(path).read_text().splitlines()]
        assert [(r["m"], tuple(r["grid"])) for r in records] == \
            [(s, g) for s in (40, 64) for g in grids]
        os.unlink(path)
    with pytest.raises(cli.UsageError, match="needs --json"):
        cli.main(["bench", "--sweep", "--sizes", "40"], comm, io.StringIO())
    with pytest.raises(cli.UsageError, match="needs"):
        cli.main(["bench", "--sweep", "--grids", f"{p + 1}x1", "--json", "x.jsonl"], comm,
                 io.StringIO())


def test_run_help_prints_usage_without_setting_up(tmp_path):
    """`./run --help` prints its usage and sets nothing up (no venv made)."""
    env = dict(os.environ, SUMMA_PYTHON=str(tmp_path / "no-such-python"))
    done = subprocess.run([str(ROOT / "run"), "--help"], capture_output=True, text=True,
                          env=env, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0].startswith("summa's one entry point")
    assert "./run test ARGS..." in done.stdout and "TEST_RANKS" in done.stdout
    assert "set -euo" not in done.stdout and "#" not in done.stdout.splitlines()[0]


def test_run_test_goes_in_parts():
    """`./run test` with TEST_RANKS=none runs the serial run only, and with
    TEST_SERIAL=0 as well nothing: it says so (pytest's status 5), as a
    selection that matches nothing does."""
    # (an MPI run would need MPIEXEC: none runs here)
    env = dict(os.environ, SUMMA_PYTHON=sys.executable, TEST_RANKS="none", MPIEXEC="mpiexec")
    env.pop("PYTEST_ADDOPTS", None)
    args = [str(ROOT / "run"), "test", "tests/test_structure.py", "-k", "concern", "-p",
            "no:cacheprovider"]
    serial = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300,
                            cwd=ROOT)
    assert serial.returncode == 0, serial.stderr[-2000:]
    assert "== serial tests" in serial.stderr and "== MPI tests" not in serial.stderr
    assert "passed" in serial.stdout
    neither = subprocess.run(args, capture_output=True, text=True, timeout=300, cwd=ROOT,
                             env=dict(env, TEST_SERIAL="0"))
    assert neither.returncode == 5, neither.stderr[-2000:]
    assert "== serial tests" not in neither.stderr and "no test selected" in neither.stderr


def test_plan_takes_the_operands_order():
    """``summa plan --order F`` plans Fortran-ordered operands as summa.matmul
    plans them: C cut by columns out of core, complex128's B panels copied
    row-major (said); C order (the default) by rows, nothing copied."""
    def planned(*extra):
        out = io.StringIO()
        assert cli.main(["plan", "--size", "32768", "--dtype", "complex128", "--ranks", "1",
                         "--device-memory", "8GiB", *extra], out=out) == 0
        return out.getvalue()
    fortran, c_order = planned("--order", "F"), planned()
    assert "(1 x 6 per rank)" in fortran and "(6 x 1 per rank)" in c_order
    assert "B's panels, which lie by columns, are copied row-major" in fortran
    assert "copied row-major" not in c_order and c_order == planned("--order", "C")
    with pytest.raises(cli.UsageError, match="argument --order: invalid choice: 'K'"):
        planned("--order", "K")


@pytest.mark.parametrize("hardware,gpus", [("rtx3090x8", 8), ("h200", 2)])
def test_plan_takes_every_gpu_of_the_hardware_and_no_more(hardware, gpus):
    """``summa plan`` on a profile plans for all its GPUs by default; more
    ranks than it has GPUs, or a budget over a GPU's memory, is one line
    naming the hardware; its GPU memory and fewer ranks are let through."""
    from summa.planning.profile import Profile, hardware_profile
    profile = Profile.load(hardware_profile(hardware))
    assert profile.gpus == gpus

    def planned(*extra):
        out = io.StringIO()
        assert cli.main(["plan", "--size", "20000", "--hardware", hardware, *extra],
                        out=out) == 0
        return out.getvalue()
    assert f"on {gpus} ranks" in planned()
    assert "on 1 rank " in planned("--ranks", "1")
    assert f"on {gpus} ranks" in planned("--device-memory", f"{profile.device_memory}B")
    for extra, said in ((["--ranks", str(gpus + 1)], f"--ranks {gpus + 1} asks for {gpus + 1}"),
                        (["--grid", f"{gpus + 1}x1"], f"--grid {gpus + 1}x1 asks for"),
                        (["--device-memory", "1000TiB"], "--device-memory 1000TiB is more than "
                                                         "a GPU of")):
        with pytest.raises(cli.UsageError) as caught:
            planned(*extra)
        assert str(caught.value).startswith(said) and f"--hardware {hardware} has" in \
            str(caught.value) and "\n" not in str(caught.value)


def test_plan_and_model_refuse_a_missing_profile(tmp_path):
    """A profile that is not there is an error, before anything is printed,
    for plan as for model."""
    for command in ("plan", "model"):
        out = io.StringIO()
        with pytest.raises(ValueError, match="none.json: no such profile"):
            cli.main([command, "--profile", str(tmp_path / "none.json")], out=out)
        assert out.getvalue() == ""


def test_a_profile_of_several_nodes_puts_its_gpus_on_them(tmp_path):
    """A profile's nodes share out its GPUs: the plan's ranks a node and
    model's default ranks per node; a profile's calibrated ranks count as
    its GPUs where it names none."""
    from summa.cli.studies import gpus_a_node, planning_machine
    from summa.planning.profile import Profile, hardware_profile
    data = json.loads(Path(hardware_profile("rtx3090x8")).read_text())
    data.update(gpus=16, nodes=2)
    path = tmp_path / "two.json"
    path.write_text(json.dumps(data))
    assert gpus_a_node(Profile.load(path)) == 8
    machine, _ = planning_machine(path, "cupy", 16)
    assert machine.ranks == 16 and machine.ranks_on_node == 8
    assert planning_machine(hardware_profile("rtx3090x8"), "cupy", 8)[0].ranks_on_node is None
    out = io.StringIO()
    assert cli.main(["plan", "--profile", str(path), "--size", "40000"], out=out) == 0
    assert "on 16 ranks" in out.getvalue()
    del data["gpus"], data["nodes"]
    data["ranks"] = 4  # what summa calibrate records
    path.write_text(json.dumps(data))
    with pytest.raises(cli.UsageError, match="has 4 GPUs \\(the ranks it was calibrated on"):
        cli.main(["plan", "--profile", str(path), "--ranks", "8"], out=io.StringIO())


def without_mpi(tmp_path, *args: str, code: str | None = None):
    """``python -m summa ARGS`` (or ``python -c CODE``) where mpi4py cannot be
    imported, as where summa was installed without an MPI, and where
    importing CuPy ends the process with status 97."""
    blocked = tmp_path / "blocked"
    (blocked / "mpi4py").mkdir(parents=True, exist_ok=True)
    (blocked / "mpi4py" / "__init__.py").write_text(
        "raise ImportError('libmpi.so.12: cannot open shared object file')\n")
    (blocked / "cupy").mkdir(exist_ok=True)
    (blocked / "cupy" / "__init__.py").write_text(
        "import os, sys\nsys.stderr.write('cupy was imported\\n')\nos._exit(97)\n")
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARIABLES}
    env["PYTHONPATH"] = os.pathsep.join((str(blocked), str(ROOT)))
    command = [sys.executable] + (["-c", code] if code else ["-m", "summa", *args])
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=120,
                          cwd=tmp_path)


@pytest.mark.parametrize("args,said", [
    (["--help"], "usage: python -m summa"),
    (["--version"], "summa "),
    (["plan", "--help"], "--hardware"),
    (["plan", "--size", "20000", "--hardware", "rtx3090x8"], "on 8 ranks (grid"),
    (["model", "--hardware", "rtx3090x8", "--size", "20000"], "predicted"),
    (["model", "--sweep", "--ranks-list", "1,2"], "strong scaling"),
    (["options", "--markdown"], "| `SUMMA_GEMM` |"),
])
def test_help_plan_model_and_options_need_no_mpi_nor_cupy(tmp_path, args, said):
    done = without_mpi(tmp_path, *args)
    assert done.returncode == 0, done.stderr
    assert said in done.stdout and done.stderr == ""


@pytest.mark.parametrize("args,said", [
    (["bench", "--size", "64"], 'no MPI to run on (libmpi.so.12: cannot open shared object '
                                'file); install one: pip install "summa-gemm[mpich]"'),
    (["--size", "64"], 'pip install "summa-gemm[mpich]"'),
    (["plan", "--profile", "none.json"], "none.json: no such profile"),
    (["plan", "--hardware", "rtx3090x8", "--grid", "3x3"], "--grid 3x3 asks for 9 ranks"),
])
def test_without_mpi_a_run_says_what_to_install_in_one_line(tmp_path, args, said):
    """A command that needs MPI, where there is none, names the extra to
    install; bad input to one that needs none is one line as ever."""
    done = without_mpi(tmp_path, *args)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("summa: error: ") and said in done.stderr
    assert len(done.stderr.splitlines()) == 1 and done.stdout == ""


def test_without_mpi_the_library_imports_and_a_multiply_says_what_to_install(tmp_path):
    code = ("import numpy, summa\n"
            "try:\n"
            "    summa.matmul(numpy.ones((4, 4)), numpy.ones((4, 4)), backend='numpy')\n"
            "except ImportError as exc:\n"
            "    print(type(exc).__name__, exc)\n")
    done = without_mpi(tmp_path, code=code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("MPIUnavailable no MPI to run on")
    assert 'pip install "summa-gemm[mpich]"' in done.stdout


def test_a_command_without_mpi_under_a_launcher_prints_from_its_rank_0(monkeypatch):
    out = io.StringIO()
    for rank in ("1", "0"):
        monkeypatch.setenv("PMI_RANK", rank)
        assert cli.main(["plan", "--size", "2000", "--hardware", "h200"], out=out) == 0
        assert (out.getvalue() != "") == (rank == "0")


@pytest.mark.parametrize("kwargs,said", [
    (dict(device_memory="nanGiB"), "a memory size must be a finite number of bytes, got 'nanGiB'"),
    (dict(device_memory="infGiB"), "a memory size must be a finite number of bytes, got 'infGiB'"),
    (dict(workers="two"), "workers must be a whole number, got 'two'"),
    (dict(workers=2.5), "workers must be a whole number, got 2.5"),
    (dict(workers="-3"), "workers must be a whole number, got '-3'"),
])
def test_bad_keywords_of_matmul_are_one_clear_line(kwargs, said):
    import summa
    with pytest.raises(ValueError) as caught:
        summa.matmul(np.ones((8, 8)), np.ones((8, 8)), backend="numpy", **kwargs)
    assert str(caught.value) == said


def test_sizes_are_said_in_the_singular_for_one():
    from summa.cli.studies import plural
    from summa.planning.memory import format_bytes
    assert [format_bytes(n) for n in (1, 2, 1023)] == ["1 byte", "2 bytes", "1023 bytes"]
    assert [plural(n, "rank") for n in (1, 3)] == ["1 rank", "3 ranks"]


def test_options_lists_every_setting_the_given_ones_first(monkeypatch):
    """``summa options`` says what each setting is: the given ones as
    VARIABLE=value, the rest marked as at their defaults (it printed nothing
    where none was given)."""
    from summa import options
    for variable in options.defaults(internal=True):
        monkeypatch.delenv(variable, raising=False)

    def listed():
        out = io.StringIO()
        assert cli.main(["options"], out=out) == 0
        return out.getvalue().splitlines()
    at_defaults = listed()
    assert at_defaults[0].startswith("# at their defaults")
    assert "# SUMMA_GEMM=cublas" in at_defaults
    assert "# SUMMA_COPY_THREADS (chosen at run time)" in at_defaults
    assert len(at_defaults) == 1 + len(options.defaults())
    monkeypatch.setenv("SUMMA_COPY_THREADS", "3")
    given = listed()
    assert given[0] == "SUMMA_COPY_THREADS=3" and len(given) == len(at_defaults)
    assert not any(line.startswith("# SUMMA_COPY_THREADS") for line in given)


@pytest.mark.mpi(min_size=1)
def test_multiply_says_why_it_skipped_the_check(comm, tmp_path_factory):
    folder = comm.bcast(str(tmp_path_factory.mktemp("unchecked")) if comm.rank == 0 else None)
    if comm.rank == 0:
        np.save(f"{folder}/a.npy", np.ones((24, 24)))
    comm.Barrier()
    files = [f"{folder}/a.npy", f"{folder}/a.npy", "-o", f"{folder}/c.npy", "--quiet"]
    for extra, why in (["--no-check"], "check skipped (--no-check)"), \
            ([], "check skipped (it would cost over 2 % of this multiply; --check makes it)"):
        out = io.StringIO()
        assert cli.main(["multiply", *files, *extra], comm, out) == 0
        assert comm.rank != 0 or why in out.getvalue(), out.getvalue()


def test_run_test_skips_the_mpi_runs_where_no_mpi_test_is_selected():
    """`./run test FILE` runs no MPI job (each printed the MPI library's
    banner) where FILE's selection holds no MPI test, and says so; where it
    holds one, the MPI runs go on."""
    env = dict(os.environ, SUMMA_PYTHON=sys.executable, TEST_RANKS="1",
               MPIEXEC=" ".join(mpiexec()))
    env.pop("PYTEST_ADDOPTS", None)

    def tested(*args):
        return subprocess.run([str(ROOT / "run"), "test", *args, "-p", "no:cacheprovider"],
                              capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
    serial = tested("tests/test_structure.py", "-k", "concern")
    assert serial.returncode == 0, serial.stderr[-2000:]
    assert "the MPI runs skipped" in serial.stderr and "== MPI tests" not in serial.stderr
    both = tested("tests/runtime/test_agree.py", "-k", "root_decides")
    assert both.returncode == 0, both.stderr[-2000:]
    assert "== MPI tests on 1 rank(s)" in both.stderr and "skipped" not in both.stderr


def test_benchs_ideal_counts_fp64_int8s_scratch_and_chunks_it_to_the_free_memory():
    """The ideal beside ``bench --precision fp64-int8`` is one GEMM on the
    device: its scratch is counted (its operands alone, 3 x 8 GiB at 32768,
    left it out, and the product ran out of an 80 GB GPU's memory), and
    where the scratch of all rows would not fit, its rows go in chunks."""
    gib, shape = 2 ** 30, (32768, 32768, 32768)
    operands = 3 * 32768 ** 2 * 8
    whole = ideal.ideal_memory(shape, np.float64, precision="fp64-int8")
    assert whole.int8_rows is None and whole.device_bytes > 78 * gib > operands
    fitted = ideal.ideal_memory(shape, np.float64, precision="fp64-int8", free=78 * gib)
    assert fitted.int8_rows is not None and operands < fitted.device_bytes <= 0.95 * 78 * gib
    assert ideal.ideal_bytes(shape, np.float64) == operands  # native float64: the operands
