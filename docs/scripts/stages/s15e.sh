# STAGE=s15e docs/scripts/gpu_session.sh
# session 15, second call: cuBLAS's emulation ran native DGEMM in s15b (same bits, 50 TFLOP/s);
# again with summa's scratch returned to the device first and, if it still declines, a 16 GiB
# workspace of its own; then the out-of-core cuts (STAGE=s15d)
    LIMIT=100 run python3 docs/scripts/ozaki_probe.py --sizes 32768 --moduli auto --repeat 2 \
        --json "$OUT/ozaki.jsonl"
    . docs/scripts/stages/s15d.sh
