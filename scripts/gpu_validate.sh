#!/usr/bin/env bash
# On a GPU machine: the whole test suite on the cuda backend (ranks sharing the GPUs), then the
# examples at 2 and 4 ranks and the device-API benchmark. Logs and results go to $OUT (or results/).
# Usage: bash scripts/gpu_validate.sh [tests|examples|all]
set -u
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TRIDENT_BACKEND=cuda
OUT=${OUT:-results}
mkdir -p "$OUT"
what=${1:-all}
python3 -c "import torch, triton, cuda.bindings; print('torch', torch.__version__, '| triton', triton.__version__, '| cuda-bindings', cuda.bindings.__version__)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
if [ "$what" = tests ] || [ "$what" = all ]; then
  set -o pipefail
  timeout ${PYTEST_LIMIT:-540} python3 -m pytest -q --timeout 200 -p no:cacheprovider --backend cuda -rs --durations=10 ${PYTEST_ARGS:-} ${TESTS:-} 2>&1 | tee "$OUT/pytest_cuda.log"
  echo "pytest exit: $?"
fi
if [ "$what" = examples ] || [ "$what" = all ]; then
  for n in ${EXAMPLE_RANKS:-2 4}; do
    for e in ${EXAMPLES:-demo load_store put_get atomics message_passing}; do
      echo "== examples/$e.py on $n ranks"
      timeout 120 python3 -m trident run -n $n examples/$e.py 2>&1 | grep -v "destroy_process_group\|^$" | tail -4
    done
  done 2>&1 | tee "$OUT/examples_cuda.log"
  timeout 300 python3 benchmarks/device_api_bandwidth.py --out "$OUT" 2>&1 | tee "$OUT/bench.log" | tail -16
fi
if [ "$what" = ccl ] || [ "$what" = all ]; then
  for n in ${CCL_RANKS:-2 4}; do
    timeout 150 python3 -m trident bench ccl -n $n --max-bytes ${CCL_MAX_BYTES:-16777216} --repeats 10 \
      --out "$OUT/ccl_$n" 2>&1 | grep -v "destroy_process_group" | tail -45
  done 2>&1 | tee "$OUT/ccl_bench.log"
fi
