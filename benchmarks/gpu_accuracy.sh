#!/usr/bin/env bash
# One device call of the real-dataset accuracy matrix (docs/fidelity.md "Real datasets"): yolov9-s from scratch,
# 640, batch 32, hyp.scratch-high, close-mosaic 15, --min-items 0 --cache ram, 60 epochs, seeds 0,1,2, ours
# (--backend torch, --backend c) and the published train_dual.py (.dev/published, when there), all runs at once:
#   bash benchmarks/gpu_accuracy.sh SECONDS NAME      e.g.  bash benchmarks/gpu_accuracy.sh 585 raccoon
# NAME's converted dataset is carried in .dev/data_accuracy/NAME (benchmarks/accuracy_datasets.py). The runs
# stop when the call has 120 s left (--time-limit; the rest validates best.pt files and copies): exit 3 means some
# are unfinished, and the same call again, made while the machine is still warm, resumes them from their last.pt
# in runs/acc-NAME (ignored by git, so kept between calls). NO_BUILD=1 skips the sm_90 build when the warm
# machine has it. ACC_SEEDS, ACC_EPOCHS, ACC_JOBS, ACC_FLAGS override the recipe's seeds, epochs and runs at
# once, or add flags. Returned: $OUT/acc-NAME.results.jsonl (every run, summary and compare line), $OUT/curves.png,
# the logs (each run's log and results.csv) in logs.tgz.
source "$(dirname "$0")/gpu_lib.sh" "${1:-585}"; shift
name=${1:?dataset name, e.g. raccoon}
data=.dev/data_accuracy/$name/data.yaml
[ -f "$data" ] || { echo "error: $data not found: carry the converted dataset (benchmarks/accuracy_datasets.py)"; exit 2; }
machine_info
[ -z "${NO_BUILD:-}" ] && build_sm90
pub=(); [ -f .dev/published/train_dual.py ] && pub=(--published .dev/published --python python3)
[ ${#pub[@]} -eq 0 ] && echo "note: no .dev/published/train_dual.py: the published runner is skipped"
acc=runs/acc-$name
stage accuracy 120 $(( $(left) - 10 )) python3 benchmarks/bench_accuracy.py --data "$data" --cfg yolov9-s --img 640 \
  --batch 32 --epochs ${ACC_EPOCHS:-60} --close-mosaic 15 --seeds ${ACC_SEEDS:-0,1,2} --backends torch,c \
  --jobs ${ACC_JOBS:-9} --workers 2 --time-limit $(( $(left) - 120 )) --out $acc ${ACC_FLAGS:-} "${pub[@]}"
tail -12 "$OUT/accuracy.log"
cp $acc/curves.png "$FINAL/" 2>/dev/null   # the runs' lines (the log's carry progress bars): results.jsonl
cp $acc/results.jsonl "$FINAL/acc-$name.results.jsonl" 2>/dev/null
cp $acc/*.log "$OUT/" 2>/dev/null
for d in $acc/train/*/; do cp "$d/results.csv" "$OUT/$(basename "$d").results.csv" 2>/dev/null; done
