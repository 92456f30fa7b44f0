"""How much heap a prefill-sized MoE dispatch and combine use per rank (a memory check for issue 31).

With ``max_tokens_per_rank=None`` (prefill) and no ``capacity``, the ranks exchange their counts on
the host and the receive buffers take the most rows any rank receives, rounded up
(``trident.ops.moe.sizing.prefill_capacity``), instead of the worst case ``W * M * k``. This script
gives every rank a heap of a fixed budget (``--heap-gib``, 1.5 by default: below DeepEP's usual 2e9
bytes), runs a bf16 dispatch and combine and an fp8 dispatch with scales at DeepSeek-V3 sizes with
uniform routing, checks the combine (identity experts: each token comes back times its weights' sum),
and reports per rank the rows received, the capacity taken, the heap's peak use and what
``trident.ops.moe_heap_bytes`` predicts for that capacity. A call that does not fit raises
``HeapExhaustedError`` naming the buffer.

    trident run -n 8 --mps benchmarks/moe_prefill_heap.py --out results/moe_prefill_heap   # 8 ranks, one GPU
"""

from __future__ import annotations

import argparse
import sys

import torch

import trident
from trident.bench import arguments, harness
from trident.bench.moe import MODELS, inputs


def run(ctx, args) -> dict:
    """Dispatch and combine once per dtype at prefill (collective); returns the record."""
    record = harness.new_record(ctx, "moe_prefill_heap", harness.params(args))
    hidden, k, experts = MODELS[args.model]
    x, x8, scales, idx, weights = inputs(ctx, args.tokens, hidden, k, experts, seed=1)
    d = trident.ops.moe_dispatch(ctx, x, idx, experts)  # max_tokens_per_rank=None: sized by the real counts
    got = trident.ops.moe_combine(ctx, d.recv_x, weights, d).float()
    correct = bool(torch.allclose(got, x.float() * weights.sum(1, keepdim=True), rtol=3e-2, atol=3e-2))
    received, capacity = int(d.recv_counts.sum()), d.recv_x.shape[0]
    d8 = trident.ops.moe_dispatch(ctx, x8, idx, experts, x_scales=scales)
    correct &= int(d8.recv_counts.sum()) == received
    ctx.barrier()
    stats = ctx.memory_stats()
    predicted = trident.ops.moe_heap_bytes(args.tokens, hidden, k, experts, ctx.world_size, torch.bfloat16,
                                           fp8_scales=True, capacity=capacity)
    mine = {"rank": ctx.rank, "tokens": args.tokens, "received_rows": received, "capacity": capacity,
            "worst_case_rows": ctx.world_size * args.tokens * k,
            "peak_mib": stats["peak_allocated_bytes"] / 2**20, "predicted_mib": predicted / 2**20,
            "heap_mib": stats["heap_size"] / 2**20}
    record["rows"] = harness.all_values(ctx, mine)
    record["all_correct"] = all(harness.all_values(ctx, correct))
    return record


def report(record: dict, out: str) -> list[str]:
    """Write the JSON and print the table; returns the files written."""
    columns = [("rank", "rank", "d"), ("tokens", "tokens", "d"), ("received_rows", "rows received", "d"),
               ("capacity", "capacity", "d"), ("worst_case_rows", "worst case", "d"),
               ("peak_mib", "peak MiB", ".1f"), ("predicted_mib", "moe_heap_bytes MiB", ".1f"),
               ("heap_mib", "heap MiB", ".1f")]
    return harness.write_report(record, out, columns, wrong="the combine gave a wrong result")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="moe_prefill_heap.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=list(MODELS), default="deepseek-v3")
    parser.add_argument("--tokens", type=int, default=4096, help="tokens per rank")
    parser.add_argument("--heap-gib", type=float, default=1.5, help="each rank's whole heap, GiB")
    arguments.add_common_args(parser, "moe_prefill_heap", warmup=0, repeats=1)
    return parser.parse_args(argv)


def sim_sizes(args) -> None:
    """The simulator checks the script, not the sizes: the tiny model, a few tokens, a 16 MiB heap."""
    args.model, args.tokens, args.heap_gib = "tiny", min(args.tokens, 16), 1 / 64


def main(argv=None) -> int:
    record = harness.bench_main(argv, parse_args, run, report, lambda args: int(args.heap_gib * 2**30), sim_sizes)
    return 0 if record["all_correct"] else 1


if __name__ == "__main__":
    sys.exit(main())
