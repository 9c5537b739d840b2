"""Which cuBLAS do CuPy and JAX load, and how fast is each one's GEMM on one GPU?

Issue 3/8: JAX's sharded float64 matmul beats summa by ~10 % while summa's
exposed communication is 1-4 %, so the gap is the per-GPU GEMM.  This probe
times the same single-GPU GEMMs through cupy.matmul and jax.numpy.matmul and
prints the libcublas files each library mapped, so a run can point
``SUMMA_CUBLASLT`` at JAX's library.  The last line, ``JAX_CUBLASLT=<path>``,
is for the calling shell.

    python3 docs/scripts/cublas_probe.py [--shapes 16384x32768x32768,32768x32768x32768]
"""
import argparse

from compare_peers import _timed  # beside this script: best of `repeat` after a warm-up


def mapped_cublas() -> set:
    """libcublas* files mapped into this process."""
    with open("/proc/self/maps") as maps:
        return {line.split()[-1] for line in maps if "libcublas" in line}


def rate(fn, flops: float, repeat: int) -> float:
    """Best TFLOP/s of `repeat` timed calls of `fn` (each synchronising)."""
    return flops / _timed(fn, repeat) / 1e12


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="16384x32768x32768,32768x32768x32768",
                        help="comma-separated MxKxN GEMM shapes (default: %(default)s)")
    parser.add_argument("--dtype", default="float64")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    import cupy
    print("cupy", cupy.__version__, "cuBLAS",
          cupy.cuda.cublas.getVersion(cupy.cuda.device.get_cublas_handle()))
    cupy_libs = mapped_cublas()
    print("cupy maps:", sorted(cupy_libs))

    import jax
    import jax.numpy as jnp
    jax.config.update("jax_enable_x64", True)
    print("jax", jax.__version__, "devices", jax.devices())
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    rows = []
    for m, k, n in shapes:
        flops = 2.0 * m * k * n
        a = cupy.random.uniform(-1, 1, (m, k)).astype(args.dtype)
        b = cupy.random.uniform(-1, 1, (k, n)).astype(args.dtype)
        cp_rate = rate(lambda: (a @ b, cupy.cuda.Device().synchronize()), flops, args.repeat)
        a = b = None  # free before JAX allocates
        cupy.get_default_memory_pool().free_all_blocks()
        dev = jax.devices()[0]
        ja = jax.device_put(jax.random.uniform(jax.random.key(0), (m, k), args.dtype, -1, 1), dev)
        jb = jax.device_put(jax.random.uniform(jax.random.key(1), (k, n), args.dtype, -1, 1), dev)
        mm = jax.jit(lambda x, y: jnp.matmul(x, y, precision="highest"))
        jx_rate = rate(lambda: mm(ja, jb).block_until_ready(), flops, args.repeat)
        ja = jb = None
        rows.append((f"{m}x{k}x{n}", cp_rate, jx_rate))
    jax_libs = mapped_cublas() - cupy_libs
    print("jax maps:", sorted(jax_libs))
    print(f"{'MxKxN':>20} {'cupy':>8} {'jax':>8}  (TFLOP/s, {args.dtype}, one GPU)")
    for shape, cp_rate, jx_rate in rows:
        print(f"{shape:>20} {cp_rate:8.1f} {jx_rate:8.1f}")
    lt = sorted(p for p in jax_libs if "libcublasLt" in p)
    print("JAX_CUBLASLT=" + (lt[0] if lt else ""))


if __name__ == "__main__":
    main()
