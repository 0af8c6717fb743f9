#!/usr/bin/env bash
# gpu_run.sh — one device-machine call: build yolov9c._C for the H200, run the CUDA tests and the named
# benchmarks, in the order given. Run from the repo root:
#     bash dev/gpu_run.sh build tests step memory train
# Each part writes $OUT/<part>.log (OUT defaults to ./gpu_out); every JSON line a part prints is appended to
# $OUT/rows.jsonl; $OUT/machine.txt says which GPU, driver, torch and commit. A part is skipped when fewer
# seconds than it needs are left of GPU_SECONDS (default 570, under the 10-minute command limit).
# Parts:
#   build      YOLOV9C_CUDA_ARCHS=90 python setup.py build_ext --inplace (warnings are errors, as in CI)
#   tests      every CUDA test case of the suite (pytest -m cuda tests; TESTS="tests/ops/test_x.py ..." narrows it)
#   cudasuite  the whole CUDA suite (pytest -m cuda) in five groups; a group finished in an earlier call on the
#              warm machine is skipped (runs/cuda_suite/done), so repeating the call runs the rest;
#              CUDA_GROUPS="graph train rest" runs only those (of: ops loss_backends graph train rest)
#   kernels    the CUDA tests of the ops (bn_silu, det_loss, tal_assign, nms, pool, bindings)
#   guards     the CUDA-graph step and training-guard tests, long tracebacks
#   step       bench_step.py: yolov9-s and yolov9-c (STEP_MODELS), both backends, batch 64 (STEP_BATCH), 640; the
#              training paths STEP_PATHS (default fixed; e.g. "fixed micro rect multiscale partial ckpt") and
#              STEP_GRAPH_SHAPES=0 for --no-graph-shapes in the graph rows (default: keyed by shape, as the trainer);
#              STEP_MODES=eager: eager rows only; STEP_HOST_PROFILE=N: N steps under cProfile (host time by function);
#              STEP_BACKENDS=torch: one backend's rows (default "c torch")
#   memory     bench_memory.py: peak memory per configuration (MEM_MODELS, MEM_CONFIGS), markdown rows
#   train      bench_train.py: the real train_dual.py, yolov9-s and yolov9-c (TRAIN_MODELS), c and torch
#              (TRAIN_BACKENDS), 1024 generated images (written while the module builds)
#   capped     bench_train.py, the whole real run under a card's cap (--mem-cap): yolov9-s/c/e (CAP_MODELS), c
#              backend, batch 64, 640, 2 epochs with validation, capped at CAP_SPEC (default 7.0 / 14.0 / 22.0 GiB:
#              8 / 16 / 24 GB cards), then uncapped (CAP_BASE=0 skips): img/s, validation batch, peaks by phase, the
#              card's largest memory.used (nvidia-smi every 0.2 s)
#              and the planner's prediction of them; CAP_VAL_CHUNKS=auto|off: train_dual.py --val-chunks (unset:
#              not passed); CAP_MEM_BUDGET=auto: the capped runs plan from the cap with --mem-budget auto
#   loss       bench_loss.py: the detection loss at 20, 160, 1000 boxes per image
#   bn         bench_bn_silu.py (BN_FLAGS, e.g. "--kernels --shapes 64,512,40,40")
#   pool       bench_pool.py
#   nms        bench_nms.py (CUDA and CPU, 1000 to 30000 boxes)
#   loader     bench_dataloader.py at 8 and 16 workers (LOADER_WORKERS), batch 64, 640
#   published  bench_published_step.py against the published code in .dev/published (skipped without it)
#   accuracy   bench_accuracy.py on coco128 (ACC_SEEDS, ACC_EPOCHS, ACC_FLAGS)
#   realacc    the real-dataset accuracy matrix (docs/fidelity.md "Real datasets") on ACC_NAME (raccoon, kangaroo,
#              bccd, fruit; carried converted in .dev/data_accuracy/NAME): yolov9-s, 640, batch 32, hyp.scratch-high,
#              close-mosaic 15, --min-items 0 --cache ram, 60 epochs (ACC_EPOCHS), seeds 0,1,2, torch, c
#              (ACC_BACKENDS, "" for none) and the published code (.dev/published; ACC_PUB=0 leaves it out), ACC_JOBS
#              (default 9) at most at once, each started only when its share fits the card (bench_accuracy.py's
#              RUN_GIB: torch 17, c 6.5, published 26 GiB; ten at once on an H100, before, split the torch runs' batches
#              by our out-of-memory guard; ACC_CARD_GIB=G: the GiB this set's runs share, to run two sets at once,
#              e.g. ACC_CARD_GIB=66 for each of two accstarts on an H200); ACC_SAVE_PERIOD=N keeps weights/epochN.pt
#              every N epochs (checkpoints of the learning phase for the grads part); stops 120 s before the call
#              ends (exit 3 = unfinished: the same call again on the warm machine resumes them from runs/acc-NAME); $OUT/acc-NAME.results.jsonl, curves.png, acc-NAME.tgz
#              (every run's results.csv and console)
#   accstart   realacc detached (setsid): it trains on past this call's end, through the next calls on the warm
#              machine (which may run other parts meanwhile), for ACC_WINDOW seconds from now (default 1500: plan
#              the calls to last that long); output in /tmp/accbg/ACC_NAME; run after build when ours train
#   accwait    wait for the detached accuracy runs (while this call has time), then $OUT/acc-NAME.results.jsonl,
#              acc-NAME.tgz and realacc-NAME.log of each
#   augtests   the CUDA cases of test_augment.py / test_augment_plan.py (the augment kernel = its C reference)
#   augloader  bench_dataloader.py, CPU pipeline vs the augment op on CUDA, workers 4 8 16 (AUG_WORKERS),
#              without and with --cache ram
#   augtrain   bench_train.py, the real train_dual.py, c backend, workers 4 8 16, without and with --gpu-augment
#              (AUG_CACHE=ram adds the pair with --cache ram, AUG_PLAIN=0 leaves out the pair without);
#              AUG_CPUS=0-3 runs augloader/augtrain on those cores
#              only (taskset: the 4-core host of issue 57)
#   augpub     the published train_dual.py (.dev/published) on the same 1024 images, workers 4 8 16
#   bnab       the BN planar-vector kernels' A/B (NCHW: --no-channels-last): bench_step c with them, then built
#              without them (-DYOLOV9C_NO_PLANAR_VEC), eager and graph rows, GPU time by group; the build restored
#   interleave bench_step.py --interleave: eager configurations of yolov9-s (STEP_MODELS) stepped in turn in one
#              process (the host swings ±12 % between processes), STEP_INTERLEAVE (default "c torch"; a switch's A/B:
#              e.g. "c+YOLOV9C_LEAN_HOST=0 c torch"), batch 16 and 64 (STEP_BATCHES), STEP_STEPS rounds (40)
#   plainab    issue 57 item 3, --plain-stride: the interleave part with PLAIN_INTERLEAVE (default c, c at plain stride
#              16 and 8, 16 with the auxiliary branch stored, torch), then the eager c step's peak at batch 64 per
#              setting (PLAIN_STRIDES, default "0 16 8"; a bench_step.py process each, YOLOV9C_PLAIN_STRIDE), then
#              the CUDA tests of tests/backends/test_plain_stride.py
#   grads      fidelity/backend_grads.py, c against torch gradients, fp16 and float32, on $COCO (a data.yaml);
#              GRADS_IMG, GRADS_BATCH (320, 16); GRADS_WEIGHTS=RUN/weights/last.pt: from a trained checkpoint (e.g. a
#              detached accuracy run's); GRADS_MODES (default "fp16 fp32"; "assign": the two losses' assignments on
#              identical maps, backend_grads.py --assign)
#   ddp        (2 GPUs) the DDP tests and a torchrun run of the c backend
# Test: dev/tests/test_gpu_run.py checks that every part named here is handled and every script it runs exists.
set -uo pipefail
OUT=${OUT:-gpu_out}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
export PYTHONUNBUFFERED=1 YOLOV9C_CACHE=${YOLOV9C_CACHE:-/tmp/yolov9c_cache}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}
END=$(( $(date +%s) + ${GPU_SECONDS:-570} ))
left() { echo $(( END - $(date +%s) )); }

