#!/usr/bin/env bash
# One device-machine session: build yolov9c._C with CUDA (all default arches), run the whole test suite (the
# CUDA cases run there instead of skipping), then the loader and NMS benchmarks. Logs and JSON lines go to
# $OUT (or ./gpu_out). Run on a CUDA machine from the repo root: bash benchmarks/gpu_session.sh
set -uo pipefail
OUT=${OUT:-gpu_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 YOLOV9C_CACHE=/tmp/yolov9c_cache
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc; python3 -V
  python3 -c "import torch, numpy, cv2; print('torch', torch.__version__, 'numpy', numpy.__version__, 'cv2', cv2.__version__)"
  git rev-parse --short HEAD 2>/dev/null; date -u; } > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
t0=$(date +%s)
python3 -m pip install -q -e ".[test]" --no-build-isolation --no-deps > "$OUT/build.log" 2>&1; echo "build rc=$? $(( $(date +%s) - t0 )) s"
python3 -c "import yolov9c._C as C; print(C.build_info())"
t0=$(date +%s)
timeout 330 python3 -m pytest -q -p no:cacheprovider tests > "$OUT/pytest.log" 2>&1; echo "pytest rc=$? $(( $(date +%s) - t0 )) s"
tail -3 "$OUT/pytest.log"
for w in ${LOADER_WORKERS:-8 16}; do
  timeout 150 python3 benchmarks/bench_dataloader.py --workers "$w" --batch 64 --imgsz 640 --batches 64 --warmup 16 \
    2>>"$OUT/bench_dataloader.err" | tee -a "$OUT/bench_dataloader.jsonl"
done
