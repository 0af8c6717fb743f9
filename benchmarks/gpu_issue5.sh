#!/usr/bin/env bash
# Issue 5 on the device machine, one script, < 9 minutes on an H200: build yolov9c._C for sm_90, run the CUDA
# tests of bn_silu, the c backend and the memory contract, the training-step memory benchmark (yolov9-s and
# yolov9-c, batch 64, 640: torch NCHW / channels-last / --ckpt, c channels-last / NCHW), and one short
# train_dual.py run with the default backend (c on CUDA). Everything goes to $OUT (or ./gpu_out):
#   machine.txt, build.log, pytest_cuda.log, bench_memory.jsonl (+ .err, .md: the RESULTS.md table),
#   train_c/ (results.csv, opt.yaml, the console log).
# Time caps: build ~1 min, tests 150 s, benchmark 300 s, training 60 s (under the 10-minute command limit).
# Run from the repo root on the CUDA machine: bash benchmarks/gpu_issue5.sh
set -uo pipefail
OUT=${OUT:-gpu_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 YOLOV9C_CACHE=/tmp/yolov9c_cache PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}
T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc; python3 -V
  python3 -c "import torch, numpy, cv2; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'numpy', numpy.__version__, 'cv2', cv2.__version__)"
  git rev-parse --short HEAD 2>/dev/null; git log -1 --format=%s 2>/dev/null; date -u; } > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"

# 1. build (sm_90 only: the H200; warnings are errors as in CI)
YOLOV9C_CUDA=1 YOLOV9C_CUDA_ARCHS=90 YOLOV9C_WERROR=1 python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1
el "build rc=$?"
python3 -c "import yolov9c._C as C; print(C.build_info())" || { el "extension not importable: stop"; exit 1; }

# 2. CUDA tests (the CPU cases of these files run in CI)
TESTS=$(ls tests/test_bn_silu.py tests/test_backend*.py tests/test_memory_contract.py 2>/dev/null)
timeout 150 python3 -m pytest -q -p no:cacheprovider -m cuda -rs -s $TESTS > "$OUT/pytest_cuda.log" 2>&1
el "pytest (cuda cases of $(echo $TESTS)) rc=$?"; tail -3 "$OUT/pytest_cuda.log"
grep -oE "(conv_stack|gelan): torch: .*" "$OUT/pytest_cuda.log"  # the measured B/elt of the memory contract

# 3. training-step memory benchmark: 10 configurations, each in its own process
timeout 300 python3 benchmarks/bench_memory.py --models yolov9-s yolov9-c --batch 64 --img 640 --boxes 20 \
  --steps 10 --warmup 3 --timeout 120 2>>"$OUT/bench_memory.err" | tee "$OUT/bench_memory.jsonl"
el "bench_memory rc=$?"
python3 benchmarks/bench_memory.py --table "$OUT/bench_memory.jsonl" | tee "$OUT/bench_memory.md"

# 4. train_dual.py with the default backend on CUDA (c, channels-last, AMP): one short epoch on synthetic data
mkdir -p "$OUT/train_c"
timeout 60 python3 train_dual.py --cfg yolov9-s.yaml --batch 32 --img 320 --epochs 1 --device 0 --workers 8 \
  --noplots --noval --project /tmp/yolov9c_runs --name c --exist-ok > "$OUT/train_c/console.log" 2>&1
el "train_dual (default backend) rc=$?"
cp /tmp/yolov9c_runs/c/results.csv /tmp/yolov9c_runs/c/opt.yaml "$OUT/train_c/" 2>/dev/null
grep -E "^backend:" "$OUT/train_c/console.log"; tail -2 "$OUT/train_c/console.log"
el "done"