stage() {  # stage NAME NEED LIMIT command...: run when NEED seconds are left, for at most LIMIT seconds
  local name=$1 need=$2 lim=$3; shift 3
  if [ "$(left)" -lt "$need" ]; then echo "SKIP $name ($(left) s left)"; return; fi
  [ "$lim" -gt "$(left)" ] && lim=$(left)
  local t0; t0=$(date +%s)
  timeout "$lim" "$@" > "$OUT/$name.log" 2>&1
  echo "$name rc=$? $(( $(date +%s) - t0 )) s"
  grep -h '^{' "$OUT/$name.log" >> "$OUT/rows.jsonl"
}

{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc; python3 -V
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
  git log -1 --format='%H %s' 2>/dev/null; date -u; } > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"

DATA=
if [[ " $* " == *" train "* || " $* " == *" capped "* || " $* " == *" augtrain "* || " $* " == *" augpub "* ]]; then   # the training benchmark's images, written while the module builds
  { python3 benchmarks/bench_train.py --data-only --images 1024 --procs 12
    [[ " $* " == *" capped "* ]] && python3 benchmarks/bench_train.py --data-only --images 1024 --val-images 128 --procs 12
  } > "$OUT/train_data.log" 2>&1 &
  DATA=$!
fi
PYT=(python3 -m pytest -q -p no:cacheprovider -m cuda -rfs)
COCO=${COCO:-shared/data/coco128/data.yaml}   # accuracy and grads only: the tests read tests/assets
[ -f "$COCO" ] || COCO=.dev/shared/data/coco128/data.yaml

