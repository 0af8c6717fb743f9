#!/usr/bin/env bash
# The session's last device call, in one command (~8 minutes on an H200; each stage is skipped when the
# deadline is near): build for sm_90 (the bench_train dataset is written meanwhile), every CUDA test of the
# suite, the real train_dual.py runs of bench_train.py for yolov9-s and yolov9-c (c backend), and
# bench_step.py (eager vs CUDA-graph step). Logs go to one archive $OUT/logs.tgz, JSON lines to
# $OUT/rows.jsonl. Run from the repo root: bash benchmarks/gpu_final.sh [SECONDS]
source "$(dirname "$0")/gpu_lib.sh" "${1:-480}"
machine_info
python3 benchmarks/bench_train.py --data-only --images 1024 --procs 12 > "$OUT/data.log" 2>&1 &
DATA=$!
build_sm90
stage pytest_cuda 300 240 python3 -m pytest -q -p no:cacheprovider -m cuda tests
tail -15 "$OUT/pytest_cuda.log"
wait $DATA; echo "data: $(tail -1 "$OUT/data.log")"
for m in yolov9-s yolov9-c; do
  stage "train_c_${m}" 100 95 python3 benchmarks/bench_train.py --models $m --backends c --images 1024 --timeout 90
done
stage step 70 110 python3 benchmarks/bench_step.py --models yolov9-s --backends c torch --steps 10 --warmup 5 \
  --profile 0 --timeout 100
cat "$OUT/rows.jsonl" 2>/dev/null
echo "done, $(left) s left"
