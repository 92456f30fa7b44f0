#!/usr/bin/env bash
# On the GPU machine, in one call: the matmul sweep against cuBLAS, then (when given) the
# gemm_all_scatter checks with ranks sharing the GPU. Results and logs go to $OUT (or results/).
# Usage: bash scripts/gpu_gemm.sh [gemm|patterns|tests|diag|diag+tests|tp|fused-bench|streamk|timelines|all]
#   (SWEEP= : the table's configs only; GEMM_SHAPES=MxNxK,...: only these shapes)
#   tp: all_gather_gemm / gemm_reduce_scatter tests on the GPU (ranks sharing it), then both benchmarks
#       and gemm-all-scatter at one rank with --trace (each pattern against the GEMM alone, and timelines)
#   fused-bench: those three benchmarks only
#   streamk: matmul/trace tests on the GPU, the split_tail candidates against the table's configs,
#       and the cuBLAS kernels torch.matmul runs on the shard shapes
#   timelines: gemm-all-scatter with 2 ranks sharing the GPU, traced (comm events; not a speed figure)
set -u
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TRIDENT_BACKEND=cuda
OUT=${OUT:-results}
mkdir -p "$OUT"
what=${1:-all}
python3 -c "import torch, triton; print('torch', torch.__version__, '| triton', triton.__version__)"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader
if [ "$what" = patterns ] || [ "$what" = all ] || [ "$what" = tests ] || [ "$what" = diag+tests ]; then
  set -o pipefail
  kargs=(); [ -n "${PYTEST_K:-}" ] && kargs=(-k "$PYTEST_K")
  timeout ${PYTEST_LIMIT:-330} python3 -m pytest -q -x --backend cuda -p no:cacheprovider --durations=8 "${kargs[@]}" \
    tests/test_ops_matmul.py tests/test_ops_gemm_all_scatter.py 2>&1 | tee "$OUT/pytest_ops_cuda.log" | tail -25
  echo "pytest exit: $?"
fi
if [ "$what" = tp ]; then
  set -o pipefail
  timeout ${PYTEST_LIMIT:-240} python3 -m pytest -q -x --backend cuda -p no:cacheprovider --durations=5 \
    tests/test_ops_tensor_parallel.py 2>&1 | tee "$OUT/pytest_tp_cuda.log" | tail -12
  echo "pytest exit: $?"
fi
if [ "$what" = tp ] || [ "$what" = fused-bench ]; then
  for b in all-gather-gemm gemm-reduce-scatter gemm-all-scatter; do
    timeout ${BENCH_LIMIT:-120} python3 -m trident bench $b -n 1 --no-progress --trace --out "/tmp/tp/$b" 2>&1 \
      | grep -v Warning | tail -14
  done
  tar -C /tmp/tp -czf "$OUT/tp_w1.tgz" . 2>/dev/null  # JSON, breakdowns, timelines: one file to fetch
fi
if [ "$what" = patterns ] || [ "$what" = all ]; then
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
  timeout ${GEMM_LIMIT:-420} python3 -m trident.bench.gemm ${SWEEP---sweep} ${GEMM_SHAPES:+--shapes $GEMM_SHAPES} --dtype bfloat16 --out "$OUT" 2>&1 | tee "$OUT/gemm_bf16.log"
  timeout 120 python3 -m trident.bench.gemm --dtype float16 --out "$OUT/fp16" 2>&1 | tee "$OUT/gemm_fp16.log"
  cp "$OUT/fp16/gemm.json" "$OUT/gemm_fp16.json" 2>/dev/null; rm -rf "$OUT/fp16"
fi
if [ "$what" = diag ] || [ "$what" = diag+tests ]; then
  # Where the time of the patterns goes at one rank: spin variants and parts left out (scripts/diag_spin.py).
  timeout ${DIAG_LIMIT:-150} python3 scripts/diag_spin.py 2>&1 | grep -v Warning | tee "$OUT/diag.log"
  # Per-tile timelines at one rank: do the GEMM programs run side by side while others wait?
  timeout 120 python3 -m trident bench gemm-all-scatter -n 1 --no-progress --trace --shapes 4096x4096x4096 \
    --patterns producer_consumer,workgroup_specialized,fused_sequential --out /tmp/tl 2>&1 | tail -6
  cp /tmp/tl/timeline_*.png "$OUT/" 2>/dev/null; tar -C /tmp/tl -czf "$OUT/timelines.tgz" .
fi
if [ "$what" = streamk ]; then
  set -o pipefail
  timeout ${PYTEST_LIMIT:-240} python3 -m pytest -q -x --backend cuda -p no:cacheprovider --durations=5 \
    tests/test_ops_matmul.py tests/test_trace.py tests/test_ops_gemm_all_scatter.py::test_trace_records_every_tile \
    tests/test_ops_tensor_parallel.py::test_trace_records_every_tile 2>&1 | tee "$OUT/pytest_streamk_cuda.log" | tail -8
  echo "pytest exit: $?"
  timeout ${GEMM_LIMIT:-300} python3 -m trident.bench.gemm --sweep --only ${ONLY:-split_tail=True} --repeats 20 \
    --shapes ${GEMM_SHAPES:-8192x576x36864,8192x448x14336,4096x4096x4096,8192x4608x36864,8192x3584x14336} \
    --dtype bfloat16 --out "$OUT" 2>&1 | grep -v Warning | tee "$OUT/gemm_streamk.log" | tail -14
  python3 - <<'PY' 2>&1 | tee "$OUT/cublas_kernels.log"
import torch
from torch.profiler import ProfilerActivity, profile
for M, N, K in ((8192, 576, 36864), (8192, 448, 14336)):
    A = torch.randn(M, K, device="cuda", dtype=torch.bfloat16); B = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
    torch.matmul(A, B); torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        torch.matmul(A, B); torch.cuda.synchronize()
    print(f"{M}x{N}x{K}:", sorted({e.name for e in prof.events() if e.device_type.name == "CUDA"}))
PY
fi
if [ "$what" = timelines ]; then
  timeout ${BENCH_LIMIT:-200} python3 -m trident bench gemm-all-scatter -n 2 --no-progress --trace --repeats 3 \
    --shapes ${TL_SHAPES:-4096x4096x4096} --out /tmp/tl2 2>&1 | grep -v Warning | tail -12
  tar -C /tmp/tl2 -czf "$OUT/timelines_w2.tgz" .
fi
