"""The GEMM rate by how its operands lie: A and B each row-major (C order)
or column-major (a ``.T`` view of a C array, as Fortran-ordered operands
reach cuBLAS), through summa's own ``Backend.gemm``, for panel products of
out-of-core shapes. The figure behind ``SUMMA_TRANSPOSE_A``'s and
``SUMMA_TRANSPOSE_B``'s defaults (:data:`summa.planning.tuning.TRANSPOSED_A_FASTER`,
:data:`~summa.planning.tuning.TRANSPOSED_B_FASTER`).

Usage, on the GPU machine from the source tree::

    PYTHONPATH=. python3 benchmarks/gemm_forms.py --dtypes complex128,float64

Prints one line per dtype and shape: TFLOP/s with A and B as C C, C F, F C
and F F (``--cpu``: NumPy, for trying the script; its rates say nothing of a GPU).
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import calls  # noqa: E402  (benchmarks/calls.py: sizes, operands, timing)

#: (m, n, panel width): a whole tile, and the tall and wide tiles of a cut.
SHAPES = ((32768, 32768, 2048), (32768, 5462, 2048), (5462, 32768, 2048))
FORMS = ("CC", "CF", "FC", "FF")


def operand(xp, shape: tuple, dtype, form: str):
    """A fresh random `shape` operand lying row-major ("C") or column-major ("F")."""
    x = calls.device_random(shape if form == "C" else shape[::-1], dtype, xp)
    return x if form == "C" else x.T


def rate(backend, shape: tuple, dtype, form: str, repeat: int) -> float:
    """TFLOP/s of ``c += a @ b`` with `a` and `b` lying as `form` says, best of `repeat`."""
    xp = backend.xp
    m, n, k = shape
    a, b = operand(xp, (m, k), dtype, form[0]), operand(xp, (k, n), dtype, form[1])
    c = xp.zeros((m, n), dtype)
    seconds = calls.best_device_seconds(lambda: backend.gemm(1.0, a, b, c), repeat,
                                        backend.synchronize)
    flops = (8 if np.dtype(dtype).kind == "c" else 2) * m * n * k
    return flops / seconds / 1e12


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dtypes", default="complex128,float64,complex64,float32")
    p.add_argument("--shapes", help="comma-separated N or MxNxK (default: three out-of-core "
                                    "tiles)")
    p.add_argument("--repeat", type=int, default=4)
    p.add_argument("--cpu", action="store_true", help="NumPy (to try the script)")
    args = p.parse_args(argv)
    from summa.device.backend import get_backend
    backend = get_backend("numpy" if args.cpu else "cupy")
    shapes = SHAPES if not args.shapes else [calls.parse_size(s) for s in args.shapes.split(",")]
    for dtype in args.dtypes.split(","):
        for shape in shapes:
            rates = {form: rate(backend, shape, dtype, form, args.repeat) for form in FORMS}
            print(f"{dtype:10s} {'x'.join(map(str, shape)):>18s}  "
                  + "  ".join(f"{f} {r:6.3g}" for f, r in rates.items()) + "  TFLOP/s",
                  flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
