# STAGE=report1 docs/scripts/gpu_session.sh
# issue 3's report table with today's code: report1 the N = 16384 lines of
# docs/scripts/report_runs.txt, report2 the N = 32768 ones (each under 10 min)
    size=16384; [ "$STAGE" = report2 ] && size=32768
    grep -- "--size $size" docs/scripts/report_runs.txt | while read -r line; do
        set -- $line
        LIMIT=90 run $MPI -np "$1" python3 -m summa bench --backend cupy "${@:2}" --timeout 60 \
            --json "$OUT/report.jsonl" | grep -a -E "x $size|efficiency"
    done
