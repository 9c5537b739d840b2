"""``summa.matmul`` on arrays that already lie on the GPU, against the
library's own product on the same arrays in the same process.

Goal (one H200): float64 16384³ CuPy operands within 5 % of ``cupy.matmul``
(ratio = library's seconds / summa's seconds >= 0.95), the product a CuPy
array on the operands' GPU; torch CUDA tensors likewise against
``torch.matmul``, and JAX's arrays against ``jax.numpy.matmul`` (each
where it imports and sees the GPU: both reach summa through DLPack).

Each peer is timed from a synchronized GPU to a synchronized GPU: its first
call on these operands (after CUDA, cuBLAS and the dtype's kernels are up:
a small product of the same dtype runs first), then ``--repeats`` more,
alternating summa and the peer so that drift (clocks, heat) falls on both.

Usage, on the GPU machine from the source tree (no pytest needed)::

    PYTHONPATH=. python3 benchmarks/device_arrays.py --size 16384 --dtype float64

or from Python (the benchmark matrix)::

    from benchmarks.device_arrays import compare
    row = compare(16384, "float64")          # {"first_ratio": ..., "again_ratio": ...}

Prints one line per library and, with ``--json``, appends the rows as JSON lines.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import calls  # JSON lines stamped with machine, date, command

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _timed(sync, call, *args) -> tuple[float, object]:
    """Seconds of `call(*args)` between two synchronizations of the GPU, and its result."""
    sync()
    began = time.perf_counter()
    result = call(*args)
    sync()
    return time.perf_counter() - began, result


def _uniform(cupy, shape, dtype):
    """Uniform [-1, 1) values of `dtype` (complex: in both parts) on the GPU."""
    real = cupy.dtype(dtype).char.lower()
    parts = [cupy.random.random(shape, dtype="d" if real == "e" else real) * 2 - 1
             for _ in range(2 if cupy.dtype(dtype).kind == "c" else 1)]
    x = parts[0] if len(parts) == 1 else parts[0] + 1j * parts[1]
    return x.astype(dtype)


def _operands(library: str, n: int, dtype: str):
    """``(a, b, the library's own product function, synchronize)`` for
    n x n operands of uniform [-1, 1) values on the current GPU."""
    import cupy
    da, db = (_uniform(cupy, (n, n), dtype) for _ in range(2))
    sync = cupy.cuda.Device().synchronize
    if library == "cupy":
        return da, db, cupy.matmul, sync
    if library == "jax":
        import jax
        jax.config.update("jax_enable_x64", True)  # float64 stays float64
        ja, jb = jax.dlpack.from_dlpack(da), jax.dlpack.from_dlpack(db)
        # (JAX dispatches on threads of its own: its product is waited for by
        # itself, then the device for anything else queued)
        return ja, jb, lambda x, y: jax.numpy.matmul(x, y).block_until_ready(), sync
    import torch
    ta, tb = torch.from_dlpack(da), torch.from_dlpack(db)
    return ta, tb, torch.matmul, lambda: torch.cuda.synchronize()


def compare(n: int = 16384, dtype: str = "float64", repeats: int = 5,
            library: str = "cupy") -> dict:
    """``summa.matmul(a, b)`` against `library`'s own product (``cupy``,
    ``torch`` or ``jax``) on the same n x n device operands, in this process.

    Returns
    -------
    dict
        ``first_seconds`` and ``again_seconds`` (the median of the repeats)
        of each (``summa_*``, ``peer_*``), their ratios (``first_ratio``,
        ``again_ratio``: the peer's seconds over summa's; 1 is as fast,
        >= 0.95 meets the goal), ``summa_tflops``, the largest difference of
        the two products relative to the largest entry (``difference``), the
        kind summa returned and whether it lies on the operands' GPU.
    """
    sys.path.insert(0, ROOT)
    import cupy
    import summa
    a, b, peer, sync = _operands(library, n, dtype)
    small_a, small_b, _, _ = _operands(library, 256, dtype)
    peer(small_a, small_b)  # CUDA, cuBLAS and the dtype's kernels up, for both
    sync()
    row = {"library": library, "n": n, "dtype": dtype, "repeats": repeats}
    row["summa_first_seconds"], c = _timed(sync, summa.matmul, a, b)
    row["peer_first_seconds"], ref = _timed(sync, peer, a, b)
    summa_again, peer_again = [], []
    for _ in range(repeats):
        seconds, c = _timed(sync, summa.matmul, a, b)
        summa_again.append(seconds)
        seconds, ref = _timed(sync, peer, a, b)
        peer_again.append(seconds)
    row["summa_again_seconds"] = statistics.median(summa_again)
    row["peer_again_seconds"] = statistics.median(peer_again)
    row["first_ratio"] = row["peer_first_seconds"] / row["summa_first_seconds"]
    row["again_ratio"] = row["peer_again_seconds"] / row["summa_again_seconds"]
    flops = (8 if "complex" in dtype else 2) * n**3
    row["summa_tflops"] = flops / row["summa_again_seconds"] / 1e12
    c_dev, ref_dev = cupy.from_dlpack(c), cupy.from_dlpack(ref)
    row["difference"] = float(abs(c_dev - ref_dev).max() / abs(ref_dev).max())
    row["returned"] = f"{type(c).__module__}.{type(c).__name__}"
    row["same_gpu"] = int(c_dev.device.id) == int(cupy.from_dlpack(a).device.id)
    del a, b, c, ref, c_dev, ref_dev
    cupy.get_default_memory_pool().free_all_blocks()
    return row


def _on_gpu(library: str) -> bool:
    """Does `library` import here and see a GPU? (CuPy is taken as given.)"""
    try:
        if library == "torch":
            import torch
            return bool(torch.cuda.is_available())
        if library == "jax":
            import jax
            return any(d.platform == "gpu" for d in jax.devices())
    except Exception:  # noqa: BLE001 -- not importable, or no backend for a GPU
        return False
    return True


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", type=int, default=16384)
    p.add_argument("--dtype", default="float64")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--libraries", default="cupy,torch,jax",
                   help="of cupy, torch and jax (torch and jax left out where they do not "
                        "import or see no GPU)")
    p.add_argument("--json", help="append the rows to this JSONL file")
    args = p.parse_args(argv)
    # JAX takes 75 % of the GPU's memory when it starts unless told not to:
    # summa and CuPy would then plan and run in what is left
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    rows = []
    for library in args.libraries.split(","):
        if not _on_gpu(library):
            print(f"{library}: not importable here, or sees no GPU: left out")
            continue
        row = compare(args.size, args.dtype, args.repeats, library)
        rows.append(row)
        print(f"{library:>6} {args.dtype} {args.size}^3: first call summa "
              f"{row['summa_first_seconds']:.4f} s vs {library} {row['peer_first_seconds']:.4f} s "
              f"(ratio {row['first_ratio']:.3f}); again {row['summa_again_seconds']:.4f} s vs "
              f"{row['peer_again_seconds']:.4f} s (ratio {row['again_ratio']:.3f}, "
              f"{row['summa_tflops']:.1f} TFLOP/s); returned {row['returned']} on the same GPU: "
              f"{row['same_gpu']}; difference {row['difference']:.1e}", flush=True)
    for row in rows:
        calls.append_json(args.json, row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
