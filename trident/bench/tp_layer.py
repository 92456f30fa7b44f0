"""``trident bench tp-layer``: a tensor-parallel Llama decoder layer, trident's inference ops against torch + NCCL.

The layer (as in ``examples/tensor_parallel_decoder.py``): RMSNorm, column-parallel QKV, grouped-KV
causal attention on this rank's heads, row-parallel O projection, column-parallel gate/up with SiLU,
row-parallel down projection. Its two all-reduces are, in the ``trident`` layer,
``all_reduce_rmsnorm`` (all-reduce + residual + RMSNorm, one kernel) and ``gemm_all_reduce``; in
the ``torch`` layer, ``torch.matmul`` + ``torch.distributed.all_reduce`` (NCCL) + torch ops. Sizes:
Llama-3-70B or 8B split over the world size; tokens from decode (1-128) to prefill (2048, 8192).
Each is timed eagerly and inside a CUDA graph (GPU), reporting device time and host time per call.
``trident_zero_copy`` is the trident layer with its O projection written into a heap buffer made
inside ``ctx.heap_allocations()`` (docs/pytorch.md, "Zero copy"), so its all-reduce stages nothing.
``local`` is the same layer with no communication at all (what one rank alone would run): the floor
the others are compared with (``vs_local``). On a GPU each layer's eager call is also profiled once
(torch.profiler): ``kernels`` launched and ``copies`` among them (memcpy or copy kernels, where a
staging copy would show; the JSON's ``copy_kernels`` names them). The torch layer needs NCCL (a GPU
per rank); with ranks sharing a GPU only trident's and the local layer are timed.
"""

from __future__ import annotations

import argparse
import sys
from functools import partial

import torch
import torch.distributed as dist
import torch.nn.functional as F

import trident

from ..platform import SIMULATOR
from . import arguments, harness, plots

#: (hidden, intermediate, heads, KV heads, head dim) per model.
MODELS = {"70b": (8192, 28672, 64, 8, 128), "8b": (4096, 14336, 32, 8, 128), "tiny": (64, 128, 8, 4, 8)}


def _rmsnorm(x, weight, eps=1e-6):
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)


