#!/bin/bash
# summa on SLURM: one rank per GPU, NODES nodes of GPUS_PER_NODE GPUs.
#   sbatch --nodes=2 docs/examples/slurm.sh multiply A.npy B.npy -o C.npy
#   sbatch --nodes=8 docs/examples/slurm.sh bench --size 65536 --check --json results.jsonl
#SBATCH --job-name=summa
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=8          # = GPUs per node: one rank binds to one GPU
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=8            # cores for each rank's host work
#SBATCH --time=00:30:00
#SBATCH --output=summa-%j.out

set -euo pipefail
module load python cuda openmpi 2>/dev/null || true   # site-specific: Python with mpi4py, cupy
export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-1}

# NCCL between nodes: pick the InfiniBand HCAs and the interface for bootstrap.
export NCCL_IB_HCA=${NCCL_IB_HCA:-mlx5}
export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-ib0}
# UCX (Open MPI's transport): use the fabric, not TCP.
export UCX_TLS=${UCX_TLS:-rc,sm,self}
# Keep NVLink multicast off where the site requires it (shared GPU hosts).
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
# On a single node (every grid row and column inside it), --comm auto copies panels
# between the GPUs with CUDA IPC; in a container that needs a shared IPC namespace
# (e.g. --ipc=host), else summa falls back to NCCL by itself. --comm nccl opts out.

# summa binds each rank to GPU (node-local rank % GPUs per node); srun must not
# hide the other GPUs from a rank, so no --gpu-bind here.
srun --mpi=pmix python -m summa "$@" --timeout 900
