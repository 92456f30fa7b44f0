"""Step 5: a collective fused into a compute kernel: all-reduce + residual add + RMSNorm.

Tensor-parallel inference servers run this after every layer. Each rank holds a partial sum of
the hidden states (the output of its shard of a matrix product); every rank needs
``rmsnorm(residual + sum over ranks of the partials)`` and the new residual. One kernel does it in
two shots, composed from the tile pieces of ``trident.ccl.device``:

1. reduce: each rank owns every ``world_size``-th token (row) and sums that row over every rank's
   partials (``reduce_tile``), adds the residual and normalizes it, once for everybody;
2. broadcast: it stores the new residual row and the normalized row into every rank
   (``broadcast_tile``).

The sums never make a round trip through memory, and each row is normalized once, not once per
rank. ``trident.sync_ranks`` brackets the work of each program: on entry (every rank's partial
sums are written) and on exit (every row of this group has arrived everywhere, and nobody reads my
partial sums any more).

    trident run -n 4 examples/05_fused_allreduce_rmsnorm.py

Next: 06_gemm_all_scatter.py fuses communication into a GEMM.
"""

import torch
import triton
import triton.language as tl

import trident
from trident.ccl.device import broadcast_tile, reduce_tile


@triton.jit
def allreduce_add_rmsnorm_kernel(partial_ptr, residual_ptr, weight_ptr, out_ptr, tokens, hidden, eps, slots_ptr,
                                 epochs_ptr, rank, world_size, heap_bases, BLOCK: tl.constexpr,
                                 WORLD_BLOCK: tl.constexpr):
    # Program p of every rank handles the rows p * world_size + 0, 1, ...: the one of this rank is
    # p * world_size + rank. Past the last token a program has no row, but still meets its peers.
    pid = tl.program_id(0)
    row = pid * world_size + rank
    cols = tl.arange(0, BLOCK)
    mask = (cols < hidden) & (row < tokens)
    offs = row * hidden + cols
    # The epoch counts this program's calls: the slots only grow, so the same ones serve every call.
    epoch = tl.load(epochs_ptr + pid) + 1
    slots = slots_ptr + 2 * pid * world_size
    trident.sync_ranks(slots, epoch, rank, world_size, heap_bases, WORLD_BLOCK)

    h = reduce_tile(partial_ptr + offs, rank, world_size, heap_bases, mask, "sum", tl.float32)
    h += tl.load(residual_ptr + offs, mask=mask, other=0.0)
    rms = tl.sqrt(tl.sum(h * h, axis=0) / hidden + eps)
    y = h / rms * tl.load(weight_ptr + cols, mask=cols < hidden, other=0.0)
    broadcast_tile(residual_ptr + offs, h, rank, world_size, heap_bases, mask)
    broadcast_tile(out_ptr + offs, y, rank, world_size, heap_bases, mask)

    # Release my rows, acquire the rows of program p on every other rank.
    trident.sync_ranks(slots + world_size, epoch, rank, world_size, heap_bases, WORLD_BLOCK)
    tl.store(epochs_ptr + pid, epoch)


def main():
    ctx = trident.init(heap_size=1 << 26)
    world = ctx.world_size
    tokens, hidden, eps = 7, 200, 1e-6  # neither a multiple of the world size nor of a power of two
    programs = triton.cdiv(tokens, world)
    gen = torch.Generator(device=ctx.device).manual_seed(ctx.rank)
    partial = ctx.randn(tokens, hidden, generator=gen)   # read by peers: on the heap
    residual = ctx.ones(tokens, hidden)                   # written by peers: on the heap
    out = ctx.empty(tokens, hidden)
    weight = torch.linspace(0.5, 1.5, hidden, device=ctx.device)  # only read locally: anywhere
    slots = ctx.zeros(2 * programs * world, dtype=torch.int64)
    epochs = torch.zeros(programs, dtype=torch.int64, device=ctx.device)
    ctx.barrier()  # every rank's slots are zero before a peer signals into them

    for _ in range(2):  # twice: the residual accumulates, and the epochs keep the slots right
        allreduce_add_rmsnorm_kernel[(programs,)](
            partial, residual, weight, out, tokens, hidden, eps, slots, epochs, ctx.rank, world, ctx.heap_bases,
            BLOCK=triton.next_power_of_2(hidden), WORLD_BLOCK=triton.next_power_of_2(world))
    # No host barrier needed: the exit sync_ranks left every row in place when the kernel ended.

    partials = [torch.randn(tokens, hidden, generator=torch.Generator(device=ctx.device).manual_seed(r),
                            device=ctx.device) for r in range(world)]
    want_residual = 1 + 2 * sum(partials)
    want = want_residual * torch.rsqrt(want_residual.pow(2).mean(-1, keepdim=True) + eps) * weight
    torch.testing.assert_close(residual, want_residual, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)
    print(f"rank {ctx.rank}: fused all-reduce + residual + RMSNorm of {tokens}x{hidden} on {world} ranks "
          f"matches torch")
    ctx.close()


if __name__ == "__main__":
    main()