class Layer:
    """One rank's shards of a decoder layer, and the layer run with trident's ops or with torch + NCCL."""

    def __init__(self, ctx, model: str, dtype: torch.dtype):
        hidden, ffn, heads, kv_heads, self.head_dim = MODELS[model]
        w = ctx.world_size
        if heads % w or kv_heads % w or ffn % w:
            raise ValueError(f"{model}: {heads} heads, {kv_heads} KV heads and {ffn} do not split over {w} ranks")
        self.ctx, self.heads, self.kv_heads = ctx, heads // w, kv_heads // w
        gen = torch.Generator(device="cpu").manual_seed(ctx.rank)

        def weight(rows, cols):
            return (torch.randn(rows, cols, generator=gen) / rows ** 0.5).to(ctx.device, dtype)

        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        self.ln1 = torch.ones(hidden, device=ctx.device, dtype=dtype)
        self.ln2 = torch.ones(hidden, device=ctx.device, dtype=dtype)
        self.qkv, self.o = weight(hidden, q + 2 * kv), weight(q, hidden)
        self.gate_up, self.down = weight(hidden, 2 * ffn // w), weight(ffn // w, hidden)
        self.partials: dict[int, torch.Tensor] = {}  # the zero-copy layer's heap buffers, by token count

    def _attention(self, x):
        T, hd = x.shape[0], self.head_dim
        q, k, v = (_rmsnorm(x, self.ln1) @ self.qkv).split(
            [self.heads * hd, self.kv_heads * hd, self.kv_heads * hd], dim=-1)
        q, k, v = (t.view(T, -1, hd).transpose(0, 1) for t in (q, k, v))
        k, v = (t.repeat_interleave(self.heads // self.kv_heads, dim=0) for t in (k, v))
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(0, 1).reshape(T, -1)

    def _mlp_input(self, out):
        gate, up = (out @ self.gate_up).chunk(2, dim=-1)
        return (F.silu(gate) * up).contiguous()

    def trident(self, x):
        """The layer with ``all_reduce_rmsnorm`` and ``gemm_all_reduce`` (collective)."""
        out, h = trident.ops.all_reduce_rmsnorm(self.ctx, self._attention(x) @ self.o, self.ln2, residual=x)
        mlp = torch.empty_like(x)
        trident.ops.gemm_all_reduce(self.ctx, self._mlp_input(out), self.down, mlp)
        return h + mlp

    def trident_zero_copy(self, x):
        """The trident layer with the O projection written into a heap buffer (made once per token count
        inside ``ctx.heap_allocations()``, as a serving stack keeps its activation buffers): the
        all-reduce reads it in place, with no staging copy (collective)."""
        T, hidden = x.shape
        if T not in self.partials:
            with self.ctx.heap_allocations():
                self.partials[T] = torch.empty(T, hidden, device=x.device, dtype=x.dtype)
        partial = torch.matmul(self._attention(x), self.o, out=self.partials[T])
        out, h = trident.ops.all_reduce_rmsnorm(self.ctx, partial, self.ln2, residual=x)
        mlp = torch.empty_like(x)
        trident.ops.gemm_all_reduce(self.ctx, self._mlp_input(out), self.down, mlp)
        return h + mlp

    def local(self, x):
        """The same layer with no communication (this rank's shards alone): the others' floor."""
        h = x + self._attention(x) @ self.o
        return h + self._mlp_input(_rmsnorm(h, self.ln2)) @ self.down

    def torch(self, x):
        """The same layer with torch.matmul and NCCL all-reduces (collective)."""
        partial = self._attention(x) @ self.o
        dist.all_reduce(partial)
        h = x + partial
        mlp = self._mlp_input(_rmsnorm(h, self.ln2)) @ self.down
        dist.all_reduce(mlp)
        return h + mlp


def _graph(fn, x, calls: int):
    """A CUDA graph of ``calls`` calls of ``fn(x)`` (after one eager call)."""
    fn(x)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn(x)
    return graph


def _kernel_counts(fn, x) -> dict:
    """Kernels one eager ``fn(x)`` launches on the GPU, and how many of them copy (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn(x)
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    copies = [n for n in names if "copy" in n.lower() or n.startswith("Memcpy")]
    # The copies by name (shortened), so a reader sees which they are: a staging copy would be a
    # Memcpy DtoD or a copy kernel the no-communication layer does not launch.
    kinds = {n[:100]: copies.count(n) for n in sorted(set(copies))}
    return {"kernels": len(names), "copies": len(copies), "copy_kernels": kinds}


def run(ctx, args) -> dict:
    """Time both layers for every model and token count (collective); returns the record on every rank."""
    dtype = torch.float32 if ctx.platform.simulator else torch.bfloat16
    record = harness.new_record(ctx, "tp_layer", harness.params(args))
    impls = ["trident", "trident_zero_copy", "local"] + (["torch"] if ctx.platform.nccl_usable else [])
    for model in args.models:
        layer = Layer(ctx, model, dtype)
        for tokens in harness.progress(args.tokens, ctx, args, model):
            x = torch.randn(tokens, MODELS[model][0], device=ctx.device, dtype=dtype)
            same = torch.allclose(layer.trident(x).float(), layer.trident_zero_copy(x).float(), rtol=1e-3, atol=1e-3)
            record["zero_copy_matches"] = record.get("zero_copy_matches", True) and all(harness.all_values(ctx, same))
            for impl in impls:
                fn = getattr(layer, impl)
                ctx.barrier()
                t = harness.measure(ctx.platform.timing_device, partial(fn, x), args.warmup, args.repeats)
                row = {"model": model, "tokens": tokens, "impl": impl, "mode": "eager",
                       "time_us": harness.max_over_ranks(ctx, t.device_ms) * 1e3,
                       "host_us": harness.max_over_ranks(ctx, t.host_ms) * 1e3}
                if not ctx.platform.simulator:
                    row.update(_kernel_counts(fn, x))
                record["rows"].append(row)
                if not ctx.platform.simulator and tokens <= args.graph_max_tokens:
                    graph = _graph(fn, x, args.graph_calls)
                    ctx.barrier()
                    ms = harness.time_ms(ctx, graph.replay, 1, args.repeats)
                    record["rows"].append({**row, "mode": "cuda graph", "host_us": None,
                                           "time_us": harness.max_over_ranks(ctx, ms) * 1e3 / args.graph_calls})
        del layer
    for row in record["rows"]:
        ref = next((r["time_us"] for r in record["rows"] if r["impl"] == "torch" and r["mode"] == row["mode"]
                    and r["model"] == row["model"] and r["tokens"] == row["tokens"]), None)
        row["speedup_vs_torch"] = ref / row["time_us"] if ref else None
        local = next(r["time_us"] for r in record["rows"] if r["impl"] == "local" and r["mode"] == row["mode"]
                     and r["model"] == row["model"] and r["tokens"] == row["tokens"])
        row["vs_local"] = row["time_us"] / local
    return record


def parse_args(argv=None) -> argparse.Namespace:
    """The benchmark's arguments (``trident bench tp-layer --help``)."""
    parser = argparse.ArgumentParser(prog="trident bench tp-layer", description=__doc__)
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=["70b", "8b"])
    parser.add_argument("--tokens", nargs="+", type=int, default=[1, 8, 32, 128, 2048, 8192])
    parser.add_argument("--graph-calls", type=int, default=20, help="layer calls captured in one CUDA graph")
    parser.add_argument("--graph-max-tokens", type=int, default=128, help="capture graphs up to this many tokens")
    arguments.add_common_args(parser, "tp_layer", warmup=3, repeats=10)
    return parser.parse_args(argv)


def sim_sizes(args) -> None:
    """The simulator checks the benchmark, not the speed: the tiny model, few tokens, few repeats."""
    args.models, args.tokens = ["tiny"], [t for t in args.tokens if t <= 8] or [1]
    args.repeats, args.warmup = min(args.repeats, 2), min(args.warmup, 1)


def report(record: dict, out: str) -> list[str]:
    """Write the JSON and the plot into ``out`` and print the table; returns the files written."""
    columns = [("model", "model", ""), ("tokens", "tokens", "d"), ("impl", "impl", ""), ("mode", "mode", ""),
               ("time_us", "device us", ".1f"), ("host_us", "host us", ".1f"), ("speedup_vs_torch", "vs torch", ".2f"),
               ("vs_local", "vs local", ".2f"), ("copies", "copies", "")]
    eager = {**record, "rows": [r for r in record["rows"] if r["mode"] == "eager"]}
    return harness.write_report(record, out, columns, plots=[lambda: plots.loglog(
        eager, f"{out}/tp_layer.png", "model", "impl", "tokens", "time_us", "tokens", "time (us)",
        "tensor-parallel decoder layer, eager", reference="torch")])


def main(argv=None) -> int:
    """Run ``trident bench tp-layer`` on this rank (``trident bench tp-layer -n N`` starts the ranks); returns 0."""
    harness.bench_main(argv, parse_args, run, report, (64 << 20) if SIMULATOR else (16 << 30), sim_sizes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
