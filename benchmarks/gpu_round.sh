#!/usr/bin/env bash
# One device call of named parts, in the order given (each skipped when the deadline is near):
#   bash benchmarks/gpu_round.sh SECONDS PART...     e.g.  bash benchmarks/gpu_round.sh 560 guards train_s_c cuda
# Parts: guards (the CUDA guard and graph-step tests, long tracebacks), cuda (every CUDA test), tests (the CUDA
# tests of $TEST_FILES; tests2, tests3 of $TEST_FILES2, $TEST_FILES3), train_M_B (the real
# train_dual.py of bench_train.py, M in s/c/e, B in c/torch, 1024 images), step (bench_step.py, yolov9-s and
# yolov9-c, both backends, eager and graph; step16 at batch 16; STEP_PROFILE=N profiles N steps; STEP_FLAGS more bench_step flags, e.g. --cudnn-benchmark; STEP_LIMIT seconds, 300: two models' eight rows took > 240), pubstep (bench_published_step.py, the published code in
# .dev/published; pubstep_nodet without its deterministic mode), kern (the CUDA tests of the kernels),
# timeline_M (mem_timeline.py of yolov9-M, batch 64, 640), plan (bench_plan.py: the planner's COSTS), mem (the
# CUDA memory tests), bnbench (bench_bn_silu.py; BN_FLAGS e.g. "--kernels --shapes 64,512,40,40"), cudnn (the cuDNN fusion tests and probe_cudnn_fusion.py), bnbench_notma (the same with YOLOV9C_BN_TMA=0: without the TMA statistics kernel; bnbench_nopdl with YOLOV9C_BN_PDL=0: finish kernels launched plainly), cudnntime (its --time), newk / rest (the CUDA tests of
# the kernels changed this session / all other CUDA tests), poolbench (bench_pool.py), memrows (bench_memory.py's
# rows, MEM_MODELS, MEM_CONFIGS: torch-cl c-cl torch-cl-graph c-cl-graph), bnprobe (probe_bn_stats.cu built and its SWEEP2 part run at both shapes; fwdprobe its FWD part),
# accuracy (bench_accuracy.py, with the published code when present and ACC_PUBLISHED is not 0; accuracy_bg starts it in
# the background, accuracy_wait waits for it), patch (apply $PATCH_FILE, e.g. a branch's `git diff main branch` carried as .dev/next.patch, and rebuild: the parts after it measure the branch, those before it main, in one call), grads (fidelity/backend_grads.py, fp16 and --fp32; GRADS_CFG, GRADS_BATCHES (6; 16 passed 150 s beside four accuracy runs), GRADS_LIMIT, GRADS_WEIGHTS: a trained checkpoint, e.g. /tmp/acc/train/torch-s3/weights/last.pt after accuracy_wait, with GRADS_DATA=/tmp/acc/data-crops/data.yaml). Build for sm_90 first; the bench_train dataset is written meanwhile. Run from the repo root.
source "$(dirname "$0")/gpu_lib.sh" "${1:-480}"; shift
machine_info
DATA=
if [ -z "${NO_DATA:-}" ]; then  # NO_DATA=1: no train_* part follows (the prep's 12 processes load the host)
  python3 benchmarks/bench_train.py --data-only --images 1024 --procs 12 > "$OUT/data.log" 2>&1 &
  DATA=$!
