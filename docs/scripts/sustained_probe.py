"""Does one GPU's GEMM rate depend on the data, and does it hold under sustained load?

JAX's 2-GPU float64 product ran at up to 57 TFLOP/s per GPU, above any one-GPU
rate cuBLAS gave us (51-54), on the same cuBLAS; and N = 100,000 on 2 GPUs ran at
49.6 per GPU over 20 s. Two one-GPU questions (no MPI):

1. data: one rank's share of N = 32768 on 2 GPUs (16384 x 32768 x 32768), one
   GEMM, on operands from summa's generator, CuPy's normal, and JAX's uniform
   (when JAX is installed); each also through JAX's matmul. Mean set bits per
   element say how much the values toggle (a power draw proxy).
2. sustained: panel GEMMs back to back for --seconds, per-GEMM rates by CUDA
   events, first second against the last; panel widths and cuBLASLt's timed
   algorithm against gemmEx. Variant start/stop times (Unix seconds) are printed
   so an ``nvidia-smi -lms`` log can be laid beside them.

    python3 docs/scripts/sustained_probe.py [--part data|sustained|both] [--seconds 8]
"""
import argparse
import os
import time

import cupy
import numpy as np

from summa.backend import CupyBackend
from summa.matrix import _uniform

_POPCOUNT = cupy.ElementwiseKernel("uint64 x", "float64 y", "y = __popcll(x)", "popcount64")


def _summa_values(shape, seed, rows=2048):
    """summa's uniform [-1, 1), made a few rows at a time to bound temporaries."""
    out = cupy.empty(shape)
    for r in range(0, shape[0], rows):
        count = min(rows, shape[0] - r) * shape[1]
        counters = cupy.arange(r * shape[1], r * shape[1] + count, dtype=cupy.uint64)
        out[r:r + rows] = _uniform(cupy, counters, seed, np.float64).reshape(-1, shape[1])
    return out


def _jax_values(shape, seed):
    import jax
    jax.config.update("jax_enable_x64", True)
    x = jax.random.uniform(jax.random.PRNGKey(seed), shape, "float64", -1.0, 1.0)
    out = cupy.array(cupy.from_dlpack(x))  # a copy CuPy owns; JAX's is dropped
    del x
    return out


def _rate(fn, flops, repeat=3):
    fn()
    cupy.cuda.Device().synchronize()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        cupy.cuda.Device().synchronize()
        times.append(time.perf_counter() - t0)
    return flops / float(np.median(times)) / 1e12


def data_part(m=16384, n=32768, k=32768):
    flops = 2.0 * m * n * k
    sources = {"summa uniform[-1,1)": lambda s, seed: _summa_values(s, seed),
               "cupy normal": lambda s, seed: cupy.random.default_rng(seed).standard_normal(s)}
    try:
        import jax
        import jax.numpy as jnp
        jax.config.update("jax_enable_x64", True)  # float64 operands stay float64
        sources["jax uniform[-1,1)"] = _jax_values
    except ImportError:
        jax = None
        print("JAX not installed: its row is skipped")
    print(f"data: {m} x {n} x {k} float64, median of 3")
    print(f"{'operands':22s} {'bits set':>8s} {'cupy':>7s} {'gemmEx':>7s} {'jax':>7s}")
    backend = CupyBackend(0)
    for name, draw in sources.items():
        a, b = draw((m, k), 1), draw((k, n), 2)
        c = cupy.empty((m, n))
        bits = float(_POPCOUNT(a.view(cupy.uint64)).mean())
        cp = _rate(lambda: cupy.matmul(a, b, out=c), flops)
        ge = _rate(lambda: backend.gemm(1.0, a, b, c, beta=0.0), flops)
        jx = float("nan")
        if jax is not None:
            ja, jb = jnp.from_dlpack(a), jnp.from_dlpack(b)
            f = jax.jit(lambda x, y: jnp.matmul(x, y, precision=jax.lax.Precision.HIGHEST))
            jx = _rate(lambda: f(ja, jb).block_until_ready(), flops)
            del ja, jb
        print(f"{name:22s} {bits:8.2f} {cp:7.1f} {ge:7.1f} {jx:7.1f}", flush=True)
        a = b = c = None  # freed before the next source's operands
        cupy.get_default_memory_pool().free_all_blocks()


def sustained_part(seconds, m=50000, n=100000):
    """Panel GEMMs of one rank of N = 100,000 on 2 GPUs, cycling over two panels."""
    print(f"sustained: C {m} x {n} float64 += panels, {seconds:.0f} s per variant")
    print(f"{'variant':26s} {'start':>14s} {'GEMMs':>5s} {'first s':>8s} {'last 2 s':>8s} "
          f"{'all':>7s}")
    c = cupy.zeros((m, n))
    for library, nb in (("cublas", 4096), ("cublas", 8192), ("cublas", 16384),
                        ("cublaslt", 8192), ("cublas", 4096)):
        backend = CupyBackend(0, library=library)
        a = [_summa_values((m, nb), 10 + i) for i in range(2)]
        b = [_summa_values((nb, n), 20 + i) for i in range(2)]
        backend.gemm(1.0, a[0], b[0], c)  # plans (cuBLASLt: times its candidates)
        cupy.cuda.Device().synchronize()
        flops = 2.0 * m * n * nb
        events, start, i = [cupy.cuda.Event()], time.time(), 0
        events[0].record()
        while time.time() - start < seconds:
            backend.gemm(1.0, a[i % 2], b[i % 2], c)
            events.append(cupy.cuda.Event())
            events[-1].record()
            events[-1].synchronize()  # one GEMM in flight: the host clock bounds the run
            i += 1
        ms = [cupy.cuda.get_elapsed_time(e0, e1) for e0, e1 in zip(events, events[1:])]
        rates = np.array([flops / (t / 1e3) / 1e12 for t in ms])
        elapsed = np.cumsum(ms) / 1e3
        first = rates[elapsed <= max(1.0, elapsed[0])].mean()
        last = rates[elapsed >= elapsed[-1] - 2.0].mean()
        print(f"{library + ' nb ' + str(nb):26s} {start:14.2f} {len(ms):5d} {first:8.1f} "
              f"{last:8.1f} {flops * len(ms) / elapsed[-1] / 1e12:7.1f}", flush=True)
        del a, b
        cupy.get_default_memory_pool().free_all_blocks()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("data", "sustained", "both"), default="both")
    parser.add_argument("--seconds", type=float, default=8.0)
    args = parser.parse_args()
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    if args.part in ("data", "both"):
        data_part()
    if args.part in ("sustained", "both"):
        sustained_part(args.seconds)


if __name__ == "__main__":
    main()
