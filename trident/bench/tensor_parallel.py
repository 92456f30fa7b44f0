"""``trident bench all-gather-gemm`` / ``gemm-reduce-scatter``: the two halves of a TP MLP against torch + NCCL.

Shapes are ``MxNxK`` as one rank sees its GEMM:

* all_gather_gemm: ``C (M x N) = all_gather(A_local) @ B``, A_local being M/W x K.
* gemm_reduce_scatter: ``A (M x K) @ B (K x N)`` on every rank, summed, M/W rows kept each.

The default GPU shapes are a Llama-3-70B MLP at W = 8 (hidden 8192, FFN 28672: 3584 columns
of the up projection, 3584 rows of the down projection per rank) at 8192 tokens, and a
4096-class square. Per shape: the GEMM alone (``gemm``: ``trident.ops.matmul`` of the rank's
M x N x K product, no communication), ``baseline`` (torch + NCCL; needs a GPU per rank) and
every pattern, each checked, then timed as the median of ``--repeats`` calls, max over ranks.
Output as ``bench gemm-all-scatter``: JSON, table, speedup and breakdown PNGs, and with
``--trace`` one timeline per pattern.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

import torch

import trident
from trident.ops import OP_PATTERNS, matmul

from ..platform import SIMULATOR
from . import arguments, fused_ops, harness
from .fused_ops import report

OPS = ("all_gather_gemm", "gemm_reduce_scatter")
GPU_SHAPES = {"all_gather_gemm": [(8192, 3584, 8192), (4096, 4096, 4096)],
              "gemm_reduce_scatter": [(8192, 8192, 3584), (4096, 4096, 4096)]}


def parse_args(argv=None) -> argparse.Namespace:
    """The benchmark's arguments (``trident bench all-gather-gemm --help``)."""
    parser = argparse.ArgumentParser(prog="trident bench all-gather-gemm|gemm-reduce-scatter", description=__doc__)
    parser.add_argument("--op", choices=OPS, required=True)
    parser.add_argument("--shapes", default=None, help="MxNxK,... (as one rank sees its GEMM; default: see above)")
    parser.add_argument("--patterns", default=None, help="comma-separated (default: all of the op's)")
    parser.add_argument("--dtype", default="bfloat16", choices=["float16", "bfloat16", "float32"])
    parser.add_argument("--comm-programs", type=int, default=None, help="communication programs (ws)")
    parser.add_argument("--trace", action="store_true", help="also record one call of each pattern per shape")
    arguments.add_common_args(parser, "OP", warmup=3, repeats=10)
    parser.set_defaults(out=None)
    args = parser.parse_args(argv)
    args.out = args.out or f"results/{args.op}"
    return args


def _operands(ctx, op: str, M: int, N: int, K: int, dtype):
    """Inputs (the same seed on every rank, so every rank can build the reference), output, reference."""
    w, r = ctx.world_size, ctx.rank
    gen = torch.Generator(device=ctx.device).manual_seed(1)
    if op == "all_gather_gemm":
        A = torch.randn(M, K, device=ctx.device, dtype=dtype, generator=gen)
        B = torch.randn(K, N, device=ctx.device, dtype=dtype, generator=gen)
        A_local = ctx.as_symmetric(A[r * (M // w):(r + 1) * (M // w)])
        return (A_local, B), torch.empty(M, N, device=ctx.device, dtype=dtype), (A, B), torch.matmul(A, B)
    As = torch.randn(w, M, K, device=ctx.device, dtype=dtype, generator=gen) / w ** 0.5  # every rank's A and B
    Bs = torch.randn(w, K, N, device=ctx.device, dtype=dtype, generator=gen)
    want = torch.bmm(As.float(), Bs.float()).sum(0)[r * (M // w):(r + 1) * (M // w)].to(dtype)
    return (As[r].contiguous(), Bs[r].contiguous()), torch.empty(M // w, N, device=ctx.device, dtype=dtype), \
        (As[r], Bs[r]), want


def run(ctx, args) -> dict:
    """Time every pattern of ``args.op`` on every shape (collective); returns the record on every rank."""
    dtype = getattr(torch, args.dtype)
    op = getattr(trident.ops, args.op)
    shapes = fused_ops.shapes_of(args, ctx.platform.simulator, GPU_SHAPES[args.op])
    patterns = [p for p in (args.patterns or ",".join(OP_PATTERNS[args.op])).split(",") if p]
    with_baseline = not ctx.platform.ranks_share_gpus  # the baseline's NCCL needs a GPU per rank
    record = harness.new_record(ctx, args.op.replace("_", "-"),
                                harness.params(args))
    record["copy_bytes_per_s"] = bandwidth = fused_ops.budget_bandwidth(ctx, args)
    for M, N, K in shapes:
        if M % ctx.world_size:
            raise SystemExit(f"shape {M}x{N}x{K}: M must be divisible by the {ctx.world_size} ranks")
        record["rows"] += _shape_rows(ctx, args, op, M, N, K, dtype, patterns, with_baseline, bandwidth)
    return record


def _shape_rows(ctx, args, op, M, N, K, dtype, patterns, with_baseline, bandwidth) -> list[dict]:
    """Check, then time, the GEMM alone and every pattern on one shape (collective)."""
    inputs, out, (A, B), want = _operands(ctx, args.op, M, N, K, dtype)
    reference = torch.empty(M, N, device=ctx.device, dtype=dtype)
    calls: dict[str, Callable[..., object]] = {"gemm": lambda: matmul(A, B, out=reference)}
    for p in patterns:
        if p in ("baseline", "auto") and not with_baseline:
            continue
        calls[p] = lambda p=p: op(ctx, *inputs, out, pattern=p, comm_programs=args.comm_programs)

    def on_call(name):  # --trace: one traced call of the pattern
        fused_ops.record_timeline(ctx, args, lambda trace: op(ctx, *inputs, out, pattern=name,
                                                              comm_programs=args.comm_programs, trace=trace),
                                  name, f"{M}x{N}x{K}")

    times = fused_ops.check_and_time(ctx, args, calls, out, want, f"{M}x{N}x{K}", on_call if args.trace else None)
    return fused_ops.shape_rows(f"{M}x{N}x{K}", 2.0 * M * N * K, times,
                                trident.ops.choose_pattern(ctx, args.op, M, N, K) if "auto" in times else None,
                                fused_ops.budget_for(ctx, args.op, (M, N, K), dtype, bandwidth))


def main(argv=None) -> int:
    """``trident bench all-gather-gemm|gemm-reduce-scatter``: parse ``argv``, run, write the results (rank 0)."""
    args = parse_args(argv)
    if SIMULATOR:
        args.repeats, args.warmup = 2, 1
    what = {"all_gather_gemm": "all-gather + GEMM", "gemm_reduce_scatter": "GEMM + reduce-scatter"}[args.op]
    harness.run_benchmark(args, run, lambda record, out: report(record, out, args.op, what),
                          fused_ops.heap_bytes(fused_ops.shapes_of(args, SIMULATOR, GPU_SHAPES[args.op]), args.dtype))
    return 0


if __name__ == "__main__":
    sys.exit(main())
