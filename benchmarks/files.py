"""``summa multiply`` from .npy files against the disk it reads and writes.

Writes A and B (N x N, --dtype) into --dir, measures the disk there in the
same run (T threads of ``preadv`` over a file evicted from the page cache,
T threads of ``pwrite`` + ``fsync`` of a file as large as C), then times
``python -m summa multiply`` end to end (wall time of the whole process) as
it chooses by default (on GPUs: streamed), ``--in-memory`` and out of core
under a cap, each with the files evicted first (cold) and again
with them in the page cache (warm), and prints every phase and the ratio of
the wall time to the disk bound (bytes read / read rate + bytes written /
write rate).

    python3 benchmarks/files.py --size 24576 --dir /tmp/files --ranks 1

Each multiply runs as ``$MPIEXEC -n R python3 -m summa multiply ...`` (MPIEXEC
default ``mpirun``); its JSON record goes to --json with the disk rates added.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

import calls  # JSON lines stamped with machine, date, command

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHUNK = 64 << 20


def evict(path: str) -> None:
    """Drop a file's clean pages from the page cache (no root needed)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def read_rate(path: str, threads: int) -> float:
    """GB/s of `threads` threads of preadv over the whole (evicted) file."""
    evict(path)
    size = os.path.getsize(path)
    fd = os.open(path, os.O_RDONLY)
    bufs = [bytearray(CHUNK) for _ in range(threads)]

    def part(i):
        buf = memoryview(bufs[i % threads])
        for off in range(i * CHUNK, size, threads * CHUNK):
            os.preadv(fd, [buf[: min(CHUNK, size - off)]], off)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(part, range(threads)))
    seconds = time.perf_counter() - t0
    os.close(fd)
    return size / seconds / 1e9


def write_rate(path: str, size: int, threads: int, fsync: bool = True) -> float:
    """GB/s of `threads` threads of pwrite of `size` bytes into a new file,
    fsync included (without: the rate into the page cache, which one file's
    lock may bound whatever the threads)."""
    data = np.random.default_rng(0).integers(0, 255, CHUNK, dtype=np.uint8).tobytes()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)

    def part(i):
        for off in range(i * CHUNK, size, threads * CHUNK):
            os.pwrite(fd, data[: min(CHUNK, size - off)], off)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(part, range(threads)))
    if fsync:
        os.fsync(fd)
    seconds = time.perf_counter() - t0
    os.close(fd)
    os.unlink(path)
    return size / seconds / 1e9


def make(path: str, n: int, dtype, seed: int, fortran: bool = False) -> None:
    """An n x n .npy file of uniform [-1, 1) values (Fortran-ordered where
    asked), written in blocks of the rows (columns) it stores."""
    from numpy.lib import format as npy_format
    out = npy_format.open_memmap(path, mode="w+", dtype=dtype, shape=(n, n),
                                 fortran_order=fortran)
    stored = out.T if fortran else out  # C-ordered either way
    rng = np.random.default_rng(seed)
    for r in range(0, n, 2048):
        stored[r:r + 2048] = rng.uniform(-1, 1, (min(2048, n - r), n))
    out.flush()
    del out, stored


