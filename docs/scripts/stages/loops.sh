# STAGE=loops docs/scripts/gpu_session.sh
# blocks kept open: a loop over the same B against one making a new B every call,
# auto against nccl (docs/scripts/operand_loop_probe.py); first the GPU tests that cover
# ipc's release and free (readers close before the barrier; free's barrier does not block)
    TEST_FILES="tests/test_gpu.py tests/test_algorithm.py" mpi_tests 2
    for args in "--size 16384 --dtype float32 --precision tf32" "--size 8192 --dtype float16" \
                "--size 8192 --dtype float64" "--size 16384 --dtype float64"; do
        LIMIT=90 run $MPI -np 2 python3 docs/scripts/operand_loop_probe.py $args --calls 8
    done
