#!/usr/bin/env bash
# Issue 6 on the device machine (< 6 minutes on an H200): build yolov9c._C with CUDA for sm_90, run the CUDA
# cases of the assigner and loss ops (tests/test_tal_assign.py, tests/test_det_loss.py, tests/test_loss_c.py,
# tests/test_loss.py), then benchmarks/bench_loss.py (batch 64, 640, nc 80, fp16 dual-head outputs, 20/160/1000
# boxes per image, torch vs c). Logs and JSON lines go to $OUT (or ./gpu_out).
# Run from the repo root: bash benchmarks/gpu_issue6.sh
set -uo pipefail
OUT=${OUT:-gpu_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc; python3 -V
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
  git rev-parse --short HEAD 2>/dev/null; date -u; } > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
t0=$(date +%s)
YOLOV9C_CUDA=1 YOLOV9C_CUDA_ARCHS=90 YOLOV9C_WERROR=1 python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1
echo "build rc=$? $(( $(date +%s) - t0 )) s"
python3 -c "import yolov9c._C as C; print(C.build_info())"
files=""
for f in tests/test_tal_assign.py tests/test_det_loss.py tests/test_loss_c.py tests/test_loss.py; do
  [ -f "$f" ] && files="$files $f"
done
t0=$(date +%s)
# CUDA cases first (they are what this machine is for), then the CPU cases of the same files once more here
timeout 150 python3 -m pytest -q -p no:cacheprovider -m cuda $files > "$OUT/pytest_cuda.log" 2>&1
echo "pytest cuda rc=$? $(( $(date +%s) - t0 )) s"; tail -3 "$OUT/pytest_cuda.log"
t0=$(date +%s)
YOLOV9C_SYNC=1 timeout 60 python3 -m pytest -q -p no:cacheprovider -m cuda tests/test_det_loss.py > "$OUT/pytest_cuda_sync.log" 2>&1
echo "pytest det_loss YOLOV9C_SYNC=1 rc=$? $(( $(date +%s) - t0 )) s"; tail -1 "$OUT/pytest_cuda_sync.log"
t0=$(date +%s)
timeout 200 python3 benchmarks/bench_loss.py --batch 64 --imgsz 640 --nc 80 --boxes 20 160 1000 --reps 10 --warmup 3 \
  --markdown > "$OUT/bench_loss.txt" 2> "$OUT/bench_loss.err"
echo "bench_loss rc=$? $(( $(date +%s) - t0 )) s"
grep '^{' "$OUT/bench_loss.txt" > "$OUT/bench_loss.jsonl"; sed -n '/^batch/,$p' "$OUT/bench_loss.txt"
