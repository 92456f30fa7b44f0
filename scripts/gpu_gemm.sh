#!/usr/bin/env bash
# On the GPU machine, in one call: the matmul sweep against cuBLAS, then (when given) the
# gemm_all_scatter checks with ranks sharing the GPU. Results and logs go to $OUT (or results/).
# Usage: bash scripts/gpu_gemm.sh [gemm|patterns|all]   (SWEEP= : the table's configs only, no sweep)
set -u
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TRIDENT_BACKEND=cuda
OUT=${OUT:-results}
mkdir -p "$OUT"
what=${1:-all}
python3 -c "import torch, triton; print('torch', torch.__version__, '| triton', triton.__version__)"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader
if [ "$what" = patterns ] || [ "$what" = all ]; then
  set -o pipefail
  timeout ${PYTEST_LIMIT:-330} python3 -m pytest -q -x --backend cuda -p no:cacheprovider --durations=8 \
    ${PYTEST_ARGS:-} tests/test_ops_matmul.py tests/test_ops_gemm_all_scatter.py 2>&1 | tee "$OUT/pytest_ops_cuda.log" | tail -25
  echo "pytest exit: $?"
  # One rank: each pattern against the GEMM alone (the cost of the communication machinery).
  timeout 150 python3 -m trident bench gemm-all-scatter -n 1 --no-progress --out /tmp/gas1 2>&1 | grep -v Warning | tail -32
  cp /tmp/gas1/gemm_all_scatter.json "$OUT/gas_w1.json"; cp /tmp/gas1/gemm_all_scatter_breakdown.png "$OUT/gas_w1_breakdown.png"
  # Two ranks sharing the GPU: correctness of the cross-rank path (not a performance figure).
  timeout 90 python3 -m trident bench gemm-all-scatter -n 2 --no-progress --shapes 1024x1536x2048 --repeats 3 \
    --out /tmp/gas2 2>&1 | grep -v Warning | tail -10
  for e in bulk_synchronous producer_consumer fused_sequential workgroup_specialized; do
    timeout 60 python3 -m trident run -n 2 examples/gemm_all_scatter_$e.py --m 1000 --n 768 --k 520 2>&1 | tail -2
  done 2>&1 | tee "$OUT/examples_cuda.log"
fi
if [ "$what" = gemm ] || [ "$what" = all ]; then
  timeout ${GEMM_LIMIT:-420} python3 -m trident.bench.gemm ${SWEEP---sweep} --dtype bfloat16 --out "$OUT" 2>&1 | tee "$OUT/gemm_bf16.log"
  timeout 120 python3 -m trident.bench.gemm --dtype float16 --out "$OUT/fp16" 2>&1 | tee "$OUT/gemm_fp16.log"
  cp "$OUT/fp16/gemm.json" "$OUT/gemm_fp16.json" 2>/dev/null; rm -rf "$OUT/fp16"
fi