for part in "$@"; do
  case $part in
    build) stage build 60 300 env YOLOV9C_CUDA=1 YOLOV9C_CUDA_ARCHS=90 YOLOV9C_WERROR=1 \
             python3 setup.py build_ext --inplace
           tail -2 "$OUT/build.log"
           python3 -c "import yolov9c._C as C; print(C.build_info())" || { echo "no CUDA module: stop"; exit 1; } ;;
    tests) # -v: a log cut by the time limit still names each test run and its outcome
           stage tests 120 ${TEST_LIMIT:-300} "${PYT[@]}" -v --durations=25 --tb=short ${TESTS:-tests}
           grep -E "FAILED|ERROR" "$OUT/tests.log" | head -20; tail -4 "$OUT/tests.log" ;;
    cudasuite) # the whole CUDA suite in groups, resumable: a finished group is noted in runs/cuda_suite/done (kept
               # on the warm machine), so the same call again runs the groups left; logs in $OUT/cuda_<group>.log
               mkdir -p runs/cuda_suite; touch runs/cuda_suite/done
               while read -r g files; do
                 [[ " ${CUDA_GROUPS:-$g} " == *" $g "* ]] || continue
                 grep -qx "$g" runs/cuda_suite/done && { echo "$g: done in an earlier call"; continue; }
                 stage "cuda_$g" 90 $(( $(left) - 5 )) "${PYT[@]}" -v --durations=10 --tb=short $files
                 if grep -qE "^(=+ )?[0-9]+ (passed|failed|skipped|error)" "$OUT/cuda_$g.log"; then
                   echo "$g" >> runs/cuda_suite/done; cp "$OUT/cuda_$g.log" runs/cuda_suite/; fi
                 grep -E "FAILED|ERROR" "$OUT/cuda_$g.log" | head -10; tail -1 "$OUT/cuda_$g.log"
               done <<'GROUPS'
