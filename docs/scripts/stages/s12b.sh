# STAGE=s12b docs/scripts/gpu_session.sh
# issue 25: the INT8 GPU tests, the fused product's rates, phases and errors
# against native DGEMM and cuBLAS's emulation, then through SUMMA (bench)
    LIMIT=150 SUMMA_TEST_BACKEND=cupy run python3 -m pytest -q -p no:cacheprovider --with-mpi \
        tests/test_gpu.py -k "int8"
    LIMIT=240 run python3 docs/scripts/ozaki_probe.py --sizes ${SIZES:-16384,32768} \
        --json "$OUT/ozaki.jsonl"
    for args in "--precision default" "--precision fp64-int8" "--precision fp64-int8 --nb 32768" \
                "--precision fp64-int8 --out-of-core --device-memory 48GiB"; do
        LIMIT=90 run python3 -m summa bench --backend cupy --size 32768 --dtype float64 $args \
            --check --repeat 2 --no-ideal --json "$OUT/bench.jsonl"
    done
