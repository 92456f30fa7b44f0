"""Step 7: a tensor-parallel MLP block from trident's fused ops, checked against one-process torch.

Tokens are split across ranks (sequence parallel): rank r holds rows ``r*m .. r*m + m - 1`` of
the activations X. The up projection's columns and the down projection's rows are split across
ranks (Megatron-style), so each rank computes

    H_r = gelu(all_gather(X) @ W_up[:, cols of r])        trident.ops.all_gather_gemm
    Y_r = (sum over ranks s of H_s @ W_down[rows of s])[rows of r]
                                                          trident.ops.gemm_reduce_scatter

and ends with its own tokens' output, as it started with its own tokens' input: the gather of
the activations overlaps the first GEMM, the reduce-scatter the second. Every rank generates the
full weights from one seed (a real model loads its shards) to check the result. The block runs
once per pattern of the ops (docs/tensor-parallel-ops.md), or in the one pattern named.

    trident run -n 4 examples/07_tensor_parallel_mlp.py [pattern]
"""

import sys

import torch

import trident
import trident.ops


def mlp(ctx, X_local, W_up_shard, W_down_shard, pattern):
    """One rank's part of the block: its tokens in, its tokens out (collective)."""
    m, f = X_local.shape[0], W_up_shard.shape[1]
    H = torch.empty(ctx.world_size * m, f, device=ctx.device, dtype=X_local.dtype)
    trident.ops.all_gather_gemm(ctx, X_local, W_up_shard, H, pattern=pattern)
    H = torch.nn.functional.gelu(H)
    Y_local = torch.empty(m, W_down_shard.shape[1], device=ctx.device, dtype=X_local.dtype)
    trident.ops.gemm_reduce_scatter(ctx, H, W_down_shard, Y_local, pattern=pattern)
    return Y_local


def main(pattern: str | None = None) -> None:
    with trident.init(heap_size=1 << 28) as ctx:
        w, r = ctx.world_size, ctx.rank
        tokens, hidden, ffn = 16 * w, 64, 32 * w  # small enough for the CPU simulator
        dtype = torch.float32 if ctx.platform.simulator else torch.float16
        gen = torch.Generator().manual_seed(0)
        X = torch.randn(tokens, hidden, generator=gen)
        W_up = torch.randn(hidden, ffn, generator=gen) / hidden ** 0.5
        W_down = torch.randn(ffn, hidden, generator=gen) / ffn ** 0.5

        m, f = tokens // w, ffn // w
        X_local = ctx.as_symmetric(X[r * m:(r + 1) * m].to(ctx.device, dtype))  # peers read it: on the heap
        W_up_shard = W_up[:, r * f:(r + 1) * f].contiguous().to(ctx.device, dtype)
        W_down_shard = W_down[r * f:(r + 1) * f].contiguous().to(ctx.device, dtype)
        want = (torch.nn.functional.gelu(X.double() @ W_up.double()) @ W_down.double())[r * m:(r + 1) * m]

        # Both ops have the same patterns. baseline (and auto, which may choose it) runs NCCL: only
        # where NCCL can, a GPU per rank.
        skip = () if ctx.platform.nccl_usable else ("baseline", "auto")
        patterns = [pattern] if pattern else [p for p in trident.ops.OP_PATTERNS["all_gather_gemm"] if p not in skip]
        errors = {}
        for p in patterns:
            Y_local = mlp(ctx, X_local, W_up_shard, W_down_shard, p)
            errors[p] = float((Y_local.cpu().double() - want).norm() / want.norm())
        worst = max(errors.values())
        print(f"rank {r}: tensor-parallel MLP on {w} ranks, relative error at most {worst:.1e} "
              f"({', '.join(errors)}): {'ok' if worst < 1e-2 else 'WRONG'}")
        if worst >= 1e-2:
            raise SystemExit(f"rank {r}: relative errors {errors}")


if __name__ == "__main__":
    main(*sys.argv[1:])
