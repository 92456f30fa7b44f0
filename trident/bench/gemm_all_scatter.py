"""``trident bench gemm-all-scatter``: every GEMM + all-scatter pattern against the baseline.

For each shape (M x N x K, N counting every rank's columns) and pattern: warm-up, then the median
of ``--repeats`` calls timed with CUDA events, taken as the maximum over ranks. Two reference
rows per shape: ``gemm`` (``trident.ops.matmul`` on this rank's shard alone, no communication:
what the GEMM costs) and ``baseline`` (torch.matmul + all_gather + layout fix; needs one GPU per
rank). Output: JSON, a table (time, speedup over baseline, and the time over the GEMM alone), a
PNG of the speedups and a stacked GEMM / exposed-communication breakdown per pattern.

With one rank (``trident bench gemm-all-scatter -n 1``) every pattern's extra time over ``gemm``
is the cost of the communication machinery itself. Ranks sharing a GPU check correctness only.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

import torch

import trident
from trident.ops import PATTERNS, matmul

from ..platform import SIMULATOR
from . import arguments, fused_ops, harness
from .fused_ops import report

GPU_SHAPES = [(8192, 4608, 36864), (8192, 3584, 14336), (4096, 4096, 4096), (4096, 8192, 8192)]


def parse_args(argv=None) -> argparse.Namespace:
    """The benchmark's arguments (``trident bench gemm-all-scatter --help``)."""
    parser = argparse.ArgumentParser(prog="trident bench gemm-all-scatter", description=__doc__)
    parser.add_argument("--shapes", default=None, help="MxNxK,... (N: all ranks' columns; default: paper shapes)")
    parser.add_argument("--patterns", default=",".join(p for p in PATTERNS), help="comma-separated")
    parser.add_argument("--dtype", default="bfloat16", choices=["float16", "bfloat16", "float32"])
    parser.add_argument("--comm-programs", type=int, default=None, help="communication programs (pc, ws)")
    parser.add_argument("--trace", action="store_true",
                        help="also record one call of each pattern per shape: Perfetto JSON + PNG timeline")
    arguments.add_common_args(parser, "gemm_all_scatter", warmup=3, repeats=10)
    return parser.parse_args(argv)


def run(ctx, args) -> dict:
    """Time every pattern on every shape (collective); returns the record on every rank."""
    dtype = getattr(torch, args.dtype)
    w = ctx.world_size
    shapes = fused_ops.shapes_of(args, ctx.platform.simulator, GPU_SHAPES)
    patterns = [p for p in args.patterns.split(",") if p]
    with_baseline = not ctx.platform.ranks_share_gpus  # the baseline's NCCL needs a GPU per rank
    record = harness.new_record(ctx, "gemm-all-scatter", harness.params(args))
    record["copy_bytes_per_s"] = bandwidth = fused_ops.budget_bandwidth(ctx, args)
    for M, N, K in shapes:
        if N % w:
            raise SystemExit(f"shape {M}x{N}x{K}: N must be divisible by the {w} ranks")
        record["rows"] += _shape_rows(ctx, args, M, N, K, dtype, patterns, with_baseline, bandwidth)
    return record


def _shape_rows(ctx, args, M, N, K, dtype, patterns, with_baseline, bandwidth) -> list[dict]:
    """Check, then time, the GEMM alone and every pattern on one shape (collective)."""
    n = N // ctx.world_size
    gen = torch.Generator(device=ctx.device).manual_seed(1)
    A = torch.randn(M, K, device=ctx.device, dtype=dtype, generator=gen)
    B = torch.randn(K, N, device=ctx.device, dtype=dtype, generator=gen)  # the same B on every rank
    B_local = B[:, ctx.rank * n:(ctx.rank + 1) * n].contiguous()
    want = torch.matmul(A, B)
    C, local = ctx.empty(M, N, dtype=dtype), torch.empty(M, n, device=ctx.device, dtype=dtype)
    calls: dict[str, Callable[..., object]] = {"gemm": lambda: matmul(A, B_local, out=local)}
    for p in patterns:
        if p in ("baseline", "auto") and not with_baseline:
            continue
        calls[p] = lambda p=p: trident.ops.gemm_all_scatter(ctx, A, B_local, C, pattern=p,
                                                            comm_programs=args.comm_programs)
    def on_call(name):  # --trace: one traced call of the pattern
        fused_ops.record_timeline(ctx, args, lambda trace: trident.ops.gemm_all_scatter(
            ctx, A, B_local, C, pattern=name, comm_programs=args.comm_programs, trace=trace),
            name, f"{M}x{N}x{K}")

    times = fused_ops.check_and_time(ctx, args, calls, C, want, f"{M}x{N}x{K}", on_call if args.trace else None)
    ctx.free(C)
    chosen = trident.ops.choose_pattern(ctx, "gemm_all_scatter", M, N, K) if "auto" in times else None
    return fused_ops.shape_rows(f"{M}x{N}x{K}", 2.0 * M * N * K, times, chosen,
                                fused_ops.budget_for(ctx, "gemm_all_scatter", (M, N, K), dtype, bandwidth))


def main(argv=None) -> int:
    """``trident bench gemm-all-scatter``: parse ``argv``, run, write the results (rank 0); returns the exit code."""
    args = parse_args(argv)
    if SIMULATOR:
        args.repeats, args.warmup = 2, 1
    heap = fused_ops.heap_bytes(fused_ops.shapes_of(args, SIMULATOR, GPU_SHAPES), args.dtype)
    harness.run_benchmark(args, run, report, heap)
    return 0


if __name__ == "__main__":
    sys.exit(main())
