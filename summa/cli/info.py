"""The ``info`` command: what summa sees (MPI library, ranks and nodes,
devices, the backend, broadcaster and GEMM settings it would use)."""

from __future__ import annotations

import socket

from ..runtime.mpi import MPI
from .. import __version__
from ..device.backend import (compute_priority, cublaslt_path, cupy_available, gemm_library,
                              transpose_a_setting, transpose_b_setting)
from ..distribution.grid import node_rank
from ..transports.comm import choose_comm, mpi_cuda_aware, nccl_available
from .common import COMM_MODES, agree_backend, versions

__all__ = ["add_parser", "run"]


def add_parser(sub) -> None:
    """``info``: what summa sees (MPI, ranks, devices, backend)."""
    info = sub.add_parser("info", help="MPI library, ranks per node, devices, backend",
                          description="Print what summa sees: MPI library, ranks, nodes, "
                                      "devices and the backend it would choose.")
    info.add_argument("--backend", choices=("auto", "numpy", "cupy"), default="auto",
                      help="backend to report (default auto)")
    info.add_argument("--comm", choices=COMM_MODES, default="auto",
                      help="broadcaster to report (default auto)")


def run(args, comm: MPI.Comm, out) -> int:
    """``summa info``: gather each rank's host and backend, print what rank 0 sees."""
    backend = agree_backend(comm, args.backend)
    local_rank, local_size = node_rank(comm)
    row = {"rank": comm.Get_rank(), "host": socket.gethostname(), "local_rank": local_rank,
           "backend": backend.describe()}
    rows = comm.gather(row, root=0)
    if comm.Get_rank() != 0:
        return 0
    hosts = sorted({r["host"] for r in rows})
    found = versions()
    print(f"summa {__version__} on Python {found['python']}, numpy {found['numpy']}, "
          f"mpi4py {found['mpi4py']}" + (f", cupy {found['cupy']}" if "cupy" in found
                                             else ""), file=out)
    print(f"MPI library: {found['mpi']} (MPI {'.'.join(map(str, MPI.Get_version()))})",
          file=out)
    print(f"ranks: {comm.Get_size()} on {len(hosts)} node(s), {local_size} on this node; "
          f"near-square grid {'x'.join(map(str, MPI.Compute_dims(comm.Get_size(), 2)))} "
          "(bench, multiply and plan choose by the product's shape and dtype)", file=out)
    print(f"backend: {backend.name}"
          + ("" if backend.is_gpu else
             f" ({'a GPU is visible' if cupy_available() else 'no GPU/CuPy visible'})"), file=out)
    nccl_ok, nccl_note = nccl_available() if backend.is_gpu else (False, "needs cupy")
    aware, aware_note = mpi_cuda_aware()
    print(f"NCCL: {'yes' if nccl_ok else 'no'} ({nccl_note}); CUDA-aware MPI: "
          f"{'yes' if aware else 'no'} ({aware_note})", file=out)
    chosen = choose_comm(args.comm, backend)
    if args.comm == "auto" and backend.is_gpu:
        chosen = (f"ipc in each direction whose grid rows (columns) lie within a node, a "
                  f"GPU per rank (self-tested; in memory where the GEMMs hide its set-up, "
                  f"and out of core), else {chosen}")
    print(f"broadcaster: {chosen} (--comm {args.comm})", file=out)
    library = gemm_library()
    if library == "cublaslt" and cublaslt_path():
        library += f" from {cublaslt_path()} (SUMMA_CUBLASLT)"
    print(f"GPU GEMM: {library} (SUMMA_GEMM), compute stream priority: "
          f"{compute_priority()} (SUMMA_COMPUTE_PRIORITY)"
          + ("" if backend.is_gpu else "; both apply to GPUs only"), file=out)
    setting = transpose_a_setting()
    print(f"A's panels copied transposed (read column-major): {setting} (SUMMA_TRANSPOSE_A"
          + ("; auto: float64 and float32 without TF32, on GPUs)" if setting == "auto" else ")"),
          file=out)
    setting = transpose_b_setting()
    print(f"B's panels that lie by columns copied row-major: {setting} (SUMMA_TRANSPOSE_B"
          + ("; auto: complex128 and float32 without TF32, on GPUs)" if setting == "auto"
             else ")"), file=out)
    for r in rows:
        print(f"  rank {r['rank']:>3} on {r['host']} (local rank {r['local_rank']}): "
              f"{r['backend']}", file=out)
    return 0

