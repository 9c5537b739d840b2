# STAGE=big32 docs/scripts/gpu_session.sh
# issue 5: N = 100,000 float32, host-resident, 16 GiB device cap, 2 GPUs
    hundred_k_f32
