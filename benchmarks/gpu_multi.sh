#!/usr/bin/env bash
# The 2-GPU device call (nvidia-h200-x2, < 9.5 minutes): build for sm_90; train yolov9-s on coco128 with both
# backends at once (torch on GPU 0, c on GPU 1, same seed and flags) for the accuracy comparison in
# benchmarks/RESULTS.md; then the multi-GPU tests (train_dual.py --device 0,1 self-launching DDP over NCCL) and a
# torchrun NCCL run of the c backend. Everything goes to $OUT (or ./gpu_out).
# Run from the repo root on a 2-GPU machine: bash benchmarks/gpu_multi.sh
set -uo pipefail
OUT=${OUT:-gpu_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 YOLOV9C_CACHE=/tmp/yolov9c_cache PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc; python3 -V
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
  git rev-parse --short HEAD 2>/dev/null; date -u; } > "$OUT/machine.txt" 2>&1; cat "$OUT/machine.txt"
YOLOV9C_CUDA=1 YOLOV9C_CUDA_ARCHS=90 YOLOV9C_WERROR=1 python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1
el "build rc=$?"; python3 -c "import yolov9c._C as C; print(C.build_info())" || exit 1
DATA=shared/data/coco128/data.yaml
ARGS="--data $DATA --cfg yolov9-s.yaml --img ${IMG:-416} --batch 16 --epochs ${EPOCHS:-50} --workers 8 --seed 0 --noplots --project /tmp/runs --exist-ok"
for b in torch c; do
  dev=$([ $b = torch ] && echo 0 || echo 1)
  timeout ${TRAIN_S:-400} python3 train_dual.py $ARGS --backend $b --device $dev --name $b > "$OUT/train_$b.log" 2>&1 &
done
wait; el "coco128 runs done"
for b in torch c; do
  cp /tmp/runs/$b/results.csv "$OUT/results_$b.csv" 2>/dev/null; tail -c 1500 "$OUT/train_$b.log" | tail -6
done
timeout 120 python3 -m pytest -q -p no:cacheprovider -m cuda -rs tests/test_train_ddp.py > "$OUT/pytest_ddp.log" 2>&1
el "pytest -m cuda test_train_ddp rc=$?"; tail -3 "$OUT/pytest_ddp.log"
timeout 90 torchrun --nproc_per_node 2 train_dual.py --cfg yolov9-s.yaml --img 320 --batch 32 --epochs 1 --workers 4 \
  --backend c --noplots --project /tmp/runs --name ddp_c --exist-ok > "$OUT/torchrun_c.log" 2>&1
el "torchrun NCCL --backend c rc=$?"; tail -4 "$OUT/torchrun_c.log"
