#!/usr/bin/env bash
# On the GPU machine, in one call: the matmul sweep against cuBLAS, then (when given) the
# gemm_all_scatter checks with ranks sharing the GPU. Results and logs go to $OUT (or results/).
# Usage: bash scripts/gpu_gemm.sh [gemm|patterns|tests|diag|diag+tests|tp|all]   (SWEEP= : the table's configs only)
#   tp: all_gather_gemm / gemm_reduce_scatter tests on the GPU (ranks sharing it), then both benchmarks
#       and gemm-all-scatter at one rank with --trace (each pattern against the GEMM alone, and timelines)
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
  timeout ${GEMM_LIMIT:-420} python3 -m trident.bench.gemm ${SWEEP---sweep} --dtype bfloat16 --out "$OUT" 2>&1 | tee "$OUT/gemm_bf16.log"
  timeout 120 python3 -m trident.bench.gemm --dtype float16 --out "$OUT/fp16" 2>&1 | tee "$OUT/gemm_fp16.log"
  cp "$OUT/fp16/gemm.json" "$OUT/gemm_fp16.json" 2>/dev/null; rm -rf "$OUT/fp16"
fi
if [ "$what" = diag ] || [ "$what" = diag+tests ]; then
  # Where the time of workgroup_specialized / bulk_synchronous goes at one rank: variants with parts left out.
  # (@triton.jit needs its source in a file: the script is written out first)
  cat > /tmp/gas_diag.py <<'PY'
import torch, triton, triton.language as tl
import trident
from trident.device import wait
from trident.ops import gas_kernels as G
from trident.ops.matmul import pick_config, operands, launch_matmul
from trident.ops.common import sync_state as _sync_state
from trident.ops.tiles import tile_coords, tile_offsets

@triton.jit
def ws_diag(a, b, c, M, N, K, sam, sak, sbk, sbn, scm, gemm_programs, state_ptr, ready_ptr, arrived_ptr, flags_ptr,
            trace_ptr, rank, world_size, heap_bases, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
            GROUP_M: tl.constexpr, WORLD_BLOCK: tl.constexpr, SIGNAL: tl.constexpr, COMM: tl.constexpr,
            WAIT_FLAGS: tl.constexpr, READY_EACH: tl.constexpr, FINISH: tl.constexpr, PLAIN_SPIN: tl.constexpr):
    pid = tl.program_id(0)
    epoch = G.enter_call(state_ptr, ready_ptr, rank, world_size, heap_bases, WORLD_BLOCK)
    if pid < gemm_programs:
        G.produce_tiles(pid, gemm_programs, a, b, c, M, N, K, sam, sak, sbk, sbn, scm, flags_ptr, epoch, trace_ptr,
                        rank, heap_bases, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, True, SIGNAL, False)
    elif COMM:
        num_pid_m = tl.cdiv(M, BLOCK_M)
        num_pid_n = tl.cdiv(N, BLOCK_N)
        if not READY_EACH:
            G.wait_peers_ready(ready_ptr, epoch, rank, world_size, heap_bases)
        for tile in tl.range(pid - gemm_programs, num_pid_m * num_pid_n, tl.num_programs(0) - gemm_programs):
            if PLAIN_SPIN:  # no timer, no abort word in host memory: a bare volatile spin, then a CTA barrier
                seen = tl.load(flags_ptr + tile, volatile=True)
                while seen < epoch:
                    seen = tl.load(flags_ptr + tile, volatile=True)
                tl.debug_barrier()
            elif WAIT_FLAGS:
                wait(flags_ptr + tile, epoch, rank, rank, heap_bases, cmp="ge", scope="gpu")
            pid_m, pid_n = tile_coords(tile, num_pid_m, num_pid_n, GROUP_M)
            offs, mask = tile_offsets(pid_m, pid_n, M, N, scm, 1, BLOCK_M, BLOCK_N)
            v = tl.load(c + offs, mask=mask)
            if READY_EACH:
                G.wait_peers_ready(ready_ptr, epoch, rank, world_size, heap_bases)
            G.scatter_tile(c, offs, mask, v, tile, trace_ptr, rank, world_size, heap_bases, 1, False)
    if FINISH:
        G.finish_call(state_ptr, arrived_ptr, epoch, rank, world_size, heap_bases, WORLD_BLOCK)
    else:
        if pid == 0:
            tl.store(state_ptr, epoch)

