"""A tensor-parallel MLP block with trident's fused ops, checked against one-process torch.

Tokens are split across ranks (sequence parallel): rank r holds rows ``r*m .. r*m + m - 1`` of
the activations X. The up projection's columns and the down projection's rows are split across
ranks (Megatron-style), so each rank computes

    H_r = gelu(all_gather(X) @ W_up[:, cols of r])        trident.ops.all_gather_gemm
    Y_r = (sum over ranks s of H_s @ W_down[rows of s])[rows of r]
                                                          trident.ops.gemm_reduce_scatter

and ends with its own tokens' output, as it started with its own tokens' input. Every rank
generates the full weights from one seed (a real model loads its shards) to check the result.

    trident run -n 4 examples/tensor_parallel_mlp.py [pattern]
"""

import sys

import torch

import trident


def main(pattern: str = "auto") -> None:
    with trident.init(heap_size=1 << 28) as ctx:
        w, r = ctx.world_size, ctx.rank
        tokens, hidden, ffn = 16 * w, 64, 32 * w  # small enough for the CPU simulator
        dtype = torch.float16 if ctx.backend == "cuda" else torch.float32
        gen = torch.Generator().manual_seed(0)
        X = torch.randn(tokens, hidden, generator=gen)
        W_up = torch.randn(hidden, ffn, generator=gen) / hidden ** 0.5
        W_down = torch.randn(ffn, hidden, generator=gen) / ffn ** 0.5

        m, f = tokens // w, ffn // w
        X_local = ctx.as_symmetric(X[r * m:(r + 1) * m].to(ctx.device, dtype))  # peers read it
        W_up_shard = W_up[:, r * f:(r + 1) * f].contiguous().to(ctx.device, dtype)
        W_down_shard = W_down[r * f:(r + 1) * f].contiguous().to(ctx.device, dtype)

        H = torch.empty(tokens, f, device=ctx.device, dtype=dtype)
        trident.ops.all_gather_gemm(ctx, X_local, W_up_shard, H, pattern=pattern)
        H = torch.nn.functional.gelu(H)
        Y_local = torch.empty(m, hidden, device=ctx.device, dtype=dtype)
        trident.ops.gemm_reduce_scatter(ctx, H, W_down_shard, Y_local, pattern=pattern)

        want = (torch.nn.functional.gelu(X.double() @ W_up.double()) @ W_down.double())[r * m:(r + 1) * m]
        err = float((Y_local.cpu().double() - want).norm() / want.norm())
        ctx.barrier()
        print(f"rank {r}: tensor-parallel MLP ({pattern}) on {w} ranks, relative error {err:.1e}: "
              f"{'ok' if err < 1e-2 else 'WRONG'}")
        if err >= 1e-2:
            raise SystemExit(1)


if __name__ == "__main__":
    main(*sys.argv[1:])
