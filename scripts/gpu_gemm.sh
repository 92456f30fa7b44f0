#!/usr/bin/env bash
# On the GPU machine, in one call: the matmul sweep against cuBLAS, then (when given) the
# gemm_all_scatter checks with ranks sharing the GPU. Results and logs go to $OUT (or results/).
# Usage: bash scripts/gpu_gemm.sh [gemm|patterns|all]
set -u
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TRIDENT_BACKEND=cuda
OUT=${OUT:-results}
mkdir -p "$OUT"
what=${1:-all}
python3 -c "import torch, triton; print('torch', torch.__version__, '| triton', triton.__version__)"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader
if [ "$what" = gemm ] || [ "$what" = all ]; then
  timeout ${GEMM_LIMIT:-420} python3 -m trident.bench.gemm --sweep --dtype bfloat16 --out "$OUT" 2>&1 | tee "$OUT/gemm_bf16.log"
  timeout 120 python3 -m trident.bench.gemm --dtype float16 --out "$OUT/fp16" 2>&1 | tee "$OUT/gemm_fp16.log"
  cp "$OUT/fp16/gemm.json" "$OUT/gemm_fp16.json" 2>/dev/null; rm -rf "$OUT/fp16"
fi
if [ "$what" = patterns ] || [ "$what" = all ]; then
  timeout ${PATTERN_LIMIT:-300} python3 -m pytest -q -x --backend cuda -p no:cacheprovider tests/test_ops_matmul.py \
    tests/test_ops_gemm_all_scatter.py 2>&1 | tee "$OUT/pytest_ops_cuda.log" | tail -15
  timeout 200 python3 -m trident.bench.gemm_all_scatter --world1 --out "$OUT" 2>&1 | tee "$OUT/gas_w1.log" | tail -30
fi
