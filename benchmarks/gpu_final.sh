#!/usr/bin/env bash
# The session's last device call, in one command (~8 minutes on an H200; each stage is skipped when the
# deadline is near): build for sm_90 (the bench_train dataset is written meanwhile), every CUDA test of the
# suite, the real train_dual.py runs of bench_train.py for yolov9-s and yolov9-c (c backend), and
# bench_step.py (eager vs CUDA-graph step). Logs go to one archive $OUT/logs.tgz, JSON lines to
# $OUT/rows.jsonl. Run from the repo root: bash benchmarks/gpu_final.sh [SECONDS]
set -uo pipefail
OUT=${OUT:-gpu_out}; mkdir -p "$OUT"
FINAL=$OUT; OUT=$(mktemp -d /tmp/gpufinal.XXXX)
trap 'cp "$OUT/rows.jsonl" "$OUT/pytest_cuda.log" "$FINAL/" 2>/dev/null; tar czf "$FINAL/logs.tgz" -C "$OUT" .' EXIT
export PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}
END=$(( $(date +%s) + ${1:-480} ))
left() { echo $(( END - $(date +%s) )); }
stage() {  # stage NAME NEED_SECONDS LIMIT_SECONDS command...: run when NEED seconds are left
  local name=$1 need=$2 lim=$3; shift 3
  if [ "$(left)" -lt "$need" ]; then echo "SKIP $name ($(left) s left)"; return; fi
  local t0=$(date +%s); timeout "$lim" "$@" > "$OUT/$name.log" 2>&1; local rc=$?
  echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; grep -h '^{' "$OUT/$name.log" >> "$OUT/rows.jsonl"
}
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc; python3 -V
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"; date -u
  git log -1 --format=%H 2>/dev/null; } > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
python3 benchmarks/bench_train.py --data-only --images 1024 --procs 12 > "$OUT/data.log" 2>&1 &
DATA=$!
t0=$(date +%s)
YOLOV9C_CUDA=1 YOLOV9C_CUDA_ARCHS=90 python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1
echo "build rc=$? $(( $(date +%s) - t0 )) s"; tail -3 "$OUT/build.log"
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
