#!/usr/bin/env bash
# The issue-5 benchmark record on a GPU machine, in one call: trident info; p2p, all-load and
# all-store at 2 and 4 ranks (ranks share the GPU when there are fewer GPUs than ranks: the
# outputs then say "correctness and harness run, not link bandwidth"); a traced kernel
# (benchmarks/trace_demo.py, 2 ranks: Chrome trace + timeline PNG); device-api.
# Everything goes into $OUT (default results/gpu_bench): one folder per run, plus a log per run.
#
#   bash scripts/gpu_bench.sh                         # about 3-4 minutes on one H200
#   RANKS="2" MAX_BYTES=256M bash scripts/gpu_bench.sh  # fewer ranks, a shorter sweep
#   TRIDENT_BACKEND=sim PY=.venv/bin/python bash scripts/gpu_bench.sh   # rehearse on a CPU (tiny sizes)
#
# Each step has its own time limit and the whole script stops starting steps once BUDGET seconds
# (default 330) are spent, so a hang cannot take the whole call.
set -u
cd "$(dirname "$0")/.." || exit 1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TRIDENT_BACKEND=${TRIDENT_BACKEND:-cuda}
export NCCL_NVLS_ENABLE=0  # never NVLink multicast on these hosts
PY=${PY:-python3}
OUT=${OUT:-results/gpu_bench}
RANKS=${RANKS:-2 4}
MAX_BYTES=${MAX_BYTES:-2G}
P2P_BYTES=${P2P_BYTES:-256M}
BUDGET=${BUDGET:-330}
mkdir -p "$OUT"
start=$(date +%s)
failed=""

# step NAME LIMIT_SECONDS COMMAND...: run with a time limit (cut to what is left of BUDGET), log to $OUT/NAME.log.
step() {
  local name=$1 limit=$2
  shift 2
  local left=$((BUDGET - ($(date +%s) - start)))
  if [ "$left" -lt 15 ]; then
    echo "== $name: skipped, the time budget ($BUDGET s) is spent" | tee -a "$OUT/summary.txt"
    failed="$failed $name(skipped)"
    return
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  local t0=$(date +%s)
  echo "== $name (limit ${limit}s): $*"
  timeout --kill-after=10 "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  grep -v "destroy_process_group\|^$" "$OUT/$name.log" | tail -n 40
  echo "== $name: exit $rc after $(( $(date +%s) - t0 ))s" | tee -a "$OUT/summary.txt"
  [ "$rc" -ne 0 ] && failed="$failed $name(rc=$rc)"
}

"$PY" -c "import torch, triton; print('torch', torch.__version__, '| triton', triton.__version__)" | tee "$OUT/versions.txt"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader \
  | tee -a "$OUT/versions.txt"

step info 60 "$PY" -m trident info
"$PY" -m trident info --json > "$OUT/info.json" 2>/dev/null
for n in $RANKS; do
  step "p2p_$n" 90 "$PY" -m trident bench p2p -n "$n" --bytes "$P2P_BYTES" --out "$OUT/p2p_$n"
  step "all_load_$n" 75 "$PY" -m trident bench all-load -n "$n" --max-bytes "$MAX_BYTES" --out "$OUT/all_load_$n"
  step "all_store_$n" 75 "$PY" -m trident bench all-store -n "$n" --max-bytes "$MAX_BYTES" --out "$OUT/all_store_$n"
done
# Last, so they cannot starve the runs above: a traced kernel, and the device-API figures (already
# in docs/benchmarks.md from the older script; 24 kernels to compile).
step trace_demo_2 60 "$PY" -m trident run -n 2 benchmarks/trace_demo.py --out "$OUT/trace_demo_2"
step device_api 120 "$PY" -m trident bench device-api -n 1 --sizes-mib 256 1024 --out "$OUT/device_api"
"$PY" -m trident.bench.summary "$OUT" > "$OUT/summary.md" 2>&1  # Markdown tables for docs/benchmarks.md
echo "total $(( $(date +%s) - start ))s; failed:${failed:- none}" | tee -a "$OUT/summary.txt"
[ -z "$failed" ]
