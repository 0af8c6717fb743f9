#!/usr/bin/env bash
# --gpu-augment on the device machine (not yet run: no GPU lent on 2026-12-05). PARTS picks the stages, in this
# order, each skipped when the deadline is near (two 10-minute calls: PARTS="build tests loader" then
# PARTS="build train published"):
#   build      sm_90 build (the bench_train dataset is written meanwhile)
#   tests      the CUDA cases of tests/test_augment.py (kernel bytes = C reference) and test_augment_plan.py
#   loader     bench_dataloader.py at workers 4, 8, 16: the CPU pipeline vs the augment op on CUDA (img/s and
#              main-process CPU ms per image), then both with --cache ram
#   train      bench_train.py (the real train_dual.py, batch 64, 640, 1024 images) for yolov9-s and yolov9-c, c
#              backend, workers 4, 8, 16, without and with --gpu-augment
#   published  the published train_dual.py (in .dev/published, when carried) on the same data, workers 4, 8, 16
# Logs in $OUT/logs.tgz, JSON lines in $OUT/rows.jsonl. Run from the repo root:
#   PARTS="build tests loader" bash benchmarks/gpu_augment.sh 560
source "$(dirname "$0")/gpu_lib.sh" "${1:-560}"
PARTS=${PARTS:-"build tests loader train published"}
want() { [[ " $PARTS " == *" $1 "* ]]; }
machine_info
DATA_YAML=/tmp/yolov9c_bench_train/synthetic-1024-640-b40/data.yaml
python3 benchmarks/bench_train.py --data-only --images 1024 --procs 12 > "$OUT/data.log" 2>&1 &
DATA=$!
want build && build_sm90
if want tests; then
  stage pytest_augment 120 150 python3 -m pytest -q -p no:cacheprovider -rs tests/test_augment.py \
    tests/test_augment_plan.py
  tail -3 "$OUT/pytest_augment.log"
fi
if want loader; then
  for cache in "" "--cache ram"; do
    for w in 4 8 16; do
      for a in cpu-pipeline op-cuda; do
        stage "loader_${a}_w${w}${cache:+_ram}" 60 90 python3 benchmarks/bench_dataloader.py --workers $w --batch 64 \
          --imgsz 640 --batches 20 --augment $a $cache
      done
    done
  done
fi
wait $DATA; echo "data: $(tail -1 "$OUT/data.log")"
if want train; then
  for m in yolov9-s yolov9-c; do
    for w in 4 8 16; do
      stage "train_${m}_w${w}" 110 100 python3 benchmarks/bench_train.py --models $m --backends c --images 1024 \
        --workers $w --timeout 95
      stage "train_${m}_w${w}_gpuaug" 110 100 python3 benchmarks/bench_train.py --models $m --backends c \
        --images 1024 --workers $w --gpu-augment --timeout 95
    done
  done
fi
if want published && [ -d .dev/published ]; then
  for m in yolov9-s yolov9-c; do
    for w in 4 8 16; do
      stage "published_${m}_w${w}" 120 110 bash -c "cd .dev/published && python3 train_dual.py --data $DATA_YAML \
        --cfg models/detect/${m}.yaml --hyp data/hyps/hyp.scratch-high.yaml --batch-size 64 --img 640 --epochs 1 \
        --workers $w --device 0 --project /tmp/pub_runs --name ${m}_w${w} --exist-ok"
    done
  done
fi
echo "done, $(left) s left"