fi
[ -z "${NO_BUILD:-}" ] && build_sm90   # NO_BUILD=1: parts that need no module (bnprobe)
PYT="python3 -m pytest -q -p no:cacheprovider -m cuda -rf"
for part in "$@"; do
  case $part in
    guards) stage guards 120 150 $PYT --tb=long tests/test_train_guards_cuda.py tests/test_graph_step.py
            tail -40 "$OUT/guards.log" ;;
    cuda) stage cuda 240 300 $PYT --tb=short tests; tail -25 "$OUT/cuda.log" ;;
    tests) stage tests 60 ${TEST_LIMIT:-240} $PYT --tb=short $TEST_FILES; tail -8 "$OUT/tests.log" ;;
    tests2|tests3) files=TEST_FILES${part#tests}  # more test runs in fresh processes: TEST_FILES2, TEST_FILES3
            stage $part 60 ${TEST_LIMIT:-240} $PYT --tb=short ${!files}; tail -8 "$OUT/$part.log" ;;
    train_*) [ -n "$DATA" ] && wait $DATA
      m=${part#train_}; b=${m#*_}; m=yolov9-${m%_*}
      stage "$part" 100 240 python3 benchmarks/bench_train.py --models $m --backends $b --images 1024 \
        --timeout ${TRAIN_TIMEOUT:-230} \
        --root /tmp/yolov9c_bench_train
      tail -1 "$OUT/$part.log"; cp /tmp/yolov9c_bench_train/logs/*.log "$OUT/" 2>/dev/null
      grep -h "AMP:\|skipped\|WARNING\|GPU_mem" /tmp/yolov9c_bench_train/logs/$m-$b-*.log | head -5 ;;
    step|step16) b=64; [ $part = step16 ] && b=16
          stage $part 150 ${STEP_LIMIT:-300} python3 benchmarks/bench_step.py --models ${STEP_MODELS:-yolov9-s yolov9-c} --backends c torch \
            --steps 10 --warmup 5 --batch $b --profile ${STEP_PROFILE:-0} --timeout 110 --markdown ${STEP_FLAGS:-}
          tail -8 "$OUT/$part.log" ;;
    accuracy|accuracy_bg) pub=(); [ -d .dev/published ] && [ "${ACC_PUBLISHED:-1}" = 1 ] && pub=(--published .dev/published --python python3)
      acc=(python3 benchmarks/bench_accuracy.py --data ${ACC_DATA:-.dev/shared/data/coco128/data.yaml} --epochs ${ACC_EPOCHS:-30} --close-mosaic ${ACC_CLOSE:-10}
           --seeds ${ACC_SEEDS:-0,1} --jobs ${ACC_JOBS:-6} --workers 2 ${ACC_FLAGS:---single-cls} --out /tmp/acc "${pub[@]}")
      if [ $part = accuracy ]; then stage accuracy 300 540 "${acc[@]}"; tail -6 "$OUT/accuracy.log"
      else timeout $(( $(left) - 15 )) "${acc[@]}" > "$OUT/accuracy.log" 2>&1 & ACC=$!; echo "accuracy started"; fi ;;
    accuracy_wait) wait $ACC; echo "accuracy rc=$?"; tr '\r' '\n' < "$OUT/accuracy.log" | grep '^{' >> "$OUT/rows.jsonl"
      tail -6 "$OUT/accuracy.log"; cp /tmp/acc/*.log "$OUT/" 2>/dev/null ;;
    pubstep|pubstep_nodet) det=(); [ $part = pubstep_nodet ] && det=(--no-deterministic)
      [ -d .dev/published ] && stage $part 60 150 python3 benchmarks/bench_published_step.py --published .dev/published \
        --models ${STEP_MODELS:-yolov9-s yolov9-c} --profile 0 "${det[@]}" --markdown; tail -5 "$OUT/$part.log" ;;
    kern) stage kern 60 200 $PYT --tb=short tests/test_det_loss.py tests/test_bn_silu.py tests/test_backend_c.py \
            tests/test_bindings.py; tail -4 "$OUT/kern.log" ;;
    timeline_*) m=yolov9-${part#timeline_}
      stage "$part" 60 150 python3 benchmarks/mem_timeline.py --model $m --warmup 1 --markdown; tail -30 "$OUT/$part.log" ;;
    plan) stage plan 90 200 python3 benchmarks/bench_plan.py --models ${PLAN_MODELS:-yolov9-s yolov9-c yolov9-e} \
            --backends ${PLAN_BACKENDS:-c} --batches 16 64; tail -6 "$OUT/plan.log" ;;
    mem) stage mem 60 150 $PYT --tb=short tests/test_backend_pgi.py tests/test_memory_contract.py tests/test_memory_plan.py
         tail -8 "$OUT/mem.log" ;;
    bnbench) stage bnbench 45 90 python3 benchmarks/bench_bn_silu.py --no-torch ${BN_FLAGS:-}; tail -22 "$OUT/bnbench.log" ;;
    bnbench_notma) stage bnbench_notma 45 90 env YOLOV9C_BN_TMA=0 python3 benchmarks/bench_bn_silu.py --no-torch ${BN_FLAGS:-}
                   tail -22 "$OUT/bnbench_notma.log" ;;
    bnbench_nopdl) stage bnbench_nopdl 45 90 env YOLOV9C_BN_PDL=0 python3 benchmarks/bench_bn_silu.py --no-torch ${BN_FLAGS:-}
                   tail -22 "$OUT/bnbench_nopdl.log" ;;
    cudnn) stage cudnn_tests 60 150 python3 -m pytest -q -p no:cacheprovider -rf --tb=short tests/test_cudnn_fusion.py \
             tests/test_build.py tests/test_bindings.py; tail -4 "$OUT/cudnn_tests.log"
           stage cudnn_probe 60 ${PROBE_LIMIT:-240} python3 benchmarks/probe_cudnn_fusion.py ${PROBE_ARGS:-}
           tail -30 "$OUT/cudnn_probe.log" ;;
    newk) stage newk 60 200 $PYT --tb=short tests/test_pool.py tests/test_bn_silu.py tests/test_backend_c.py \
            tests/test_backend_pgi.py tests/test_cudnn_fusion.py tests/test_bindings.py; tail -6 "$OUT/newk.log" ;;
    rest) stage rest 60 300 $PYT --tb=short --ignore=tests/test_pool.py --ignore=tests/test_bn_silu.py \
            --ignore=tests/test_backend_c.py --ignore=tests/test_backend_pgi.py --ignore=tests/test_cudnn_fusion.py \
            --ignore=tests/test_bindings.py tests; tail -8 "$OUT/rest.log" ;;
    poolbench) stage poolbench 30 90 python3 benchmarks/bench_pool.py; tail -16 "$OUT/poolbench.log" ;;
    cudnntime) stage cudnntime 40 ${PROBE_LIMIT:-150} python3 benchmarks/probe_cudnn_fusion.py --time ${PROBE_ARGS:-}
           grep "^|" "$OUT/cudnntime.log" | head -30 ;;
    grads) for mode in "" --fp32; do  # fidelity/backend_grads.py: c vs torch gradients against float64
             stage "grads${mode}" 60 ${GRADS_LIMIT:-240} python3 benchmarks/fidelity/backend_grads.py --data ${GRADS_DATA:-.dev/shared/data/coco128/data.yaml} \
               --cfg ${GRADS_CFG:-yolov9-s} --img 320 --batch 16 --batches ${GRADS_BATCHES:-6} --warm-steps 30 ${GRADS_WEIGHTS:+--weights $GRADS_WEIGHTS} $mode \
               --json "$OUT/grads$mode.jsonl"; grep "^| " "$OUT/grads${mode}.log" | head -8; done ;;
    memrows) stage memrows 90 ${MEM_LIMIT:-400} python3 benchmarks/bench_memory.py --models ${MEM_MODELS:-yolov9-s yolov9-c} \
               --configs ${MEM_CONFIGS:-torch-cl c-cl torch-cl-graph c-cl-graph} --cudnn-benchmark --markdown; grep "^|" "$OUT/memrows.log" | head -14 ;;
    patch) [ -f "${PATCH_FILE:-}" ] || { echo "patch: no PATCH_FILE (carry it)"; continue; }
           patch -p1 < "$PATCH_FILE" > "$OUT/patch.log" 2>&1 && echo "patch applied: $PATCH_FILE" && build_sm90 ;;
    bnprobe|fwdprobe) [ -n "${PROBE_BUILT:-}" ] || stage bnprobe_build 30 120 nvcc -O3 -arch=sm_90 -std=c++17 --extended-lambda -Ikernels \
               benchmarks/probe_bn_stats.cu kernels/bn_silu.cu -o /tmp/probe_bn_stats
             PROBE_BUILT=1; mode=SWEEP2; [ $part = fwdprobe ] && mode=FWD   # fwdprobe: the forward sweep of the probe
             stage $part 30 ${BNPROBE_LIMIT:-150} bash -c "$mode=1 /tmp/probe_bn_stats && $mode=1 /tmp/probe_bn_stats 409600 256"
             cat "$OUT/$part.log" ;;
    probe) stage probe 30 60 python3 -c "import importlib.util as u; print({m: bool(u.find_spec(m)) for m in
            ('torchvision', 'pandas', 'seaborn', 'scipy', 'thop', 'psutil', 'tensorboard', 'IPython')})"
            cat "$OUT/probe.log" ;;
    *) echo "unknown part $part" ;;
  esac
done
echo "done, $(left) s left"
