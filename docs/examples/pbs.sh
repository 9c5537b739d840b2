#!/bin/bash
# summa on PBS Pro: one rank per GPU.
#   qsub -l select=2:ncpus=64:ngpus=8:mpiprocs=8 -v ARGS="bench --size 65536" docs/examples/pbs.sh
#PBS -N summa
#PBS -l select=1:ncpus=64:ngpus=8:mpiprocs=8
#PBS -l walltime=00:30:00
#PBS -j oe

set -euo pipefail
cd "$PBS_O_WORKDIR"
module load python cuda openmpi 2>/dev/null || true
NRANKS=$(wc -l < "$PBS_NODEFILE")
export OMP_NUM_THREADS=8 NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
# On a single node (every grid row and column inside it), --comm auto copies panels
# between the GPUs with CUDA IPC; in a container that needs a shared IPC namespace
# (e.g. --ipc=host), else summa falls back to NCCL by itself. --comm nccl opts out.
# Each rank's host copies and file reads run on threads: 8 cores per rank (Open MPI
# would otherwise bind ranks to a socket, or to one core when it starts two or fewer).
mpiexec -n "$NRANKS" --hostfile "$PBS_NODEFILE" --map-by ppr:8:node:PE=8 \
    -x OMP_NUM_THREADS -x NCCL_NVLS_ENABLE \
    python -m summa ${ARGS:-bench --check} --timeout 900
