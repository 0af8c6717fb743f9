#!/usr/bin/env bash
# Issue 11 on the device machine, one call (~6 minutes on an H200, each stage skipped when the deadline is near):
# build for sm_90 (the benchmark dataset is written meanwhile), the CUDA cases of the recompute / planner /
# memory-contract tests, memory timelines (mem_timeline.py), the real train_dual.py runs (bench_train.py),
# the planner's measured points (bench_plan.py), the CUDA cases of test_backend_c.py.
# Logs go to one archive $OUT/logs.tgz (the device tool returns at most 8 files), the JSON lines to
# $OUT/rows.jsonl. Run from the repo root: bash benchmarks/gpu_issue11.sh [SECONDS]
set -uo pipefail
OUT=${OUT:-gpu_out}; mkdir -p "$OUT"
FINAL=$OUT; OUT=$(mktemp -d /tmp/gpu11.XXXX)
trap 'cp "$OUT/rows.jsonl" "$FINAL/" 2>/dev/null; tar czf "$FINAL/logs.tgz" -C "$OUT" .' EXIT
export PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}
END=$(( $(date +%s) + ${1:-360} ))
left() { echo $(( END - $(date +%s) )); }
stage() {  # stage NAME NEED_SECONDS LIMIT_SECONDS command...: run when NEED seconds are left
  local name=$1 need=$2 lim=$3; shift 3
  if [ "$(left)" -lt "$need" ]; then echo "SKIP $name ($(left) s left)"; return; fi
  local t0=$(date +%s); timeout "$lim" "$@" > "$OUT/$name.log" 2>&1; local rc=$?
  echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; grep -h '^{' "$OUT/$name.log" >> "$OUT/rows.jsonl"
}
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc; python3 -V
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"; date -u; } > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
python3 benchmarks/bench_train.py --data-only --images 1024 --procs 12 > "$OUT/data.log" 2>&1 &
DATA=$!
t0=$(date +%s)
YOLOV9C_CUDA=1 YOLOV9C_CUDA_ARCHS=90 python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1
echo "build rc=$? $(( $(date +%s) - t0 )) s"
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
