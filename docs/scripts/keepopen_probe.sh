export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONPATH=$PWD
for size in 16384 8192; do
for dtype in "float32 --precision tf32" "float16" "float32" "float64"; do
  for mode in kept nccl; do
    comm=ipc; pre="import summa.ipc as i; i.IpcBroadcaster.release_local = lambda self: setattr(self, '_sources', []); "
    [ $mode = nccl ] && comm=nccl && pre=""
    echo "== $size $dtype $mode"
    timeout 60 mpirun --oversubscribe -np 2 python3 -c "import sys; ${pre}from summa.__main__ import main; sys.exit(main())" bench --backend cupy --size $size --dtype $dtype --comm $comm --repeat 5 --timeout 30 --check --json $OUT/keep-$mode.jsonl < /dev/null 2>&1 | grep -a -E "x $size|rank   0"
  done
done; done
