"""The user's case under ``mpirun -np P`` (issue 27): the arrays on rank 0
(fresh pageable NumPy arrays, None elsewhere), or node-shared from the start
(``summa.host.empty``, filled on rank 0), one GPU per rank with ``--free``
left free on each; ``summa.matmul(a, b, comm=world)`` first call and second,
each timed end to end on rank 0 (between barriers), checked by Freivalds'
test. Compare with ``seed_case.py --gpus P`` (the same from a plain process,
through summa's pool) on the same machine.

    mpirun -np 2 python3 docs/scripts/seed_mpi.py --size 65536 --arrays root --json s.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "docs", "scripts"))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", type=int, default=32768)
    p.add_argument("--dtype", default="float64")
    p.add_argument("--free", default="24GiB")
    p.add_argument("--arrays", choices=("root", "shared"), default="root")
    p.add_argument("--json")
    args = p.parse_args()
    import numpy as np
    from mpi4py import MPI
    import cupy as cp
    import summa
    from seed_case import _bytes, _check, _fresh, hold_all_but
    world = MPI.COMM_WORLD
    node = world.Split_type(MPI.COMM_TYPE_SHARED)
    device = node.Get_rank() % cp.cuda.runtime.getDeviceCount()
    cp.cuda.Device(device).use()
    holds = hold_all_but(_bytes(args.free), 0, devices=[device])
    n, dtype = args.size, np.dtype(args.dtype)
    t0 = time.perf_counter()
    if args.arrays == "root":
        a = _fresh((n, n), dtype, 1) if world.rank == 0 else None
        b = _fresh((n, n), dtype, 2) if world.rank == 0 else None
    else:
        a = summa.host.empty((n, n), dtype, world)
        b = summa.host.empty((n, n), dtype, world)
        if world.rank == 0:
            a[...] = _fresh((n, n), dtype, 1)
            b[...] = _fresh((n, n), dtype, 2)
        world.Barrier()
    made = time.perf_counter() - t0
    rows = []
    for call in ("first", "second"):
        world.Barrier()
        s = time.perf_counter()
        c = summa.matmul(a, b, comm=world)
        world.Barrier()
        seconds = time.perf_counter() - s
        if world.rank == 0:
            r = {"peer": f"summa mpirun/{args.arrays}", "call": call, "n": n,
                 "dtype": dtype.name, "ranks": world.size, "seconds": seconds,
                 "tflops": 2.0 * n**3 / seconds / 1e12, "residual": _check(c, a, b),
                 "make_seconds": made}
            rows.append(r)
            print(json.dumps(r), flush=True)
        del c
    for dev, ptr in holds:
        cp.cuda.runtime.free(ptr)
    if world.rank == 0 and args.json:
        with open(args.json, "a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
