"""float64 on INT8 tensor cores on one GPU, in one run: native
DGEMM, cuBLAS's INT8 GEMM ("TN"), summa's fused ``precision="fp64-int8"``
product (rate, phases, error) for a few moduli counts, and cuBLAS's own
float64 emulation (``CUBLAS_FP64_EMULATED_FIXEDPOINT_MATH``, eager).

Errors are ``max |C - C_native| / (K eps (|A| |B|))`` (the float64 PBLAS
gauge; native DGEMM is itself within it), on uniform [-1, 1) and normal data.

    python3 benchmarks/fp64_int8_speed.py --sizes 16384,32768 --json ozaki.jsonl
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import calls  # noqa: E402 -- JSON lines stamped with machine, date, command
from calls import best_device_seconds as _best  # noqa: E402 -- best of timed device runs


def _cublas_emulated(workspace: int = 0):
    """``run(a, b, c)``: c = a @ b through cuBLAS's float64 emulation (eager);
    with `workspace` bytes of workspace of its own (cublasSetWorkspace) where
    given: cuBLAS has run native DGEMM instead on some calls, perhaps short
    of room for the emulation's slices."""
    import cupy as cp
    from peers import _libcublas
    lib = _libcublas()
    handle = ctypes.c_void_p()
    if lib.cublasCreate_v2(ctypes.byref(handle)):
        raise RuntimeError("cublasCreate failed")
    lib.cublasSetStream_v2(handle, ctypes.c_void_p(cp.cuda.get_current_stream().ptr))
    status = lib.cublasSetMathMode(handle, 8)  # CUBLAS_FP64_EMULATED_FIXEDPOINT_MATH
    if status:
        raise RuntimeError(f"this cuBLAS has no float64 emulation (status {status})")
    # Without the eager strategy cuBLAS declines to emulate on Hopper (native
    # speed, native bits): say so rather than time native DGEMM as "emulation".
    if not hasattr(lib, "cublasSetEmulationStrategy"):
        raise RuntimeError(f"{lib._name}: no cublasSetEmulationStrategy")
    status = lib.cublasSetEmulationStrategy(handle, 2)  # CUBLAS_EMULATION_STRATEGY_EAGER
    if status:
        raise RuntimeError(f"{lib._name}: cublasSetEmulationStrategy(EAGER) failed ({status})")
    space = cp.empty(workspace, dtype=cp.uint8) if workspace else None  # kept by run
    if workspace:
        status = lib.cublasSetWorkspace_v2(handle, ctypes.c_void_p(space.data.ptr),
                                           ctypes.c_size_t(workspace))
        if status:
            raise RuntimeError(f"cublasSetWorkspace({workspace}) failed ({status})")
    version = ctypes.c_int()
    lib.cublasGetVersion_v2(handle, ctypes.byref(version))
    print(f"cuBLAS emulation from {lib._name}, version {version.value}", flush=True)
    one, zero = ctypes.c_double(1.0), ctypes.c_double(0.0)

    def run(a, b, c, space=space):
        n = a.shape[0]  # square, C order: c^T = b^T a^T in column-major
        status = lib.cublasDgemm_v2(handle, 0, 0, n, n, n, ctypes.byref(one),
                                    ctypes.c_void_p(b.data.ptr), n, ctypes.c_void_p(a.data.ptr),
                                    n, ctypes.byref(zero), ctypes.c_void_p(c.data.ptr), n)
        if status:
            raise RuntimeError(f"cublasDgemm failed ({status})")
    return run


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="16384,32768")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--moduli", default="auto,14,12", help="moduli counts (auto: summa's default)")
    p.add_argument("--variants", default="",
                   help="extra runs of the default moduli under settings, e.g. "
                        "'SUMMA_INT8_GEMM=gemmex;SUMMA_INT8_GEMM=cublaslt' (split by ;)")
    p.add_argument("--shapes", default="",
                   help="also the bare product on these MxNxK shapes (e.g. an out-of-core "
                        "tile's panel product 10923x32768x4096), phases and native rate")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    import cupy as cp
    import numpy as np
    from summa.precision import ozaki_gpu
    from summa.device.backend import get_backend
    backend = get_backend("cupy")
    rows = []

    def emit(r):
        rows.append(r)
        print(json.dumps(r), flush=True)
    eps = np.finfo(np.float64).eps
    for n in map(int, args.sizes.split(",")):
        a8 = cp.random.randint(-128, 128, (n, n), dtype=cp.int8)
        bt8 = cp.random.randint(-128, 128, (n, n), dtype=cp.int8)
        out = cp.empty((n, n), dtype=cp.int32)
        sec = _best(lambda: backend.int8_gemm_tn(a8, bt8, out), args.repeat)
        emit({"what": "int8 GEMM (TN)", "n": n, "seconds": sec, "tops": 2 * n**3 / sec / 1e12})
        a8 = bt8 = out = None  # back to the device (a del here reads as undefined to pyflakes)
        for data in ("uniform", "normal"):
            if data == "uniform":
                a = cp.random.random((n, n)) * 2 - 1
                b = cp.random.random((n, n)) * 2 - 1
            else:
                a = cp.random.standard_normal((n, n))
                b = cp.random.standard_normal((n, n))
            ref = a @ b
            if data == "uniform":
                sec = _best(lambda: cp.matmul(a, b, out=ref), args.repeat)
                native = 2 * n**3 / sec / 1e12
                emit({"what": "native DGEMM", "n": n, "seconds": sec, "tflops": native})
            gauge = cp.abs(a) @ cp.abs(b)
            gauge *= n * eps
            c = cp.empty_like(ref)

            def error(against=None):
                return float(cp.max(cp.abs(c - (ref if against is None else against)) / gauge))
            best = None  # the default moduli's product: to see what fewer moduli lose
            runs = [(m_, "") for m_ in args.moduli.split(",")] + \
                [("auto", v) for v in args.variants.split(";") if v]
            for moduli, setting in runs:
                count = None if moduli == "auto" else int(moduli)
                saved = dict(os.environ)
                os.environ.update(dict(kv.split("=", 1) for kv in setting.split(",") if kv))
                try:
                    scheme = ozaki_gpu.Scheme(moduli=count)
                    sec = _best(lambda: ozaki_gpu.gemm(1.0, a, b, c, backend=backend,
                                                       scheme=scheme), args.repeat)
                    marks = []
                    ozaki_gpu.gemm(1.0, a, b, c, backend=backend, scheme=scheme, marks=marks)
                    cp.cuda.Device().synchronize()
                except Exception as exc:  # noqa: BLE001 -- e.g. out of memory: say so, go on
                    emit({"what": "summa fp64-int8", "n": n, "data": data, "moduli": moduli,
                          "error": repr(exc)[:200]})
                    continue
                finally:
                    os.environ.clear()
                    os.environ.update(saved)
                phases = ozaki_gpu.phase_seconds(marks)
                row = {"what": "summa fp64-int8" + (f" [{setting}]" if setting else ""), "n": n,
                       "data": data,
                       "moduli": ozaki_gpu.moduli_for(n, count), "seconds": sec,
                       "tflops": 2 * n**3 / sec / 1e12,
                       "vs_native": 2 * n**3 / sec / 1e12 / native,
                       "error_per_gauge": error(), "phases": phases}
                if best is None and count is None and not setting:
                    best = c.copy()
                    # native DGEMM's own distance from it: what error_per_gauge mostly measures
                    row["native_from_default_per_gauge"] = float(cp.max(cp.abs(ref - best) /
                                                                        gauge))
                elif best is not None:
                    row["from_default_per_gauge"] = error(best)
                emit(row)
            # summa's scratch back to the device first: room for cuBLAS's own
            cp.get_default_memory_pool().free_all_blocks()
            for workspace in (0, 16 << 30):
                try:
                    run = _cublas_emulated(workspace)
                    sec = _best(lambda: run(a, b, c), args.repeat)
                    bits = bool((c == cp.matmul(a, b)).all())  # native's bits: not emulated
                    row = {"what": "cuBLAS emulation (eager)", "n": n, "data": data,
                           "workspace": workspace, "seconds": sec,
                           "tflops": 2 * n**3 / sec / 1e12, "error_per_gauge": error(),
                           "same_bits_as_native": bits}
                    if best is not None:  # how close to summa's default product
                        row["from_default_per_gauge"] = error(best)
                    emit(row)
                    run = None
                except Exception as exc:  # noqa: BLE001
                    emit({"what": "cuBLAS emulation (eager)", "n": n, "data": data,
                          "workspace": workspace, "error": repr(exc)[:200]})
                    continue
                if not bits:
                    break  # it emulated: no second try
            a = b = ref = gauge = c = best = None
            cp.get_default_memory_pool().free_all_blocks()
    for shape in filter(None, args.shapes.split(",")):
        m, n, k = map(int, shape.lower().split("x"))
        a = cp.random.random((m, k)) * 2 - 1
        b = cp.random.random((k, n)) * 2 - 1
        c = cp.empty((m, n))
        native = 2 * m * n * k / _best(lambda: cp.matmul(a, b, out=c), args.repeat) / 1e12
        for setting in [""] + [v for v in args.variants.split(";") if v]:
            saved = dict(os.environ)
            os.environ.update(dict(kv.split("=", 1) for kv in setting.split(",") if kv))
            try:
                sec = _best(lambda: ozaki_gpu.gemm(1.0, a, b, c, backend=backend), args.repeat)
                marks = []
                ozaki_gpu.gemm(1.0, a, b, c, backend=backend, marks=marks)
                cp.cuda.Device().synchronize()
            finally:
                os.environ.clear()
                os.environ.update(saved)
            emit({"what": f"fp64-int8 {m}x{n}x{k}" + (f" [{setting}]" if setting else ""),
                  "n": k, "seconds": sec, "tflops": 2 * m * n * k / sec / 1e12,
                  "moduli": ozaki_gpu.moduli_for(k),
                  "vs_native": 2 * m * n * k / sec / 1e12 / native,
                  "phases": ozaki_gpu.phase_seconds(marks)})
        a = b = c = None
        cp.get_default_memory_pool().free_all_blocks()
    lt = getattr(backend, "_int8_lt", None)  # cuBLASLt's INT8 choices, timed here
    if lt is not None and lt.choices:
        emit({"what": "cuBLASLt INT8 choices",
              "choices": {" ".join(map(str, key)): v for key, v in lt.choices.items()}})
    for r in rows:
        calls.append_json(args.json, r)
    print()
    for r in rows:
        if "choices" in r:
            print(f"{r['what']}: {r['choices']}")
            continue
        if "seconds" not in r:
            print(f"{r['what']:>26} N={r['n']:>6} {r.get('data', ''):>8}: {r['error']}")
            continue
        rate = r.get("tflops", r.get("tops"))
        line = (f"{r['what']:>26} N={r['n']:>6} {r.get('data', ''):>8} "
                f"{'moduli ' + str(r['moduli']) if 'moduli' in r else '':>10} "
                f"{r['seconds']:8.4f} s {rate:8.1f} {'TFLOP/s' if 'tflops' in r else 'TOPS'}")
        if "vs_native" in r:
            line += f" ({r['vs_native']:.3f} of native)"
        if "error_per_gauge" in r:
            line += f" error/gauge {r['error_per_gauge']:.2e}"
        if "native_from_default_per_gauge" in r:
            line += f" (native from it {r['native_from_default_per_gauge']:.2e})"
        if "from_default_per_gauge" in r:
            line += f" (from the default's {r['from_default_per_gauge']:.2e})"
        if "phases" in r:
            line += " [" + ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in r["phases"].items()) + "]"
        print(line)
    # a product that raised (out of memory, a cuBLAS without emulation) is reported
    # and the others still run, but the run fails
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
