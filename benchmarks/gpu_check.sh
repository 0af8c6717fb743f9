#!/usr/bin/env bash
# Quick device-machine check of every CUDA op (< 9 minutes on an H200): build for sm_90, run every CUDA test
# case of the suite, then a yolov9-s training-step memory benchmark (torch NCHW / channels-last, c) and the
# loss benchmark. Everything goes to $OUT (or ./gpu_out). Run from the repo root: bash benchmarks/gpu_check.sh
set -uo pipefail
OUT=${OUT:-gpu_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 YOLOV9C_CACHE=/tmp/yolov9c_cache PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc; python3 -V
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
  git rev-parse --short HEAD 2>/dev/null; date -u; } > "$OUT/machine.txt" 2>&1; cat "$OUT/machine.txt"
YOLOV9C_CUDA=1 YOLOV9C_CUDA_ARCHS=90 YOLOV9C_WERROR=1 python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1
el "build rc=$?"; python3 -c "import yolov9c._C as C; print(C.build_info())" || { tail -30 "$OUT/build.log"; exit 1; }
timeout ${TEST_S:-240} python3 -m pytest -q -p no:cacheprovider -m cuda -rs -x --maxfail=20 tests > "$OUT/pytest_cuda.log" 2>&1
el "pytest -m cuda rc=$?"; grep -E "FAILED|ERROR|passed|failed" "$OUT/pytest_cuda.log" | tail -25
grep -oE "(conv_stack|gelan): torch: .*" "$OUT/pytest_cuda.log"
timeout ${MEM_S:-170} python3 benchmarks/bench_memory.py --models ${MODELS:-yolov9-s} --configs ${CONFIGS:-torch-nchw torch-cl c-cl c-nchw} \
  --batch 64 --img 640 --boxes 20 --steps 10 --warmup 3 --timeout 80 2>>"$OUT/bench_memory.err" | tee "$OUT/bench_memory.jsonl"
el "bench_memory rc=$?"; python3 benchmarks/bench_memory.py --table "$OUT/bench_memory.jsonl" | tee "$OUT/bench_memory.md"
tail -20 "$OUT/bench_memory.err"
timeout ${LOSS_S:-90} python3 benchmarks/bench_loss.py --batch 64 --imgsz 640 --nc 80 --boxes 20 160 1000 --reps 10 --warmup 3 \
  --markdown > "$OUT/bench_loss.txt" 2> "$OUT/bench_loss.err"
el "bench_loss rc=$?"; cat "$OUT/bench_loss.txt" | tail -12; tail -5 "$OUT/bench_loss.err"
