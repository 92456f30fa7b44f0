"""After the ladder: a Llama-style decoder layer, tensor parallel, from plain torch and trident's inference ops.

Every rank holds the whole activation ``x`` [T, H] (tensor parallelism inside a node) and its
shards of the weights: its query heads and their key/value heads (grouped: several query heads
share one key/value head), its columns of the gate/up projection and the matching rows of the
down projection. One layer is

    xn     = rmsnorm(x)                                           plain torch
    q,k,v  = xn @ W_qkv[:, my heads]                              column-parallel (no communication)
    attn   = sdpa(q, k, v) on my heads (causal, grouped KV)       plain torch
    out, h = all_reduce_rmsnorm(attn @ W_o[my rows, :], ln2, residual=x)
                                                                  row-parallel + all-reduce + residual + RMSNorm
    act    = silu(out @ W_gate[:, my cols]) * (out @ W_up[:, my cols])
    y      = h + gemm_all_reduce(act, W_down[my rows, :])         row-parallel + all-reduce

so each layer communicates twice, both times fused into the op that produces the partial sums.
The example checks the result against the same layer run whole on one rank (the full weights,
made from one seed on every rank; a real model loads its shards).

    trident run -n 4 examples/tensor_parallel_decoder.py [tokens]
"""

import sys

import torch
import torch.nn.functional as F

import trident
import trident.ops

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN = 64, 8, 4, 8, 128  # small enough for the CPU simulator


def rmsnorm(x, weight, eps=1e-6):
    """RMSNorm in fp32, returned in x's dtype."""
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)


def attention(xn, w_qkv, heads, kv_heads):
    """Causal grouped-query attention of ``heads`` query heads on ``kv_heads`` key/value heads."""
    T = xn.shape[0]
    q, k, v = (xn @ w_qkv).split([heads * HEAD_DIM, kv_heads * HEAD_DIM, kv_heads * HEAD_DIM], dim=-1)
    q, k, v = (t.view(T, -1, HEAD_DIM).transpose(0, 1) for t in (q, k, v))
    k, v = (t.repeat_interleave(heads // kv_heads, dim=0) for t in (k, v))  # each KV head serves its group
    return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(0, 1).reshape(T, heads * HEAD_DIM)


def weights(world_size, rank, dtype, device):
    """The full layer (for the reference) and this rank's shards, from one seed."""
    gen = torch.Generator().manual_seed(0)
    full = {"ln1": 1 + 0.1 * torch.randn(HIDDEN, generator=gen), "ln2": 1 + 0.1 * torch.randn(HIDDEN, generator=gen),
            "q": torch.randn(HIDDEN, HEADS * HEAD_DIM, generator=gen) / HIDDEN ** 0.5,
            "k": torch.randn(HIDDEN, KV_HEADS * HEAD_DIM, generator=gen) / HIDDEN ** 0.5,
            "v": torch.randn(HIDDEN, KV_HEADS * HEAD_DIM, generator=gen) / HIDDEN ** 0.5,
            "o": torch.randn(HEADS * HEAD_DIM, HIDDEN, generator=gen) / (HEADS * HEAD_DIM) ** 0.5,
            "gate": torch.randn(HIDDEN, FFN, generator=gen) / HIDDEN ** 0.5,
            "up": torch.randn(HIDDEN, FFN, generator=gen) / HIDDEN ** 0.5,
            "down": torch.randn(FFN, HIDDEN, generator=gen) / FFN ** 0.5}
    hq, hk, f = HEADS // world_size * HEAD_DIM, KV_HEADS // world_size * HEAD_DIM, FFN // world_size

    def cols(w, n):
        return w[:, rank * n:(rank + 1) * n]

    shard = {"ln1": full["ln1"], "ln2": full["ln2"],
             "qkv": torch.cat([cols(full["q"], hq), cols(full["k"], hk), cols(full["v"], hk)], dim=1),
             "o": full["o"][rank * hq:(rank + 1) * hq], "gate_up": torch.cat([cols(full["gate"], f),
                                                                              cols(full["up"], f)], dim=1),
             "down": full["down"][rank * f:(rank + 1) * f]}
    return full, {k: v.contiguous().to(device, dtype) for k, v in shard.items()}


def decoder_layer(ctx, x, w, zero_copy=False):
    """One rank's part of the layer (collective): ``x`` [T, H] in, the layer's output [T, H] out.

    ``zero_copy``: the O projection's partial sums are written into a tensor made inside
    ``ctx.heap_allocations()`` (on the symmetric heap), which the all-reduce reads in place instead
    of staging a copy of a plain one (docs/pytorch.md, "Zero copy")."""
    heads, kv_heads = HEADS // ctx.world_size, KV_HEADS // ctx.world_size
    attn = attention(rmsnorm(x, w["ln1"]), w["qkv"], heads, kv_heads)
    if zero_copy:
        with ctx.heap_allocations():
            partial = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        torch.matmul(attn, w["o"], out=partial)
    else:
        partial = attn @ w["o"]
    out, h = trident.ops.all_reduce_rmsnorm(ctx, partial, w["ln2"], residual=x)
    gate, up = (out @ w["gate_up"]).chunk(2, dim=-1)
    act = (F.silu(gate.float()) * up.float()).to(x.dtype).contiguous()
    mlp = torch.empty_like(x)
    trident.ops.gemm_all_reduce(ctx, act, w["down"], mlp)
    return h + mlp


def reference_layer(x, full):
    """The same layer, whole, on one rank (fp64)."""
    f = {k: v.double() for k, v in full.items()}
    attn = attention(rmsnorm(x, f["ln1"]), torch.cat([f["q"], f["k"], f["v"]], dim=1), HEADS, KV_HEADS)
    h = x + attn @ f["o"]
    out = rmsnorm(h, f["ln2"])
    return h + (F.silu(out @ f["gate"]) * (out @ f["up"])) @ f["down"]


def main(tokens: str = "8") -> None:
    with trident.init(heap_size=1 << 27) as ctx:
        T, w, r = int(tokens), ctx.world_size, ctx.rank
        if KV_HEADS % w:
            raise SystemExit(f"this layer has {KV_HEADS} KV heads: run it on 1, 2 or 4 ranks, not {w}")
        dtype = torch.float32 if ctx.platform.simulator else torch.bfloat16
        full, shard = weights(w, r, dtype, ctx.device)
        x = torch.randn(T, HIDDEN, generator=torch.Generator().manual_seed(1))
        want = reference_layer(x.double(), full)
        for zero_copy in (False, True):
            y = decoder_layer(ctx, x.to(ctx.device, dtype), shard, zero_copy)
            err = float((y.cpu().double() - want).norm() / want.norm())
            ok = err < (1e-4 if dtype == torch.float32 else 3e-2)
            print(f"rank {r}: tensor-parallel decoder layer{' (zero copy)' if zero_copy else ''}, {T} tokens on "
                  f"{w} ranks: relative error {err:.1e} ({'matches' if ok else 'WRONG'})")
            if not ok:
                raise SystemExit(f"rank {r}: relative error {err}")


if __name__ == "__main__":
    main(*sys.argv[1:])
