#!/usr/bin/env bash
# First look on a GPU machine: versions, the examples at 2 and 4 ranks sharing the GPU, the benchmark.
set -u
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TRIDENT_BACKEND=cuda
OUT=${OUT:-results}
mkdir -p "$OUT"
python3 -c "import torch, triton, cuda.bindings; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda-bindings', cuda.bindings.__version__)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
for n in 2 4; do
  for e in demo load_store put_get atomics message_passing; do
    echo "== $e n=$n"; timeout 120 python3 -m trident run -n $n examples/$e.py 2>&1 | tail -4
  done
done
timeout 300 python3 benchmarks/device_api_bandwidth.py --out "$OUT" 2>&1 | tail -20
