"""Is JAX's 2-GPU float64 rate (above 2 x one GPU's) about running two GPUs
from one process? Times the per-GPU share of N = 32768 on a 2x1 grid
(16384 x 32768 x 32768) as independent products, no communication: on GPU 0
alone, on GPU 1 alone, and on both at once from one process, with CuPy and
with JAX.

    python3 docs/scripts/two_device_probe.py
"""
import os
import sys

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
import cupy  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_peers import _timed  # noqa: E402  (best of `repeat` after a warm-up)

M, K, N = 16384, 32768, 32768
FLOPS = 2.0 * M * N * K


def cupy_case(devices):
    ops = []
    for d in devices:
        with cupy.cuda.Device(d):
            rng = cupy.random.default_rng(d)
            ops.append((rng.uniform(-1, 1, (M, K)), rng.uniform(-1, 1, (K, N)),
                        cupy.empty((M, N))))

    def run():
        for d, (a, b, c) in zip(devices, ops):
            with cupy.cuda.Device(d):
                cupy.matmul(a, b, out=c)
        for d in devices:
            cupy.cuda.Device(d).synchronize()
    seconds = _timed(run, 3)
    ops.clear()  # frees the operands (the closure keeps the list)
    for d in devices:
        with cupy.cuda.Device(d):
            cupy.get_default_memory_pool().free_all_blocks()
    return len(devices) * FLOPS / seconds / 1e12


def jax_case(devices):
    import jax
    import jax.numpy as jnp
    jax.config.update("jax_enable_x64", True)
    devs = [jax.devices()[d] for d in devices]
    f = jax.jit(lambda x, y: jnp.matmul(x, y, precision=jax.lax.Precision.HIGHEST))
    ops = []
    for i, dev in enumerate(devs):
        k1, k2 = jax.random.split(jax.random.PRNGKey(i))
        ops.append((jax.device_put(jax.random.uniform(k1, (M, K), "float64", -1, 1), dev),
                    jax.device_put(jax.random.uniform(k2, (K, N), "float64", -1, 1), dev)))

    def run():
        outs = [f(a, b) for a, b in ops]
        for o in outs:
            o.block_until_ready()
    seconds = _timed(run, 3)
    ops.clear()  # frees the operands (the closure keeps the list)
    return len(devices) * FLOPS / seconds / 1e12


print(f"independent {M} x {N} x {K} float64 products, TFLOP/s in total")
print(f"{'devices':10s} {'cupy':>7s} {'jax':>7s}")
for devices in ([0], [1], [0, 1]):
    row = [cupy_case(devices)]
    try:
        row.append(jax_case(devices))
    except Exception as exc:  # JAX absent or another failure: say so, keep CuPy's
        print(f"jax: {exc}")
        row.append(float("nan"))
    print(f"{str(devices):10s} {row[0]:7.1f} {row[1]:7.1f}", flush=True)
