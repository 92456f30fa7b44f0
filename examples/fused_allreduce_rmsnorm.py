"""All-reduce fused with residual add + RMSNorm, as tensor-parallel inference servers do after each layer.

Every rank holds a partial sum of the hidden states (the output of its shard of a matrix
product). One kernel sums the partials across ranks, adds the residual, normalizes and scales,
and writes both the new residual and the normalized activations: the all-reduced tensor never
makes a round trip through memory. Built from trident.ccl.device.reduce_tile and
trident.sync_ranks; checked against torch.

    trident run -n 4 examples/fused_allreduce_rmsnorm.py
"""

import torch
import triton
import triton.language as tl

import trident
from trident.ccl.device import reduce_tile


@triton.jit
def allreduce_add_rmsnorm_kernel(partial_ptr, residual_ptr, weight_ptr, out_ptr, hidden, eps, slots_ptr, counts_ptr,
                                 rank, world_size, heap_bases, BLOCK: tl.constexpr, WORLD_BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    offs = row * hidden + cols
    # Program `row` of every rank meets here: everybody's partial sums are written.
    epoch = tl.load(counts_ptr + row) + 1
    entry = slots_ptr + (2 * row) * world_size
    trident.sync_ranks(entry, epoch, rank, world_size, heap_bases, WORLD_BLOCK)
    h = reduce_tile(partial_ptr + offs, rank, world_size, heap_bases, mask, "sum", tl.float32)
    h += tl.load(residual_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    rms = tl.sqrt(tl.sum(h * h, axis=0) / hidden + eps)
    y = h / rms * tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(residual_ptr + offs, h, mask=mask)
    tl.store(out_ptr + offs, y, mask=mask)
    # ... and again before leaving: nobody still reads my partial sums when I return.
    trident.sync_ranks(entry + world_size, epoch, rank, world_size, heap_bases, WORLD_BLOCK)
    tl.store(counts_ptr + row, epoch)


def main():
    ctx = trident.init(heap_size=1 << 26)
    tokens, hidden, eps = 8, 200, 1e-6
    gen = torch.Generator(device=ctx.device).manual_seed(ctx.rank)
    partial = ctx.randn(tokens, hidden, generator=gen)           # read by peers: on the heap
    residual = torch.ones(tokens, hidden, device=ctx.device)      # local tensors may live anywhere
    weight = torch.linspace(0.5, 1.5, hidden, device=ctx.device)
    out = torch.empty(tokens, hidden, device=ctx.device)
    slots = ctx.zeros(2 * tokens * ctx.world_size, dtype=torch.int64)
    counts = ctx.zeros(tokens, dtype=torch.int64)
    ctx.barrier()
    for _ in range(2):  # twice: the epochs let the same slots serve every call
        allreduce_add_rmsnorm_kernel[(tokens,)](partial, residual, weight, out, hidden, eps, slots, counts, ctx.rank,
                                                ctx.world_size, ctx.heap_bases, BLOCK=triton.next_power_of_2(hidden),
                                                WORLD_BLOCK=triton.next_power_of_2(ctx.world_size))
    ctx.barrier()
    partials = [torch.randn(tokens, hidden, generator=torch.Generator(device=ctx.device).manual_seed(r),
                            device=ctx.device) for r in range(ctx.world_size)]
    want_residual = torch.ones(tokens, hidden, device=ctx.device) + 2 * sum(partials)
    want = want_residual * torch.rsqrt(want_residual.pow(2).mean(-1, keepdim=True) + eps) * weight
    torch.testing.assert_close(residual, want_residual, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)
    print(f"rank {ctx.rank}: fused all-reduce + residual + RMSNorm matches torch")
    ctx.close()


if __name__ == "__main__":
    main()
