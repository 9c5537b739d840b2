"""Options: every setting once, keyword > SUMMA_* variable > default, checked,
serialised as one value; nothing else in summa reads the environment."""

import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest

import summa
from summa import options, pool
from summa.device.backend import get_backend
from summa.options import Options

PACKAGE = Path(options.__file__).parent
ROOT = PACKAGE.parent

#: A good value and bad ones for each setting's variable (each bad one must
#: be one ValueError naming the variable).
CASES = {
    "SUMMA_GEMM": (" cuBLASLt ", "cublaslt", ["cublasxt"]),
    "SUMMA_INT8_GEMM": ("cublaslt:3", "cublaslt:3", ["cublas", "cublaslt:", "auto:1"]),
    "SUMMA_COMPUTE_PRIORITY": ("HIGH", "high", ["urgent"]),
    "SUMMA_TRANSPOSE_A": ("Yes", "yes", ["sometimes"]),
    "SUMMA_TRANSPOSE_B": ("NO", "no", ["maybe"]),
    "SUMMA_FP64_INT8_MODULI": (" 16 ", 16, ["abc", "16.5", "2", "31"]),
    "SUMMA_FP64_INT8_SUMS": ("0", 0, ["lots", "2.5", "-1"]),
    "SUMMA_HOST_COPIES": ("lock", "lock", ["copy"]),
    "SUMMA_OOC_TILES": ("3x2", (3, 2), ["3", "1x2x3", "axb"]),
    "SUMMA_UPLOAD_LEAD": ("3", 3, ["lots", "2.5", "-1", "nan"]),
    "SUMMA_COPY_THREADS": ("4", 4, ["lots", "2.5", "0"]),
    "SUMMA_IO_THREADS": ("4", 4, ["lots", "2.5", "0"]),
    "SUMMA_CUDA_AWARE": ("1", True, ["yes", "2"]),
    "SUMMA_PEER_ACCESS": ("0", False, ["no"]),
    "SUMMA_MEMORY_CHECK": ("1", True, ["sometimes"]),
    "SUMMA_IN_PLACE": ("0", False, ["off"]),
    "SUMMA_TIMEOUT": ("12.5", 12.5, ["soon", "-1"]),
    "SUMMA_ERROR_GRACE": ("0.5", 0.5, ["soon", "1e400", "-1", "nan"]),
    "SUMMA_POOL_START": ("3", 3.0, ["soon", "-1"]),
    "SUMMA_PROGRESS": (" Lines ", "lines", ["bars", "1"]),
    "SUMMA_PROGRESS_INTERVAL": ("0.5", 0.5, ["often", "0", "-1", "nan"]),
    "SUMMA_PROGRESS_AFTER": ("0", 0.0, ["soon", "-1", "nan"]),
    "SUMMA_GPUS": ("2", 2, ["two", "0"]),
    "SUMMA_WORKERS": ("3", 3, ["three", "0"]),
    "SUMMA_SHM_DIR": ("/tmp", "/tmp", []),
    "SUMMA_CACHE_DIR": ("/tmp/c", "/tmp/c", []),
    "MPIEXEC": ("mpirun -n", "mpirun -n", []),
    "SUMMA_INJECT_FAULT": ("write:1:hang", "write:1:hang", []),
    "SUMMA_POOL_KEY": ("ab", "ab", []),
    "SUMMA_POOL_WARM": ("numpy", "numpy", []),
}


def _field(variable: str) -> str:
    return next(f.name for f in dataclasses.fields(Options)
                if f.metadata["variable"] == variable)


def test_every_setting_has_a_case_and_a_description():
    variables = [f.metadata["variable"] for f in dataclasses.fields(Options)]
    assert sorted(variables) == sorted([*CASES, "SUMMA_CUBLASLT"])  # each once
    assert all(f.metadata["doc"] for f in dataclasses.fields(Options))


@pytest.mark.parametrize("variable", sorted(CASES))
def test_each_variable_is_its_value_or_one_clear_error(variable):
    text, value, bad = CASES[variable]
    name = _field(variable)
    assert getattr(Options.from_env({}), name) == Options().__getattribute__(name)
    assert getattr(Options.from_env({variable: text}), name) == value
    assert getattr(Options.from_env({variable: "  "}), name) == getattr(Options(), name)
    for wrong in bad:
        with pytest.raises(ValueError, match=re.escape(variable) if not variable.startswith(
                ("SUMMA_GPUS", "SUMMA_WORKERS")) or not wrong.isdigit() else "at least one"):
            Options.from_env({variable: wrong})


def test_the_error_grace_falls_back_while_an_error_is_handled(monkeypatch):
    """__main__ asks SUMMA_ERROR_GRACE while it reports another error: a bad
    setting gives the default there instead of hiding that error."""
    from summa import __main__ as main
    monkeypatch.setenv("SUMMA_ERROR_GRACE", "soon")
    assert main._grace() == main.ERROR_GRACE_SECONDS
    monkeypatch.setenv("SUMMA_ERROR_GRACE", "0.5")
    assert main._grace() == 0.5


def test_cublaslt_must_name_a_file(tmp_path):
    lib = tmp_path / "libcublasLt.so.12"
    with pytest.raises(ValueError, match="SUMMA_CUBLASLT=.*libcublasLt.so.12' is not a file"):
        Options.from_env({"SUMMA_CUBLASLT": str(lib)})
    lib.write_bytes(b"")
    assert Options.from_env({"SUMMA_CUBLASLT": str(lib)}).cublaslt == str(lib)


