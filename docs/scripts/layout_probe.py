"""Does the operands' memory layout change the GEMM rate on one GPU?

XLA is free to lay out the all-gathered operand of JAX's sharded matmul as it
likes (row- or column-major), which changes the cuBLAS call from "NN" to "NT",
"TN" or "TT". JAX's 2-GPU float64 ran at 56 TFLOP/s per GPU where our one-GPU
products reach 52-54; this times one rank's share of N = 32768 on a 2x1 grid
(16384 x 32768 x 32768, and 32768 x 16384 x 32768 as on a 1 x 2 grid) with
each operand stored either way (cuBLAS gemmEx, column-major view of
row-major C), median of 5 turns in round robin:

    python3 docs/scripts/layout_probe.py [dtype ...] [tf32]

(``tf32``: float32 products on TF32 tensor cores.)
"""
import os
import sys

import cupy
import numpy as np
from cupy_backends.cuda.libs import cublas

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from probe_timing import round_robin  # noqa: E402
from summa.backend import (_GEMM_TYPES, _CUBLAS_GEMM_DEFAULT,  # noqa: E402
                           _CUBLAS_COMPUTE_32F_FAST_TF32)
TF32 = "tf32" in sys.argv[1:]

K = 32768
#: One rank's C block on a 2 x 1 grid (16384 x 32768) and on a 1 x 2 grid (32768 x 16384).
SHAPES = ((16384, 32768), (32768, 16384))


def main():
    dtypes = [np.dtype(d) for d in sys.argv[1:] if d != "tf32"] or [np.dtype("float64"), np.dtype("float32")]
    print(f"M x N x {K}, TFLOP/s; A and B stored row-major (as given) or transposed")
    print(f"{'dtype':8s} {'M x N':>13s} {'A, B':>6s} {'A, Bt':>6s} {'At, B':>6s} {'At, Bt':>6s}")
    for dt in dtypes:
        for M, N in SHAPES:
            row(dt, M, N)


def row(dt, M, N):
    """Print one row: the product in each of the four layouts."""
    handle = cupy.cuda.device.get_cublas_handle()
    rng = cupy.random.default_rng(1)
    a = rng.uniform(-1, 1, (M, K)).astype(dt)
    b = rng.uniform(-1, 1, (K, N)).astype(dt)
    stored = {"A": a, "At": cupy.ascontiguousarray(a.T), "B": b,
              "Bt": cupy.ascontiguousarray(b.T)}
    data_type, compute, scalar = _GEMM_TYPES[dt.char]
    if TF32 and dt.char == "f":
        compute = _CUBLAS_COMPUTE_32F_FAST_TF32
    one, zero = np.array(1, dtype=scalar), np.array(0, dtype=scalar)
    outputs = {key: cupy.empty((M, N), dtype=dt) for key in ("A, B", "A, Bt", "At, B", "At, Bt")}
    cases = {}
    for an, bn in (("A", "B"), ("A", "Bt"), ("At", "B"), ("At", "Bt")):
        # Row-major C = A B is column-major C^T = B^T A^T (n x m): B first.
        x, y, out = stored[bn], stored[an], outputs[f"{an}, {bn}"]
        opx, ldx = (0, N) if bn == "B" else (1, K)
        opy, ldy = (0, K) if an == "A" else (1, M)
        cases[f"{an}, {bn}"] = (lambda x=x, y=y, out=out, opx=opx, ldx=ldx, opy=opy, ldy=ldy:
                                cublas.gemmEx(handle, opx, opy, N, M, K, one.ctypes.data,
                                              x.data.ptr, data_type, ldx, y.data.ptr,
                                              data_type, ldy, zero.ctypes.data, out.data.ptr,
                                              data_type, N, compute, _CUBLAS_GEMM_DEFAULT))
    seconds = round_robin(cases)
    for key, out in outputs.items():  # the same product whatever the layout
        assert float(abs(out - outputs["A, B"]).max()) <= 1e-6 * K, key
    rates = [2.0 * M * N * K / seconds[key] / 1e12 for key in outputs]
    name = dt.name + ("/tf32" if TF32 and dt.char == "f" else "")
    print(f"{name:8s} {f'{M} x {N}':>13s} " + " ".join(f"{r:6.1f}" for r in rates),
          flush=True)
    del a, b, stored, outputs
    cupy.get_default_memory_pool().free_all_blocks()


if __name__ == "__main__":
    main()
