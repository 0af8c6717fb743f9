#!/usr/bin/env bash
# Issue 11 on the device machine, one call (~6 minutes on an H200, each stage skipped when the deadline is near):
# build for sm_90 (the benchmark dataset is written meanwhile), the CUDA cases of the recompute / planner /
# memory-contract tests, memory timelines (mem_timeline.py), the real train_dual.py runs (bench_train.py),
# the planner's measured points (bench_plan.py), the CUDA cases of test_backend_c.py.
# Logs go to one archive $OUT/logs.tgz (the device tool returns at most 8 files), the JSON lines to
# $OUT/rows.jsonl. Run from the repo root: bash benchmarks/gpu_issue11.sh [SECONDS]
source "$(dirname "$0")/gpu_lib.sh" "${1:-360}"
machine_info
python3 benchmarks/bench_train.py --data-only --images 1024 --procs 12 > "$OUT/data.log" 2>&1 &
DATA=$!
build_sm90
stage pytest_cuda 200 80 python3 -m pytest -q -p no:cacheprovider -m cuda -s tests/test_backend_pgi.py \
  tests/test_memory_plan.py tests/test_memory_contract.py
tail -3 "$OUT/pytest_cuda.log"
stage tl_s_after 180 40 python3 benchmarks/mem_timeline.py --model yolov9-s --warmup 1 --markdown
stage tl_s_before 170 40 python3 benchmarks/mem_timeline.py --model yolov9-s --warmup 1 --stored --float --markdown
stage tl_c_after 160 50 python3 benchmarks/mem_timeline.py --model yolov9-c --warmup 1 --markdown
wait $DATA; echo "data: $(tail -1 "$OUT/data.log")"
for m in yolov9-s yolov9-c yolov9-e; do
  stage "train_c_${m}" 110 100 python3 benchmarks/bench_train.py --models $m --backends c --images 1024 --timeout 95
done
stage plan_c 90 80 python3 benchmarks/bench_plan.py --models yolov9-s yolov9-c yolov9-e --backends c --batches 16 64
stage plan_torch 60 60 python3 benchmarks/bench_plan.py --models yolov9-s yolov9-c --backends torch --batches 16 64
for m in yolov9-s yolov9-c; do
  stage "train_torch_${m}" 45 60 python3 benchmarks/bench_train.py --models $m --backends torch --images 1024 --timeout 55
done
stage tl_c_before 40 40 python3 benchmarks/mem_timeline.py --model yolov9-c --warmup 1 --stored --float --markdown
stage pytest_backend_c 40 60 python3 -m pytest -q -p no:cacheprovider -m cuda tests/test_backend_c.py
tail -2 "$OUT/pytest_backend_c.log" 2>/dev/null
stage tl_e_after 35 45 python3 benchmarks/mem_timeline.py --model yolov9-e --warmup 1 --markdown
stage train_torch_yolov9-e 60 60 python3 benchmarks/bench_train.py --models yolov9-e --backends torch --images 1024 --timeout 55
echo "done, $(left) s left"
