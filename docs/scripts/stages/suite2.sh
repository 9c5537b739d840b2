# STAGE=suite2 docs/scripts/gpu_session.sh
# the MPI tests on 2 GPUs, file by file (~3 min)
    mpi_tests 2