def multiply(args, extra: list[str], label: str, cold: bool, rates: dict) -> dict:
    a, b, c = (os.path.join(args.dir, f"{x}.npy") for x in "ABC")
    if cold:
        evict(a)
        evict(b)
    log = os.path.join(args.dir, "record.jsonl")
    if os.path.exists(log):
        os.unlink(log)
    cmd = shlex.split(os.environ.get("MPIEXEC", "mpirun")) + [
        "-n", str(args.ranks), sys.executable, "-m", "summa", "multiply", a, b, "-o", c,
        "--quiet", "--json", log] + extra
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=ROOT))
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        print(p.stdout[-2000:], p.stderr[-3000:], file=sys.stderr)
        raise SystemExit(f"{label}: multiply exited {p.returncode}")
    with open(log) as fh:
        record = json.loads(fh.readlines()[-1])
    item = np.dtype(args.dtype).itemsize
    read_bytes, write_bytes = 2 * args.size**2 * item, args.size**2 * item
    bound = read_bytes / 1e9 / rates["read"] + write_bytes / 1e9 / rates["write"]
    record.update(label=label, cold=cold, process_wall=wall, disk_bound=bound, **rates)
    os.unlink(c)
    return record


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", type=int, default=24576)
    p.add_argument("--dtype", default="float64")
    p.add_argument("--dir", default="/tmp/summa-files")
    p.add_argument("--ranks", type=int, default=1)
    p.add_argument("--threads", type=int, default=16)
    p.add_argument("--device-memory", default="8GiB", help="the out-of-core runs' cap")
    p.add_argument("--only", help="these runs only (comma-separated: default, in memory, "
                   "out of core)")
    p.add_argument("--order", choices=("C", "F"), default="C",
                   help="how the input files store their matrices (F: as np.save of a "
                        "Fortran-ordered array writes them)")
    p.add_argument("--json")
    args = p.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    for name, seed in (("A", 1), ("B", 2)):
        make(os.path.join(args.dir, f"{name}.npy"), args.size, args.dtype, seed,
             fortran=args.order == "F")
    size_c = args.size**2 * np.dtype(args.dtype).itemsize
    probe = os.path.join(args.dir, "probe.bin")
    rates = {"read": read_rate(os.path.join(args.dir, "A.npy"), args.threads),
             "write": write_rate(probe, size_c, args.threads),
             # into the page cache only: what the product's copy into its file can reach
             "cache_write_1": write_rate(probe, size_c, 1, fsync=False),
             "cache_write": write_rate(probe, size_c, args.threads, fsync=False)}
    print(f"disk at {args.dir}: {args.threads} threads read {rates['read']:.2f} GB/s, "
          f"write + fsync {rates['write']:.2f} GB/s; into the page cache (no fsync) one thread "
          f"{rates['cache_write_1']:.2f}, {args.threads} threads {rates['cache_write']:.2f} GB/s",
          flush=True)
    runs = []
    for label, extra in (("default", []), ("in memory", ["--in-memory"]),
                         ("out of core", ["--device-memory", args.device_memory])):
        if args.only and label not in args.only.split(","):
            continue
        for cold in (True, False):
            runs.append(multiply(args, extra, label, cold, rates))
    print(f"\n{'run':<12} {'files':<6} {'wall':>7} {'bound':>7} {'ratio':>6}  phases (s)")
    for r in runs:
        phases = ", ".join(f"{k[:-8]} {r[k]:.2f}" for k in (
            "startup_seconds", "prepare_seconds", "read_seconds", "setup_seconds",
            "compute_seconds", "scan_seconds", "check_seconds", "write_seconds")
            if r.get(k) is not None)
        print(f"{r['label']:<12} {'cold' if r['cold'] else 'warm':<6} {r['process_wall']:7.2f} "
              f"{r['disk_bound']:7.2f} {r['process_wall'] / r['disk_bound']:6.2f}  {phases}; "
              f"{r['tflops']:.1f} TFLOP/s in the multiply; read by operand "
              + ", ".join(f"{k} {v:.2f}" for k, v in (r.get("read_parts") or {}).items()))
        # Rank 0's steps, each with its own seconds, then the process's exit.
        steps, last = [], 0.0
        for step, at in r.get("timeline") or []:
            steps.append(f"{step} {at - last:.2f}")
            last = at
        idle = ", ".join(f"{k} {r[f'gpu_idle_{k}']:.2f}" for k in ("head", "between", "tail")
                         if r.get(f"gpu_idle_{k}") is not None)
        print(f"{'':<19} steps: " + ", ".join(steps)
              + f"; after the call {r['process_wall'] - r['wall_seconds']:.2f} (exit, mpirun)"
              + (f"; GPU idle in the multiply: {idle}" if idle else ""))
        calls.append_json(args.json, r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