ctx = trident.init(heap_size=2 << 30)
def t(fn, n=10):
    for _ in range(3): fn()
    torch.cuda.synchronize(); s, e = torch.cuda.Event(True), torch.cuda.Event(True); ts = []
    for _ in range(n):
        s.record(); fn(); e.record(); e.synchronize(); ts.append(s.elapsed_time(e))
    return sorted(ts)[n // 2]
for M, N, K in ((4096, 4096, 4096), (8192, 3584, 14336)):
    A = torch.randn(M, K, device="cuda", dtype=torch.bfloat16); B = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
    C = ctx.zeros(M, N, dtype=torch.bfloat16); cfg = pick_config(M, N, K, torch.bfloat16, "cuda")
    sync = _sync_state(ctx); tiles = triton.cdiv(M, cfg.BLOCK_M) * triton.cdiv(N, cfg.BLOCK_N); flags = sync.tile_flags(tiles)
    a, b, _ = operands(A, B, cfg)
    res = {"gemm": t(lambda: launch_matmul(A, B, C, cfg))}
    for p in ("bulk_synchronous", "producer_consumer", "fused_sequential", "workgroup_specialized"):
        res[p] = t(lambda p=p: trident.ops.gemm_all_scatter(ctx, A, B, C, pattern=p))
    res["ws comm=4"] = t(lambda: trident.ops.gemm_all_scatter(ctx, A, B, C, pattern="workgroup_specialized", comm_programs=4))
    common = dict(rank=0, world_size=1, heap_bases=ctx.heap_bases, BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N, GROUP_M=8, WORLD_BLOCK=1)
    for g in (132, 16):
        res[f"scatter alone grid={g}"] = t(lambda g=g: G.scatter_kernel[(g,)](C, M, N, C.stride(0), sync.state, sync.ready, sync.arrived, flags, sync.state, WAIT_FLAGS=False, TRACE=False, num_warps=8, **common))
    variants = {"all on": {}, "no comm": dict(COMM=False), "no flag wait": dict(WAIT_FLAGS=False), "ready once": dict(READY_EACH=False),
                "no signal+no wait": dict(SIGNAL=False, WAIT_FLAGS=False), "no finish": dict(FINISH=False),
                "no comm no finish": dict(COMM=False, FINISH=False), "plain spin": dict(PLAIN_SPIN=True)}
    for name, v in variants.items():
        kw = dict(SIGNAL=True, COMM=True, WAIT_FLAGS=True, READY_EACH=True, FINISH=True, PLAIN_SPIN=False); kw.update(v)
        for comm in (16,):
            res[f"ws_diag {name}"] = t(lambda kw=kw, comm=comm: ws_diag[(132,)](a, b, C, M, N, K, A.stride(0), A.stride(1), B.stride(0), B.stride(1), C.stride(0), 132 - comm, sync.state, sync.ready, sync.arrived, flags, sync.state, BLOCK_K=cfg.BLOCK_K, num_warps=cfg.num_warps, num_stages=cfg.num_stages, **common, **kw))
    for k, v in res.items(): print(f"{M}x{N}x{K} {k:32s} {v:9.3f} ms", flush=True)
ctx.close()
PY
  timeout ${DIAG_LIMIT:-150} python3 /tmp/gas_diag.py 2>&1 | grep -v Warning | tee "$OUT/diag.log"
  # Per-tile timelines at one rank: do the GEMM programs run side by side while others wait?
  timeout 120 python3 -m trident bench gemm-all-scatter -n 1 --no-progress --trace --shapes 4096x4096x4096 \
    --patterns producer_consumer,workgroup_specialized,fused_sequential --out /tmp/tl 2>&1 | tail -6
  cp /tmp/tl/timeline_*.png /tmp/tl/gemm_all_scatter.json "$OUT/" 2>/dev/null
fi
