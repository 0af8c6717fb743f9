#!/usr/bin/env bash
# One device call of named parts, in the order given (each skipped when the deadline is near):
#   bash benchmarks/gpu_round.sh SECONDS PART...     e.g.  bash benchmarks/gpu_round.sh 560 guards train_s_c cuda
# Parts: guards (the CUDA guard and graph-step tests, long tracebacks), cuda (every CUDA test), train_M_B (the real
# train_dual.py of bench_train.py, M in s/c/e, B in c/torch, 1024 images), step (bench_step.py, yolov9-s and
# yolov9-c, both backends, eager and graph), accuracy (bench_accuracy.py; the published code in .dev/published
# when present). Build for sm_90 first; the bench_train dataset is written meanwhile. Run from the repo root.
source "$(dirname "$0")/gpu_lib.sh" "${1:-480}"; shift
machine_info
python3 benchmarks/bench_train.py --data-only --images 1024 --procs 12 > "$OUT/data.log" 2>&1 &
DATA=$!
build_sm90
PYT="python3 -m pytest -q -p no:cacheprovider -m cuda -rf"
for part in "$@"; do
  case $part in
    guards) stage guards 120 150 $PYT --tb=long tests/test_train_guards_cuda.py tests/test_graph_step.py
            tail -40 "$OUT/guards.log" ;;
    cuda) stage cuda 240 300 $PYT --tb=short tests; tail -25 "$OUT/cuda.log" ;;
    train_*) wait $DATA
      m=${part#train_}; b=${m#*_}; m=yolov9-${m%_*}
      stage "$part" 150 240 python3 benchmarks/bench_train.py --models $m --backends $b --images 1024 --timeout 230 \
        --root /tmp/yolov9c_bench_train
      tail -1 "$OUT/$part.log"; cp /tmp/yolov9c_bench_train/logs/*.log "$OUT/" 2>/dev/null
      grep -h "AMP:\|skipped\|WARNING\|GPU_mem" /tmp/yolov9c_bench_train/logs/$m-$b-*.log | head -5 ;;
    step) stage step 150 240 python3 benchmarks/bench_step.py --models ${STEP_MODELS:-yolov9-s yolov9-c} --backends c torch --steps 10 \
            --warmup 5 --profile 0 --timeout 110 --markdown; tail -8 "$OUT/step.log" ;;
    accuracy) pub=(); [ -d .dev/published ] && pub=(--published .dev/published --python python3)
      stage accuracy 300 540 python3 benchmarks/bench_accuracy.py --epochs ${ACC_EPOCHS:-30} --seeds ${ACC_SEEDS:-0,1} \
        --out /tmp/acc "${pub[@]}"; tail -6 "$OUT/accuracy.log" ;;
    probe) stage probe 30 60 python3 -c "import importlib.util as u; print({m: bool(u.find_spec(m)) for m in
            ('torchvision', 'pandas', 'seaborn', 'scipy', 'thop', 'psutil', 'tensorboard', 'IPython')})"
            cat "$OUT/probe.log" ;;
    *) echo "unknown part $part" ;;
  esac
done
echo "done, $(left) s left"
