# STAGE=big32auto docs/scripts/gpu_session.sh
# issue 5: N = 100,000 float32 host-resident under a 16 GiB cap with auto (ipc)
    hundred_k_f32 | grep -a -E "x 100000|summa bench|tiles|memory plan|rank   [01]"
