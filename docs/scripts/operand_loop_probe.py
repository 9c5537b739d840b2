"""Loops of multiplies: the same operands every time, or a new B every time.

Since session 10 the peers' blocks stay open between multiplies (summa/ipc.py)
and ``auto`` copies directly wherever they do, so a loop over the same
operands opens them once; but a loop that makes a new B for every multiply
(``X = A @ X``-like) opens each new one, which the GEMMs do not hide at mid
sizes (TF32 at N = 16384: ~10-20 ms against a 12 ms multiply). This times
both loops under ``auto`` and under ``nccl``, each call on its own (new B
made and written before the clock starts), and prints per loop the best and
the median call in TFLOP/s, and how many peer blocks the calls opened.

    mpirun -np 2 python3 docs/scripts/operand_loop_probe.py --size 16384 \\
        --dtype float32 --precision tf32 [--calls 8] [--grid 2x1]
    mpirun -np 2 python3 docs/scripts/operand_loop_probe.py --backend numpy \
        --modes auto,mpi --size 256 --calls 2    # a smoke test without GPUs
"""
import argparse
import statistics
import time

from mpi4py import MPI

from summa.algorithm import SummaStats, gemm
from summa.backend import get_backend
from summa.grid import ProcessGrid, grid_for
from summa.matrix import DistMatrix


def timed_loop(grid, backend, args, comm_mode, new_operands):
    """Per-call seconds (slowest rank) and peer blocks opened, over `args.calls` calls."""
    shape = (args.size, args.size)
    A = DistMatrix.random(shape, args.dtype, grid, backend, seed=1)
    B = DistMatrix.random(shape, args.dtype, grid, backend, seed=2)
    seconds, opened = [], []
    for i in range(args.calls + 1):  # the first call warms up (NCCL, cuBLAS): not counted
        if new_operands:
            B = DistMatrix.random(shape, args.dtype, grid, backend, seed=3 + i)
        backend.synchronize()
        grid.comm.Barrier()
        t0 = time.perf_counter()
        stats = SummaStats()
        C = gemm(A, B, broadcaster=comm_mode, precision=args.precision, stats=stats)
        backend.synchronize()
        elapsed = grid.comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
        del C
        if i:
            seconds.append(elapsed)
            opened.append(grid.comm.allreduce(stats.extra.get("opened_blocks", 0)))
    return seconds, opened, stats.comm


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=16384)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--precision", default=None)
    parser.add_argument("--calls", type=int, default=8)
    parser.add_argument("--grid", default=None, help="PRxPC (default: bench's)")
    parser.add_argument("--backend", default="cupy", help="numpy: a smoke test on CPUs")
    parser.add_argument("--modes", default="auto,nccl", help="broadcasters, comma-separated")
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    shape = (tuple(int(x) for x in args.grid.split("x")) if args.grid
             else grid_for(comm.Get_size(), args.size, args.size, args.backend, args.dtype))
    rows = []
    with ProcessGrid(comm, shape) as grid:
        backend = get_backend(args.backend, grid.local_rank)
        flops = 2.0 * args.size ** 3
        for new_operands in (False, True):
            for mode in args.modes.split(","):
                seconds, opened, used = timed_loop(grid, backend, args, mode, new_operands)
                rows.append(("new B" if new_operands else "same B", mode, used,
                             flops / min(seconds) / 1e12,
                             flops / statistics.median(seconds) / 1e12, sum(opened)))
    if comm.Get_rank() == 0:
        label = args.dtype + (f"/{args.precision}" if args.precision else "")
        print(f"N = {args.size}, {label}, grid {shape[0]}x{shape[1]}, {args.calls} calls per loop")
        print(f"{'loop':>7} {'comm':>5} {'used':>5} {'best TFLOP/s':>13} {'median':>8} "
              f"{'blocks opened':>14}")
        for loop, mode, used, best, median, opened in rows:
            print(f"{loop:>7} {mode:>5} {used:>5} {best:13.3f} {median:8.3f} {opened:14d}")


if __name__ == "__main__":
    main()