ops tests/ops
loss_backends tests/loss tests/backends
graph tests/engine/train/test_graph_step.py tests/engine/train/test_graph_shapes.py
train tests/engine/train --deselect=tests/engine/train/test_graph_step.py --deselect=tests/engine/train/test_graph_shapes.py
rest tests dev/tests --deselect=tests/ops --deselect=tests/loss --deselect=tests/backends --deselect=tests/engine/train
GROUPS
               echo "groups done: $(tr '\n' ' ' < runs/cuda_suite/done)" ;;
    kernels) stage kernels 60 200 "${PYT[@]}" --tb=short tests/ops/test_bn_silu.py tests/ops/test_det_loss.py \
               tests/ops/test_tal_assign.py tests/ops/test_nms.py tests/ops/test_pool.py tests/ops/test_bindings.py
             tail -6 "$OUT/kernels.log" ;;
    guards) stage guards 120 150 "${PYT[@]}" --tb=long -k "not test_guards or cuda" tests/engine/train/test_guards.py \
              tests/engine/train/test_graph_step.py   # the CUDA cases of test_guards.py, all of test_graph_step.py
            tail -20 "$OUT/guards.log" ;;
    step) stage step 150 ${STEP_LIMIT:-300} python3 benchmarks/bench_step.py --models ${STEP_MODELS:-yolov9-s yolov9-c} \
            --backends ${STEP_BACKENDS:-c torch} --steps 10 --warmup 5 --batch ${STEP_BATCH:-64} --profile 0 \
            --timeout 110 --host-profile ${STEP_HOST_PROFILE:-0} ${STEP_MODES:+--modes $STEP_MODES} \
            --paths ${STEP_PATHS:-fixed} $([ "${STEP_GRAPH_SHAPES:-1}" = 0 ] && echo --no-graph-shapes) --cudnn-benchmark --markdown
          tail -10 "$OUT/step.log" ;;
    memory) stage memory 90 ${MEM_LIMIT:-400} python3 benchmarks/bench_memory.py --models ${MEM_MODELS:-yolov9-s yolov9-c} \
              --configs ${MEM_CONFIGS:-torch-cl c-cl torch-cl-graph c-cl-graph} --cudnn-benchmark --markdown
            grep "^|" "$OUT/memory.log" | head -14 ;;
    train) [ -n "$DATA" ] && wait "$DATA"
           for m in ${TRAIN_MODELS:-yolov9-s yolov9-c}; do for b in ${TRAIN_BACKENDS:-c torch}; do
             stage "train_${m}_$b" 100 240 python3 benchmarks/bench_train.py --models "$m" --backends "$b" \
               --images 1024 --timeout ${TRAIN_TIMEOUT:-230} --root /tmp/yolov9c_bench_train
             tail -1 "$OUT/train_${m}_$b.log"
           done; done
           cp /tmp/yolov9c_bench_train/logs/*.log "$OUT/" 2>/dev/null ;;
    capped) [ -n "$DATA" ] && wait "$DATA"
            for m in ${CAP_MODELS:-yolov9-s yolov9-c yolov9-e}; do
              for spec in "${CAP_SPEC:-yolov9-s=7.0,yolov9-c=14.0,yolov9-e=22.0}" $([ "${CAP_BASE:-1}" = 1 ] && echo none); do
                tag=$([ "$spec" = none ] && echo uncapped || echo capped)
                stage "${tag}_$m" 90 ${CAP_LIMIT:-200} python3 benchmarks/bench_train.py --models "$m" --backends c \
                  --images 1024 --val-images 128 --epochs 2 --timeout $(( ${CAP_LIMIT:-200} - 10 )) --root /tmp/yolov9c_bench_train \
                  ${CAP_VAL_CHUNKS:+--val-chunks $CAP_VAL_CHUNKS} \
                  $([ "$spec" = none ] || echo --mem-cap "$spec" ${CAP_MEM_BUDGET:+--mem-budget $CAP_MEM_BUDGET})
                tail -1 "$OUT/${tag}_$m.log"
              done
            done
            cp /tmp/yolov9c_bench_train/logs/*.log "$OUT/" 2>/dev/null ;;
    loss) stage loss 60 90 python3 benchmarks/bench_loss.py --batch 64 --imgsz 640 --nc 80 --boxes 20 160 1000 \
            --reps 10 --warmup 3 --markdown
          tail -12 "$OUT/loss.log" ;;
    bn) stage bn 45 90 python3 benchmarks/bench_bn_silu.py --no-torch ${BN_FLAGS:-}; tail -22 "$OUT/bn.log" ;;
    pool) stage pool 30 90 python3 benchmarks/bench_pool.py; tail -16 "$OUT/pool.log" ;;
    nms) stage nms 30 120 python3 benchmarks/bench_nms.py; tail -12 "$OUT/nms.log" ;;
    loader) for w in ${LOADER_WORKERS:-8 16}; do
              stage "loader_$w" 60 150 python3 benchmarks/bench_dataloader.py --workers "$w" --batch 64 --imgsz 640 \
                --batches 64 --warmup 16
              tail -2 "$OUT/loader_$w.log"
            done ;;
    published) if [ -d .dev/published ]; then
                 stage published 60 150 python3 benchmarks/bench_published_step.py --published .dev/published \
                   --models ${STEP_MODELS:-yolov9-s yolov9-c} --profile 0 --markdown
                 tail -5 "$OUT/published.log"
               else echo "SKIP published (no .dev/published)"; fi ;;
    accuracy) pub=(); [ -d .dev/published ] && pub=(--published .dev/published --python python3)
              stage accuracy 300 540 python3 dev/accuracy/bench_accuracy.py --data "$COCO" --epochs ${ACC_EPOCHS:-30} \
                --close-mosaic ${ACC_CLOSE:-10} --seeds ${ACC_SEEDS:-0,1} --jobs ${ACC_JOBS:-6} --workers 2 \
                ${ACC_FLAGS:---single-cls} --out /tmp/acc "${pub[@]}"
              tail -6 "$OUT/accuracy.log" ;;
    bnab) # issue 58 item 7: the BN planar-vector kernels (NCHW only) against the generic ones they stand in for:
          # bench_step, c backend, --no-channels-last, with this build, then with one built -DYOLOV9C_NO_PLANAR_VEC
          stage bnab_with 90 150 python3 benchmarks/bench_step.py --models ${STEP_MODELS:-yolov9-s} --backends c \
            --steps 10 --warmup 5 --batch ${STEP_BATCH:-64} --profile 2 --timeout 140 --no-channels-last --cudnn-benchmark
          so=$(ls yolov9c/_C*.so); cp "$so" /tmp/with_vec.so; touch kernels/bn_silu.cuh
          stage bnab_build 150 300 env NVCC_APPEND_FLAGS=-DYOLOV9C_NO_PLANAR_VEC YOLOV9C_CUDA=1 YOLOV9C_CUDA_ARCHS=90 \
            python3 setup.py build_ext --inplace
          stage bnab_without 90 150 python3 benchmarks/bench_step.py --models ${STEP_MODELS:-yolov9-s} --backends c \
            --steps 10 --warmup 5 --batch ${STEP_BATCH:-64} --profile 2 --timeout 140 --no-channels-last --cudnn-benchmark
          cp /tmp/with_vec.so "$so"; touch kernels/bn_silu.cuh
          tail -1 "$OUT/bnab_with.log"; tail -1 "$OUT/bnab_without.log" ;;
    interleave) for b in ${STEP_BATCHES:-16 64}; do   # one process a batch, the configurations stepped in turn
                  stage "interleave_b$b" 60 200 python3 benchmarks/bench_step.py --models ${STEP_MODELS:-yolov9-s} \
                    --interleave ${STEP_INTERLEAVE:-c torch} --steps ${STEP_STEPS:-40} --warmup 5 --batch "$b" --cudnn-benchmark
                  grep -h '"step_ms"' "$OUT/interleave_b$b.log" | cut -c1-200
                done ;;
    plainab) for b in ${STEP_BATCHES:-16 64}; do
               stage "plainab_b$b" 60 200 python3 benchmarks/bench_step.py --models ${STEP_MODELS:-yolov9-s} --interleave \
                 ${PLAIN_INTERLEAVE:-c c+YOLOV9C_PLAIN_STRIDE=16 c+YOLOV9C_PLAIN_STRIDE=8 \
                 c+YOLOV9C_PLAIN_STRIDE=16+YOLOV9C_AUX_RECOMPUTE=0 torch} \
                 --steps ${STEP_STEPS:-40} --warmup 5 --batch "$b" --cudnn-benchmark
               grep -h '"step_ms"' "$OUT/plainab_b$b.log" | cut -c1-200
             done
             for s in ${PLAIN_STRIDES:-0 16 8}; do
               stage "plainmem_$s" 60 120 env YOLOV9C_PLAIN_STRIDE="$s" python3 benchmarks/bench_step.py --models yolov9-s \
                 --backends c --modes eager --steps 3 --warmup 3 --batch 64 --profile 0 --cudnn-benchmark
               grep -h '"peak_reserved_gib"' "$OUT/plainmem_$s.log" | cut -c1-300
             done
             stage plaintests 60 150 "${PYT[@]}" tests/backends/test_plain_stride.py; tail -3 "$OUT/plaintests.log" ;;
    realacc) name=${ACC_NAME:-raccoon}; data=.dev/data_accuracy/$name/data.yaml; acc=runs/acc-$name
             if [ ! -f "$data" ]; then echo "SKIP realacc (no $data: carry the converted dataset)"; continue; fi
             pub=(); [ -f .dev/published/train_dual.py ] && [ "${ACC_PUB:-1}" = 1 ] && pub=(--published .dev/published --python python3)
             # at most ACC_JOBS at once; bench_accuracy.py starts a run only when its share of the card fits
             jobs=${ACC_JOBS:-9}
             stage realacc 240 $(( $(left) - 10 )) python3 dev/accuracy/bench_accuracy.py --data "$data" \
               --cfg yolov9-s --img 640 --batch 32 --epochs ${ACC_EPOCHS:-60} --close-mosaic 15 \
               --seeds ${ACC_SEEDS:-0,1,2} \
               --backends "${ACC_BACKENDS-torch,c}" --jobs "$jobs" --workers 2 --time-limit $(( $(left) - 120 )) \
               --save-period "${ACC_SAVE_PERIOD:--1}" ${ACC_CARD_GIB:+--card-gib "$ACC_CARD_GIB"} \
               --out "$acc" "${pub[@]}"
             tail -12 "$OUT/realacc.log"
             cp "$acc/curves.png" "$OUT/" 2>/dev/null; cp "$acc/results.jsonl" "$OUT/acc-$name.results.jsonl" 2>/dev/null
             # every run's results.csv and console in one file (a call brings back at most 8 files)
             (cd "$acc" && tar czf "$OUT/acc-$name.tgz" ./*.log train/*/results.csv 2>/dev/null) ;;
    accstart) mkdir -p /tmp/accbg; name=${ACC_NAME:-raccoon}
              setsid nohup env OUT="/tmp/accbg/$name" GPU_SECONDS="${ACC_WINDOW:-1500}" bash "$0" realacc \
                > "/tmp/accbg/$name.txt" 2>&1 < /dev/null &
              echo "accstart: $name detached for ${ACC_WINDOW:-1500} s" ;;
    accwait) while pgrep -f "gpu_run.sh realacc" > /dev/null && [ "$(left)" -gt 20 ]; do sleep 5; done
             for d in /tmp/accbg/*/; do
               [ -d "$d" ] || continue; n=$(basename "$d")
               cp "$d"acc-*.results.jsonl "$d"acc-*.tgz "$OUT/" 2>/dev/null; cp "${d}realacc.log" "$OUT/realacc-$n.log" 2>/dev/null
               echo "== $n"; tail -12 "${d}realacc.log" 2>/dev/null
             done ;;
    augtests) stage augtests 60 150 "${PYT[@]}" --tb=short tests/ops/test_augment.py tests/data/test_augment_plan.py
              tail -3 "$OUT/augtests.log" ;;
    augloader) for cache in "" "--cache ram"; do for w in ${AUG_WORKERS:-4 8 16}; do for a in cpu-pipeline op-cuda; do
                 stage "augloader_${a}_w${w}${cache:+_ram}" 60 90 ${AUG_CPUS:+taskset -c $AUG_CPUS} python3 benchmarks/bench_dataloader.py --workers "$w" \
                   --batch 64 --imgsz 640 --batches 20 --augment "$a" $cache
                 tail -1 "$OUT/augloader_${a}_w${w}${cache:+_ram}.log"
               done; done; done ;;
    augtrain) [ -n "$DATA" ] && wait "$DATA"
              for m in ${TRAIN_MODELS:-yolov9-s yolov9-c}; do for w in ${AUG_WORKERS:-4 8 16}; do
                for cache in $([ "${AUG_PLAIN:-1}" = 1 ] && echo none) ${AUG_CACHE:-}; do
                  [ "$cache" = none ] && cache=
                  for g in "" --gpu-augment; do
                  tag="augtrain_${m}_w${w}${cache:+_$cache}${g:+_gpuaug}"
                  stage "$tag" 110 100 ${AUG_CPUS:+taskset -c $AUG_CPUS} python3 benchmarks/bench_train.py --models "$m" \
                    --backends c --images 1024 --workers "$w" --timeout 95 --root /tmp/yolov9c_bench_train $g ${cache:+--cache $cache}
                  tail -1 "$OUT/$tag.log"
                done; done
              done; done ;;
    augpub) [ -n "$DATA" ] && wait "$DATA"
            if [ ! -d .dev/published ]; then echo "SKIP augpub (no .dev/published)"; continue; fi
            for m in ${TRAIN_MODELS:-yolov9-s yolov9-c}; do for w in ${AUG_WORKERS:-4 8 16}; do
              stage "augpub_${m}_w${w}" 120 110 bash -c "cd .dev/published && python3 train_dual.py \
                --data /tmp/yolov9c_bench_train/synthetic-1024-640-b40/data.yaml --cfg models/detect/${m}.yaml \
                --hyp data/hyps/hyp.scratch-high.yaml --batch-size 64 --img 640 --epochs 1 --workers $w --device 0 \
                --project /tmp/pub_runs --name ${m}_w${w} --exist-ok"
            done; done ;;
    grads) for mode in ${GRADS_MODES:-fp16 fp32}; do
             flag=(); [ $mode = fp32 ] && flag=(--fp32); [ $mode = assign ] && flag=(--assign)
             stage "grads_$mode" 60 ${GRADS_LIMIT:-240} python3 dev/fidelity/backend_grads.py --data "$COCO" \
               --cfg ${GRADS_CFG:-yolov9-s} --img ${GRADS_IMG:-320} --batch ${GRADS_BATCH:-16} --batches ${GRADS_BATCHES:-6} --warm-steps 30 \
               ${GRADS_WEIGHTS:+--weights "$GRADS_WEIGHTS"} "${flag[@]}" --json "$OUT/grads_$mode.jsonl"
             grep "^| " "$OUT/grads_$mode.log" | head -8
           done ;;
    ddp) stage ddp 120 150 "${PYT[@]}" tests/engine/train/test_train_ddp.py; tail -3 "$OUT/ddp.log"
         stage torchrun 90 120 torchrun --nproc_per_node 2 train_dual.py --cfg yolov9-s.yaml --img 320 --batch 32 \
           --epochs 1 --workers 4 --backend c --noplots --project /tmp/runs --name ddp_c --exist-ok
         tail -4 "$OUT/torchrun.log" ;;
    *) echo "unknown part $part (see the list at the top of dev/gpu_run.sh)" ;;
  esac
done
echo "done, $(left) s left"
