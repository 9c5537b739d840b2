# STAGE=ipcopen docs/scripts/gpu_session.sh
# issue 3: the cost of opening a peer's memory against its size (ipc's set-up)
    LIMIT=60 run $MPI -np 2 python3 docs/scripts/ipc_open_probe.py
