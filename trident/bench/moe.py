"""``trident bench moe``: expert-parallel dispatch and combine, trident's against the usual torch path.

Shapes: DeepSeek-V3 (hidden 7168, top-8 of 256 experts), 128 tokens per rank (decode) and 4096
(prefill); routing uniform at random (k distinct experts per token, seeded per rank). Measured in
the same run:

* ``trident``: ``trident.ops.moe_dispatch`` (bf16; fp8 e4m3 with [T, H/128] scales; and bf16
  quantized to fp8 on the way, ``quantize="fp8"``, dtype ``bf16->fp8``) with
  ``max_tokens_per_rank`` given (no host sync), then ``moe_combine`` (bf16) of the dispatched rows
  (identity experts); eagerly and inside a CUDA graph;
* ``trident masked``: the same with ``layout="masked"`` (a region of ``W * T`` rows per local expert,
  no count exchange: the decode path), at token counts up to ``--masked-tokens`` (its region grows
  with ``W * T``);
* ``torch``: the usual path over NCCL: each rank sorts its (token, j) rows by expert, sends the
  counts with ``all_to_all_single``, reads them on the host, sends the rows (with their expert ids
  and, for fp8, their scales) with ``all_to_all_single``; combine sends the rows back the same way
  and sums them at home with ``index_add_`` in fp32. Eager only: the host reads the counts, so it
  cannot be captured. The receiver does not regroup rows by expert (less work than trident's).

Reported per row: device time (slowest rank), host time per call, the memory-bound floor (the
fewest bytes the op reads and writes on a rank, at the bandwidth of a plain device copy measured in
the same run) and the time over it, and GB/s: the bytes moved, per
second, counted as DeepEP's tests count them: every routed (token, j) row (with its scales) that
lands in a receive buffer, local rows included (so one rank reports GB/s too), averaged over
ranks; the combine moves the same rows back. With ranks sharing a GPU (``--mps``) only trident is
timed, for latency. The heap is sized by ``trident.ops.moe_heap_bytes`` for the largest case,
which runs once, untimed, before the rest, so the workspace never grows in between.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist

import trident
import trident.ops

from ..platform import SIMULATOR
from . import arguments, harness, plots

#: (hidden, top-k, experts) per model.
MODELS = {"deepseek-v3": (7168, 8, 256), "tiny": (128, 2, 8)}
FP8 = torch.float8_e4m3fn


def inputs(ctx, tokens: int, hidden: int, k: int, experts: int, seed: int):
    """x (bf16), its fp8 version and scales, routing [T, k] (distinct experts) and weights, on the device
    (also ``trident bench latency``'s MoE rows).

    Example::

        x, x8, scales, idx, weights = inputs(ctx, 128, 7168, 8, 256, seed=0)
    """
    gen = torch.Generator().manual_seed(1000 * seed + ctx.rank)
    x = torch.randn(tokens, hidden, generator=gen)
    idx = torch.rand(tokens, experts, generator=gen).topk(k, dim=1).indices
    weights = torch.rand(tokens, k, generator=gen)
    scales = x.abs().reshape(tokens, hidden // 128, 128).amax(-1).clamp(min=1e-4) / 448.0
    fp8 = (x / scales.repeat_interleave(128, dim=1)).to(FP8)
    dev = ctx.device
    return x.to(dev, torch.bfloat16), fp8.to(dev), scales.to(dev), idx.to(dev), weights.to(dev)


def _routed_rows(idx: torch.Tensor) -> int:
    """Routed (token, j) rows this rank sends, to itself included (the rows a dispatch moves)."""
    return int((idx >= 0).sum())


class TorchPath:
    """Dispatch and combine with ``all_to_all_single`` (NCCL): counts, host read, rows; and back."""

    def __init__(self, ctx, experts: int):
        self.ctx, self.experts = ctx, experts

    def dispatch(self, x, idx, scales=None):
        """Rows sorted by expert, counts exchanged and read on the host, rows (ids, scales) exchanged."""
        world, tokens, k = self.ctx.world_size, idx.shape[0], idx.shape[1]
        flat = idx.reshape(-1)
        order = flat.argsort(stable=True)
        order = order[flat[order] >= 0]
        token = order // k
        send_counts = torch.bincount(flat[order] // (self.experts // world), minlength=world)
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts)
        send, recv = send_counts.tolist(), recv_counts.tolist()  # the host sync of this path
        rows = x.view(torch.uint8)[token] if x.dtype == FP8 else x[token]
        out = rows.new_empty(sum(recv), rows.shape[1])
        dist.all_to_all_single(out, rows, recv, send)
        ids = flat.new_empty(sum(recv))
        dist.all_to_all_single(ids, flat[order], recv, send)
        if scales is not None:
            got = scales.new_empty(sum(recv), scales.shape[1])
            dist.all_to_all_single(got, scales[token], recv, send)
        self.state = (order, token, send, recv, tokens)
        return out

    def combine(self, expert_out, weights):
        """The rows back (the dispatch's splits reversed), summed at home with their weights in fp32."""
        order, token, send, recv, tokens = self.state
        back = expert_out.new_empty(sum(send), expert_out.shape[1])
        dist.all_to_all_single(back, expert_out, send, recv)
        out = torch.zeros(tokens, expert_out.shape[1], device=expert_out.device, dtype=torch.float32)
        out.index_add_(0, token, back.float() * weights.reshape(-1)[order, None])
        return out.to(expert_out.dtype)


def _graph(fn, calls: int):
    """A CUDA graph of ``calls`` calls of ``fn()`` (after one eager call, which sizes every buffer)."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    return graph


def _time(ctx, args, fn, row: dict, moved_bytes: int, graph: bool, floor: tuple[int, float]) -> list[dict]:
    """Rows for ``fn`` eagerly (and in a CUDA graph when ``graph``), timed on every rank at once.
    ``floor``: ``(the fewest bytes the op must read and write on this rank, the copy bandwidth)``."""
    ctx.barrier()
    t = harness.measure(ctx.platform.timing_device, fn, args.warmup, args.repeats)
    ctx.barrier()
    mean_bytes = sum(harness.all_values(ctx, moved_bytes)) / ctx.world_size
    floor_us = max(harness.all_values(ctx, floor[0])) / floor[1] * 1e6
    rows = [{**row, "mode": "eager", "time_us": harness.max_over_ranks(ctx, t.device_ms) * 1e3,
             "host_us": harness.max_over_ranks(ctx, t.host_ms) * 1e3}]
    if graph:
        g = _graph(fn, args.graph_calls)
        ctx.barrier()
        ms = harness.time_ms(ctx, g.replay, 1, args.repeats)
        ctx.barrier()
        rows.append({**rows[0], "mode": "cuda graph", "host_us": None,
                     "time_us": harness.max_over_ranks(ctx, ms) * 1e3 / args.graph_calls})
    for r in rows:
        r["gbps"] = mean_bytes / (r["time_us"] * 1e-6) / 1e9 if r["time_us"] > 0 else None
        r["floor_us"], r["vs_floor"] = floor_us, r["time_us"] / floor_us if floor_us > 0 else None
    return rows


def _layouts(args, tokens: int) -> tuple[str, ...]:
    """The dispatch layouts timed at ``tokens`` per rank: the masked one only up to ``--masked-tokens``."""
    return ("contiguous", "masked") if tokens <= args.masked_tokens else ("contiguous",)


def _case(ctx, args, model: str, tokens: int) -> tuple[list[dict], bool]:
    """Every row of one model and token count, and whether trident's combines gave the expected result."""
    hidden, k, experts = MODELS[model]
    x, x8, scales, idx, weights = inputs(ctx, tokens, hidden, k, experts, seed=tokens)
    ops, graphs, rows, correct = trident.ops, not ctx.platform.simulator, [], True
    routed = _routed_rows(idx)
    base = {"model": model, "tokens": tokens}
    # The floor: the fewest bytes each op reads and writes (dispatch: its T rows in, every routed row out;
    # combine: every routed row in, T rows out), at the bandwidth of a same-run copy of the routed rows.
    bandwidth = harness.copy_bandwidth(ctx, args, routed * hidden * 2)
    torch_path = TorchPath(ctx, experts) if ctx.platform.nccl_usable else None
    for layout in _layouts(args, tokens):
        impl = "trident" if layout == "contiguous" else f"trident {layout}"
        for dtype, xs, sc, quantize in (("fp8", x8, scales, None), ("bf16->fp8", x, None, "fp8"),
                                        ("bf16", x, None, None)):
            in_bytes = hidden * xs.element_size() + (0 if sc is None else sc.shape[1] * 4)  # a row read
            scale_bytes = hidden // 128 * 4 if sc is not None or quantize else 0
            row_bytes = hidden * (1 if quantize else xs.element_size()) + scale_bytes  # a received row
            row = {**base, "op": "dispatch", "dtype": dtype}
            floor = (tokens * in_bytes + routed * row_bytes, bandwidth)
            rows += _time(ctx, args, lambda xs=xs, sc=sc, layout=layout, quantize=quantize: ops.moe_dispatch(
                ctx, xs, idx, experts, x_scales=sc, max_tokens_per_rank=tokens, layout=layout, quantize=quantize),
                {**row, "impl": impl}, routed * row_bytes, graphs, floor)
            if torch_path is not None and layout == "contiguous" and quantize is None:
                rows += _time(ctx, args, lambda xs=xs, sc=sc: torch_path.dispatch(xs, idx, sc),
                              {**row, "impl": "torch"}, routed * row_bytes, False, floor)
        d = ops.moe_dispatch(ctx, x, idx, experts, max_tokens_per_rank=tokens, layout=layout)
        row = {**base, "op": "combine", "dtype": "bf16"}
        floor = ((routed + tokens) * hidden * 2, bandwidth)
        rows += _time(ctx, args, lambda d=d: ops.moe_combine(ctx, d.recv_x, weights, d), {**row, "impl": impl},
                      routed * hidden * 2, graphs, floor)
        got = ops.moe_combine(ctx, d.recv_x, weights, d).float()  # identity experts: x times its weights' sum
        correct &= bool(torch.allclose(got, x.float() * weights.sum(1, keepdim=True), rtol=3e-2, atol=3e-2))
    if torch_path is not None:
        expert_out = torch_path.dispatch(x, idx)
        rows += _time(ctx, args, lambda: torch_path.combine(expert_out, weights), {**row, "impl": "torch"},
                      routed * hidden * 2, False, floor)
    return rows, all(harness.all_values(ctx, correct))


def _presize(ctx, args) -> None:
    """The largest case of each layout once, untimed (bf16 and fp8 dispatch, combine): the workspace
    takes its final size first, as ``moe_heap_bytes`` assumes, and no buffer grows (leaving a hole) later."""
    for layout, tokens in _largest(args):
        model = max(args.models, key=lambda m: _need(m, tokens, ctx.world_size, layout))
        hidden, k, experts = MODELS[model]
        x, x8, scales, idx, weights = inputs(ctx, tokens, hidden, k, experts, seed=0)
        d = trident.ops.moe_dispatch(ctx, x, idx, experts, max_tokens_per_rank=tokens, layout=layout)  # bf16 first
        trident.ops.moe_combine(ctx, d.recv_x, weights, d)
        trident.ops.moe_dispatch(ctx, x8, idx, experts, x_scales=scales, max_tokens_per_rank=tokens, layout=layout)
    ctx.barrier()


def run(ctx, args) -> dict:
    """Time every op of every model and token count (collective); returns the record on every rank."""
    record = harness.new_record(ctx, "moe", harness.params(args))
    correct = True
    _presize(ctx, args)
    for model in args.models:
        if MODELS[model][2] % ctx.world_size:
            raise ValueError(f"{model}: {MODELS[model][2]} experts do not split over {ctx.world_size} ranks")
        for tokens in harness.progress(args.tokens, ctx, args, model):
            rows, ok = _case(ctx, args, model, tokens)
            record["rows"] += rows
            correct &= ok
    for row in record["rows"]:
        row["case"] = f"{row['op']} {row['dtype']}, {row['tokens']} tok"
        row["series"] = f"{row['impl']} {row['mode']}"
        ref = next((r["time_us"] for r in record["rows"] if r["impl"] == "torch" and r["op"] == row["op"]
                    and r["dtype"] == row["dtype"] and r["model"] == row["model"] and r["tokens"] == row["tokens"]),
                   None)
        row["speedup_vs_torch"] = ref / row["time_us"] if ref else None
    record["all_correct"] = correct
    return record


def parse_args(argv=None) -> argparse.Namespace:
    """The benchmark's arguments (``trident bench moe --help``)."""
    parser = argparse.ArgumentParser(prog="trident bench moe", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=["deepseek-v3"])
    parser.add_argument("--tokens", nargs="+", type=int, default=[128, 4096], help="tokens per rank")
    parser.add_argument("--graph-calls", type=int, default=10, help="calls captured in one CUDA graph")
    parser.add_argument("--masked-tokens", type=int, default=256,
                        help="time the masked layout (the decode path) at token counts up to this")
    arguments.add_common_args(parser, "moe", warmup=3, repeats=10)
    return parser.parse_args(argv)


def sim_sizes(args) -> None:
    """The simulator checks the benchmark, not the speed: the tiny model, few tokens, few repeats."""
    args.models, args.tokens = ["tiny"], [t for t in args.tokens if t <= 8] or [4, 8]
    args.repeats, args.warmup = min(args.repeats, 2), min(args.warmup, 1)


def _largest(args) -> list[tuple[str, int]]:
    """``(layout, tokens)`` of each layout's largest case."""
    masked = [t for t in args.tokens if t <= args.masked_tokens]
    return [("contiguous", max(args.tokens))] + ([("masked", max(masked))] if masked else [])


def _need(model: str, tokens: int, world_size: int, layout: str) -> int:
    hidden, k, experts = MODELS[model]
    return trident.ops.moe_heap_bytes(tokens, hidden, k, experts, world_size, torch.bfloat16, fp8_scales=True,
                                      layout=layout)


def heap_bytes(args, world_size: int) -> int:
    """The heap for the largest case of each layout: ``trident.ops.moe_heap_bytes`` (bf16 and fp8 with
    scales), their sum (the two share buffers that the second grows: the first's room stays a hole),
    and 256 MiB for everything else (16 MiB in the simulator, whose tiny model needs little)."""
    need = sum(max(_need(m, tokens, world_size, layout) for m in args.models) for layout, tokens in _largest(args))
    return need + ((16 << 20) if SIMULATOR else (256 << 20))


def report(record: dict, out: str) -> list[str]:
    """Write the JSON and the plot into ``out`` and print the table; returns the files written."""
    columns = [("model", "model", ""), ("tokens", "tokens", "d"), ("op", "op", ""), ("dtype", "dtype", ""),
               ("impl", "impl", ""), ("mode", "mode", ""), ("time_us", "device us", ".1f"),
               ("host_us", "host us", ".1f"), ("gbps", "GB/s", ".1f"), ("floor_us", "floor us", ".1f"),
               ("vs_floor", "x floor", ".2f"), ("speedup_vs_torch", "vs torch", ".2f")]
    def plot(tokens):  # one figure per token count: decode and prefill times differ by orders of magnitude
        rows = {**record, "rows": [r for r in record["rows"] if r["tokens"] == tokens]}
        return plots.bars(rows, f"{out}/moe_{tokens}.png", "case", "series", "time_us", "device time (us)",
                          f"MoE dispatch and combine, {tokens} tokens per rank (dashed: the torch path)",
                          reference="torch eager", ratio="faster")

    def floor_plot():  # every case against its memory-bound floor: the line at 1.0 is the floor itself
        return plots.bars(record, f"{out}/moe_floor.png", "case", "series", "vs_floor", "time / memory-bound floor",
                          "MoE dispatch and combine over their memory-bound floor (dashed: the floor)",
                          reference=1.0)

    tokens = sorted({r["tokens"] for r in record["rows"]})
    return harness.write_report(record, out, columns, wrong="trident's combine gave a wrong result",
                                plots=[*(lambda t=t: plot(t) for t in tokens), floor_plot])


def main(argv=None) -> int:
    """Run ``trident bench moe`` on this rank (``trident bench moe -n N`` starts the ranks); returns 0."""
    world = int(os.environ.get("WORLD_SIZE", "1"))  # set by the launcher; trident.init comes after the heap size
    harness.bench_main(argv, parse_args, run, report, lambda args: heap_bytes(args, world), sim_sizes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