def test_keywords_win_over_variables_which_win_over_defaults():
    env = {"SUMMA_COPY_THREADS": "3", "SUMMA_GEMM": "cublaslt"}
    opts = Options.from_env(env, copy_threads=5)
    assert (opts.copy_threads, opts.gemm, opts.io_threads) == (5, "cublaslt", None)
    assert Options.from_env(env, copy_threads=None).copy_threads == 3  # None: not given
    assert opts.replace(gemm="cublas").gemm == "cublas"
    with pytest.raises(ValueError, match="SUMMA_COPY_THREADS"):
        Options.from_env(env, copy_threads=0)  # keywords are checked too
    with pytest.raises(ValueError, match="SUMMA_GEMM"):
        opts.replace(gemm="cublasxt")
    with pytest.raises(TypeError, match="unknown option"):
        Options.from_env(env, copy_thread=5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.gemm = "cublas"


def test_json_round_trip():
    opts = Options.from_env({"SUMMA_OOC_TILES": "3x2", "SUMMA_PEER_ACCESS": "0",
                             "SUMMA_FP64_INT8_MODULI": "12", "SUMMA_TIMEOUT": "7"})
    assert Options.from_json(opts.to_json()) == opts
    assert Options.from_json(Options().to_json()) == Options()


def test_set_scopes_the_current_options(monkeypatch):
    monkeypatch.setenv("SUMMA_COPY_THREADS", "3")
    assert options.current().copy_threads == 3  # no scope: the environment now
    with options.set(copy_threads=2) as inner:
        assert options.current() is inner and inner.copy_threads == 2
        with options.set(Options(io_threads=4)):
            assert (options.current().copy_threads, options.current().io_threads) == (None, 4)
        assert options.current().copy_threads == 2
    assert options.current().copy_threads == 3


def test_an_entry_point_reads_the_environment_once_and_passes_it_down(monkeypatch):
    seen = []

    @options.entry_point
    def entry():
        seen.append(options.current())
        monkeypatch.setenv("SUMMA_COPY_THREADS", "7")  # later changes are not seen within
        seen.append(options.current())

    monkeypatch.setenv("SUMMA_COPY_THREADS", "3")
    entry()
    assert seen[0] is seen[1] and seen[0].copy_threads == 3
    entry(options=Options(copy_threads=2))
    assert seen[2].copy_threads == 2


def test_matmul_options_reach_the_deepest_reader(monkeypatch):
    """summa.matmul(options=...) wins over the environment all the way down
    (the out-of-core planner reads the tiles asked for)."""
    from mpi4py import MPI
    a = np.ones((40, 64))
    monkeypatch.setenv("SUMMA_OOC_TILES", "2x2")
    with summa.ProcessGrid(MPI.COMM_SELF) as grid:
        A = summa.DistMatrix.from_global(a, grid, get_backend("numpy"))
        B = summa.DistMatrix.from_global(a.T.copy(), grid, A.backend)
        for opts, tiles in ((None, [2, 2]), (Options(ooc_tiles=(3, 2)), [3, 2])):
            stats = summa.SummaStats()
            C = summa.matmul(A, B, device=A.backend, panel_width=8, stats=stats, options=opts)
            assert stats.extra["tiles"] == tiles and np.allclose(C.gather(), 64.0)


@pytest.mark.skipif(pool.launched(), reason="under a launcher nothing is spawned")
def test_a_pools_workers_get_the_callers_options():
    """One JSON value carries the caller's options to every worker."""
    a = np.ones((50, 40))
    with pytest.raises(pool.WorkerError, match="injected fault in summa on rank 1"):
        summa.matmul(a, a.T, workers=3, backend="numpy", out_of_core=True, panel_width=4,
                     options=Options(inject_fault="summa:1:raise"))
    assert np.allclose(summa.matmul(a, a.T, workers=3, backend="numpy"), 40.0)


def test_the_backend_carries_its_options():
    opts = Options(transpose_a="no")
    assert get_backend("numpy", opts=opts).options is opts


def test_docs_table_is_up_to_date():
    """docs/options.md is generated: ``python -m summa options --markdown >
    docs/options.md`` after changing a setting."""
    assert (ROOT / "docs" / "options.md").read_text() == options.document()
    for f in dataclasses.fields(Options):
        assert f"`{f.metadata['variable']}`" in options.document()


#: Modules that may read the environment, and why: options.py (every
#: setting), pool/launch.py (the launcher's own environment for the
#: workers), __main__.py (the environment a relaunch under mpiexec starts
#: with), runtime/mpi.py (whether a launcher started this process, and its
#: rank, for commands that start no MPI).
ENVIRONMENT_READERS = {"options.py", "pool/launch.py", "__main__.py", "runtime/mpi.py"}


def _source_lines():
    for path in sorted(PACKAGE.rglob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            yield path.relative_to(PACKAGE).as_posix(), number, line


def test_nothing_else_reads_the_environment():
    found = [f"{path}:{number}: {line.strip()}" for path, number, line in _source_lines()
             if re.search(r"os\.environ|getenv|environ\.get", line)
             and path not in ENVIRONMENT_READERS]
    assert not found, "read settings through summa.options:\n" + "\n".join(found)
    outside = [f"{path}:{number}: {line.strip()}" for path, number, line in _source_lines()
               if path != "options.py" and re.search(r"environ\.get\(\s*[\"']SUMMA_", line)]
    assert not outside


def test_summa_writes_no_environment_variable():
    writes = re.compile(r"os\.environ\s*\[[^]]*\]\s*=(?!=)|os\.environ\.(update|setdefault|pop)"
                        r"|os\.putenv|os\.unsetenv|del\s+os\.environ")
    found = [f"{path}:{number}: {line.strip()}" for path, number, line in _source_lines()
             if writes.search(line)]
    assert not found
