# Shared by the benchmarks/gpu_*.sh call scripts (source it): one device call = a deadline, staged commands that
# are skipped when it is near, their logs in one archive $OUT/logs.tgz (the device tool returns few files) and
# their JSON lines in $OUT/rows.jsonl.
#   source benchmarks/gpu_lib.sh SECONDS      # then: machine_info; build_sm90; stage NAME NEED LIMIT cmd...
set -uo pipefail
OUT=${OUT:-gpu_out}; mkdir -p "$OUT"
FINAL=$OUT; OUT=$(mktemp -d /tmp/gpucall.XXXX)
trap 'cp "$OUT/rows.jsonl" "$FINAL/" 2>/dev/null; tar czf "$FINAL/logs.tgz" -C "$OUT" .' EXIT
export PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}
[ -d .dev/shared ] && export YOLOV9C_SHARED=${YOLOV9C_SHARED:-$PWD/.dev/shared}  # the goldens the tests read (carried)
END=$(( $(date +%s) + ${1:-480} ))
left() { echo $(( END - $(date +%s) )); }
stage() {  # stage NAME NEED_SECONDS LIMIT_SECONDS command...: run when NEED seconds are left, at most LIMIT
  local name=$1 need=$2 lim=$3; shift 3
  if [ "$(left)" -lt "$need" ]; then echo "SKIP $name ($(left) s left)"; return; fi
  [ "$lim" -gt "$(left)" ] && lim=$(left)
  local t0=$(date +%s); timeout "$lim" "$@" > "$OUT/$name.log" 2>&1; local rc=$?
  echo "$name rc=$rc $(( $(date +%s) - t0 )) s"; grep -h '^{' "$OUT/$name.log" >> "$OUT/rows.jsonl"
}
machine_info() {
  { nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc; python3 -V
    python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"; date -u
    git log -1 --format=%H 2>/dev/null; } > "$OUT/machine.txt" 2>&1
  cat "$OUT/machine.txt"
}
build_sm90() {
  local t0=$(date +%s)
  YOLOV9C_CUDA=1 YOLOV9C_CUDA_ARCHS=90 python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1
  echo "build rc=$? $(( $(date +%s) - t0 )) s"; tail -2 "$OUT/build.log"
}
