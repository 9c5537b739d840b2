"""What does opening a peer's GPU memory (CUDA IPC) cost, against its size?

The ipc broadcaster opens the peers' operand blocks once per multiply; on
2 H200s that took 19-22 ms for blocks of 1-4 GiB, but seemed fast for a
256 MiB block. Rank 1 exports allocations of several sizes; rank 0 opens and
closes each a few times. Prints one row per size (milliseconds).

    mpirun -np 2 python3 docs/scripts/ipc_open_probe.py [MiB ...]
"""
import sys
import time

import cupy
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
cupy.cuda.Device(rank % cupy.cuda.runtime.getDeviceCount()).use()
rt = cupy.cuda.runtime
sizes = [int(s) for s in sys.argv[1:]] or [64, 256, 512, 1024, 2048, 4096]
rows = []
for mib in sizes:
    mem = cupy.cuda.Memory(mib << 20) if rank == 1 else None
    handle = comm.bcast(rt.ipcGetMemHandle(mem.ptr) if rank == 1 else None, root=1)
    opens, closes = [], []
    if rank == 0:
        for _ in range(3):
            t0 = time.perf_counter()
            ptr = rt.ipcOpenMemHandle(handle)
            t1 = time.perf_counter()
            rt.ipcCloseMemHandle(ptr)
            t2 = time.perf_counter()
            opens.append((t1 - t0) * 1e3)
            closes.append((t2 - t1) * 1e3)
    comm.Barrier()  # rank 1 frees only after rank 0 has closed
    del mem
    rows.append((mib, opens, closes))
if rank == 0:
    print(f"{'MiB':>6}  {'open ms (3 tries)':>24}  {'close ms (3 tries)':>24}")
    for mib, opens, closes in rows:
        print(f"{mib:>6}  {' '.join(f'{x:7.2f}' for x in opens):>24}  "
              f"{' '.join(f'{x:7.2f}' for x in closes):>24}")
