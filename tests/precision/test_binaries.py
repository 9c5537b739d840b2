"""fp64-int8's kernels shipped compiled (summa/precision/binaries.py): the
binary in the tree was built from the current source, a process loads it
where it fits and compiles the source where it does not, and the build
command assembles nvcc's targets and its manifest (a stand-in nvcc here;
the binary itself is loaded and run on the GPU: tests/test_gpu.py)."""

import json
import os
import shutil
import stat
from types import SimpleNamespace

import pytest

from helpers import use_fake_cupy
from summa.precision import binaries, cuda_source, kernels


def test_the_shipped_binary_was_built_from_the_current_source():
    """The fat binary in the tree is the kernels' source of today: after a
    change to summa/precision/cuda_source.py, `python -m
    summa.precision` (on a machine with nvcc) builds it again."""
    built = binaries.manifest()
    assert built["digest"] == cuda_source.digest(), (
        "summa/precision/compiled/ was built from another source: run "
        "`python -m summa.precision` where nvcc is")
    assert binaries.current()
    assert built["architectures"] == list(binaries.ARCHITECTURES)
    head = (binaries.DIRECTORY / binaries.FATBIN).read_bytes()[:4]
    assert head == bytes.fromhex("50ed55ba")  # a fat binary's magic number


class _DriverError(Exception):
    pass


def _cupy(driver: int, refuses: bool = False):
    """A stand-in for the CuPy a loader sees: the driver's CUDA version, and
    a RawModule whose loading the driver refuses or not; `made` lists the
    modules asked for."""
    made = []

    class RawModule:
        def __init__(self, code=None, path=None, options=()):
            self.code, self.path = code, path
            made.append(self)

        def get_function(self, name):
            return SimpleNamespace(compile=lambda: self.load(name))

        def load(self, name):  # as CuPy: the module is loaded at a kernel's first use
            if refuses and self.path:
                raise _DriverError("CUDA_ERROR_NO_BINARY_FOR_GPU")
    cuda = SimpleNamespace(runtime=SimpleNamespace(driverGetVersion=lambda: driver),
                           driver=SimpleNamespace(CUDADriverError=_DriverError))
    return SimpleNamespace(cuda=cuda, RawModule=RawModule, made=made)


@pytest.fixture
def shipped(tmp_path):
    """A copy of the shipped binary and its manifest."""
    for name in (binaries.FATBIN, binaries.MANIFEST):
        shutil.copy(binaries.DIRECTORY / name, tmp_path / name)
    return tmp_path


def test_the_binary_loads_where_it_fits_and_nowhere_else(shipped):
    """Loaded from its file where the driver is as new as the CUDA that built
    it; None (the caller compiles the source) where the driver is older,
    where it refuses the binary (a GPU it holds no code for), where the
    binary was built from another source, or where there is none."""
    cuda = int(binaries.manifest(shipped)["cuda"].split(".")[0])
    fits = _cupy(1000 * cuda + 20)
    module = binaries.load(fits, shipped)
    assert module.path == str(shipped / binaries.FATBIN) and module.code is None
    assert binaries.load(_cupy(1000 * cuda - 10), shipped) is None
    assert binaries.load(_cupy(1000 * cuda, refuses=True), shipped) is None
    other = json.loads((shipped / binaries.MANIFEST).read_text())
    other["digest"] = cuda_source.digest(cuda_source.SOURCE + "\n// changed")
    (shipped / binaries.MANIFEST).write_text(json.dumps(other))
    changed = _cupy(1000 * cuda + 20)
    assert binaries.load(changed, shipped) is None and changed.made == []
    assert binaries.load(fits, shipped.parent / "none") is None


def test_kernels_compile_the_source_once_where_no_binary_fits(monkeypatch):
    """kernels.module(): the shipped binary where it loads; else the source
    compiled (one module whatever the shapes), once per architecture."""
    fake = use_fake_cupy(monkeypatch)
    fake._RawModule.made.clear()
    first = kernels.module()
    assert kernels.module() is first and first.code == cuda_source.SOURCE
    assert len(fake._RawModule.made) == 1
    loaded = object()
    monkeypatch.setattr(binaries, "load", lambda cupy: loaded)
    monkeypatch.setattr(fake._Device, "compute_capability", "86")
    assert kernels.module() is loaded


def _fake_nvcc(folder, release: str = "13.0", fails: bool = False):
    """An nvcc stand-in: prints its release, records its arguments and
    writes its -o file (or fails with a message)."""
    script = folder / "nvcc"
    script.write_text(f"""#!/bin/sh
if [ "$1" = "--version" ]; then echo "Cuda compilation tools, release {release}"; exit 0; fi
echo "$@" > {folder}/args
{"echo 'kernels.cu(3): error: bad' >&2; exit 1" if fails else ""}
while [ $# -gt 0 ]; do if [ "$1" = "-o" ]; then printf 'built' > "$2"; fi; shift; done
""")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


def test_the_build_asks_nvcc_for_every_architecture_and_writes_its_manifest(tmp_path):
    nvcc = _fake_nvcc(tmp_path)
    out = tmp_path / "compiled"
    assert binaries.main(["--nvcc", nvcc, "--out", str(out)]) == 0
    args = (tmp_path / "args").read_text().split()
    for arch in binaries.ARCHITECTURES:
        assert f"-gencode=arch=compute_{arch},code=sm_{arch}" in args
    assert f"-gencode=arch=compute_{binaries.PTX},code=compute_{binaries.PTX}" in args
    assert "-fatbin" in args and (out / binaries.FATBIN).read_text() == "built"
    assert binaries.manifest(out)["cuda"] == "13.0" and binaries.current(out)


def test_a_build_without_nvcc_or_with_a_failing_one_says_so(tmp_path, capsys):
    out = tmp_path / "compiled"
    assert binaries.main(["--nvcc", str(tmp_path / "missing"), "--out", str(out)]) == 2
    assert "no " in capsys.readouterr().err and not out.exists()
    failing = _fake_nvcc(tmp_path, fails=True)
    assert binaries.main(["--nvcc", failing, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "nvcc failed" in err and "error: bad" in err
    assert not (out / binaries.MANIFEST).exists()
    assert os.path.basename(failing) == "nvcc"
    unnamed = tmp_path / "unnamed"
    unnamed.mkdir()  # no release: the drivers that could load the binary are unknown
    assert binaries.main(["--nvcc", _fake_nvcc(unnamed, release="?"), "--out", str(out)]) == 2
    assert "names no CUDA release" in capsys.readouterr().err
    assert not (out / binaries.MANIFEST).exists()
