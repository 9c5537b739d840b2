"""fp64-int8's kernels shipped compiled: one fat binary
(``summa/precision/compiled/kernels.fatbin``) holding machine code for every
GPU architecture summa runs INT8 products on (sm_75 to sm_120) and PTX that
the driver compiles for any later one, built from :data:`summa.precision.cuda_source.SOURCE` by
:func:`build` (``python -m summa.precision``, on a machine with
``nvcc``), with a manifest of what it was built from.

A process loads it once (:func:`load`), in milliseconds, where a compile of
the source took NVRTC most of a second on a fresh machine (a first call's
largest part after the product). Where it was not built from the current
source, or the driver cannot load it (one older than the CUDA that built
it: the manifest's ``cuda``), the kernels are compiled from the source
instead, once a machine (CuPy keeps the result on disk); tests/precision's
test_binaries fails where the shipped binary and the source disagree.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

from .cuda_source import NAMES, OPTIONS, SOURCE, digest

__all__ = ["DIRECTORY", "FATBIN", "MANIFEST", "ARCHITECTURES", "PTX", "manifest", "current",
           "load", "shipped", "build", "main"]

#: Where the shipped binary and its manifest lie.
DIRECTORY = pathlib.Path(__file__).with_name("compiled")
FATBIN, MANIFEST = "kernels.fatbin", "manifest.json"

#: The architectures the binary holds machine code for: every one with INT8
#: tensor cores (Turing's sm_75 on: ``CupyBackend.has_int8_tensor_cores``)
#: that the building CUDA knows (a later minor version of each runs its
#: major's: sm_87 sm_86's, sm_103 sm_100's); :data:`PTX`'s for any other.
ARCHITECTURES = ("75", "80", "86", "89", "90", "100", "120")
PTX = "75"


def manifest(directory: pathlib.Path = DIRECTORY) -> dict:
    """The shipped binary's manifest (``{}`` where there is none): the source
    ``digest`` it was built from, the ``cuda`` version that built it, its
    ``architectures`` and ``ptx``."""
    try:
        return json.loads((directory / MANIFEST).read_text())
    except (OSError, ValueError):
        return {}


def current(directory: pathlib.Path = DIRECTORY) -> bool:
    """Was the shipped binary built from the current source and options?"""
    return _from_source(manifest(directory), directory)


def _from_source(built: dict, directory: pathlib.Path) -> bool:
    """Does the manifest `built` say `directory`'s binary is the current source's?"""
    return built.get("digest") == digest() and (directory / FATBIN).is_file()


def shipped() -> str:
    """In words, for a plan's report: which GPUs and drivers load the kernels
    shipped, and what a first call elsewhere does."""
    built = manifest()
    if not _from_source(built, DIRECTORY):
        return ("fp64-int8's first call on a machine compiles its kernels (once: CuPy keeps "
                "them on disk)")
    archs = built["architectures"]
    return (f"fp64-int8's kernels come compiled for sm_{archs[0]} to sm_{archs[-1]} (loaded at "
            f"once where the driver is CUDA {built['cuda']} or later; elsewhere the first call "
            "on a machine compiles them, once: CuPy keeps them on disk)")


def load(cupy, directory: pathlib.Path = DIRECTORY):
    """The shipped kernels as a CuPy ``RawModule`` loaded on the current
    device, or None where it does not fit (another source, a driver older
    than the CUDA that built it, a GPU it holds no code for): the caller
    compiles the source then."""
    built = manifest(directory)
    if not _from_source(built, directory):
        return None
    major = int(built["cuda"].split(".")[0])
    if cupy.cuda.runtime.driverGetVersion() < 1000 * major:
        return None
    module = cupy.RawModule(path=str(directory / FATBIN))
    try:  # CuPy loads a module at its first kernel's use: now, so that refusals come here
        module.get_function(NAMES[0]).compile()
    except cupy.cuda.driver.CUDADriverError:
        return None
    return module


def build(directory: pathlib.Path = DIRECTORY, nvcc: str = "nvcc") -> dict:
    """Compile :data:`SOURCE` with `nvcc` into `directory`'s fat binary
    (compressed) and write its manifest; returns the manifest. Raises
    RuntimeError where nvcc fails or is missing."""
    found = shutil.which(nvcc)
    if found is None:
        raise RuntimeError(f"no {nvcc} here: build the kernels on a machine with CUDA's compiler")
    version = re.search(r"release (\d+\.\d+)", _run([found, "--version"]))
    if version is None:  # the drivers that load the binary are told by it
        raise RuntimeError(f"{nvcc} --version names no CUDA release")
    codes = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in ARCHITECTURES]
    codes.append(f"-gencode=arch=compute_{PTX},code=compute_{PTX}")
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        source = pathlib.Path(scratch) / "kernels.cu"
        source.write_text(SOURCE)
        _run([found, "-fatbin", "--compress-mode=size", *OPTIONS, *codes,
              "-o", str(directory / FATBIN), str(source)])
    built = {"digest": digest(), "cuda": version.group(1),
             "architectures": list(ARCHITECTURES), "ptx": PTX,
             "command": "python -m summa.precision"}
    (directory / MANIFEST).write_text(json.dumps(built, indent=1) + "\n")
    return built


def _run(command: list) -> str:
    """`command`'s output; RuntimeError with its message where it fails."""
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{os.path.basename(command[0])} failed: "
                           f"{(done.stderr or done.stdout).strip()[-2000:]}")
    return done.stdout


def main(argv=None) -> int:
    """``python -m summa.precision``: build the shipped kernels."""
    p = argparse.ArgumentParser(prog="python -m summa.precision",
                                description="Build fp64-int8's shipped kernels (a fat binary "
                                            "for sm_75 to sm_120 and its manifest) with nvcc.")
    p.add_argument("--nvcc", default="nvcc", help="CUDA's compiler (default: nvcc on PATH)")
    p.add_argument("--out", type=pathlib.Path, default=DIRECTORY,
                   help=f"where to write them (default: {DIRECTORY})")
    args = p.parse_args(argv)
    try:
        built = build(args.out, args.nvcc)
    except RuntimeError as exc:
        print(f"summa: {exc}", file=sys.stderr)
        return 2
    print(f"built {args.out / FATBIN} with CUDA {built['cuda']} for sm_"
          + ", sm_".join(built["architectures"]) + f" and PTX {built['ptx']}")
    return 0

