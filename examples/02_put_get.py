"""Step 2: one-sided copies between ranks, with trident.get and trident.put.

``get(src, dst, rank, peer, ...)`` copies from ``peer``'s ``src`` into my ``dst``; ``put`` copies
from my ``src`` into ``peer``'s ``dst``. Only rank 0 runs kernels here: it gathers a slice from
every rank (get), then scatters the gathered whole back to every rank (put). The other ranks do
nothing but wait at the barrier: their memory is read and written without their help.

    trident run -n 4 examples/02_put_get.py

Next: 03_atomics.py updates a peer's memory atomically.
"""

import torch
import triton
import triton.language as tl

import trident


@triton.jit
def gather_kernel(src_ptr, dst_ptr, n, rank, heap_bases, BLOCK: tl.constexpr):
    peer = tl.program_id(1)  # one column of programs per source rank
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    trident.get(src_ptr + offs, dst_ptr + peer * n + offs, rank, peer, heap_bases, mask=mask)


@triton.jit
def scatter_kernel(src_ptr, total, rank, heap_bases, BLOCK: tl.constexpr):
    peer = tl.program_id(1)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < total
    trident.put(src_ptr + offs, src_ptr + offs, rank, peer, heap_bases, mask=mask)


def main():
    ctx = trident.init(heap_size=1 << 24)
    n, BLOCK, world = 300, 128, ctx.world_size
    mine = ctx.arange(n, dtype=torch.float32)
    mine += 1000 * ctx.rank  # in place: stays on the heap
    gathered = ctx.zeros(world * n)
    ctx.barrier()
    if ctx.rank == 0:
        gather_kernel[(triton.cdiv(n, BLOCK), world)](mine, gathered, n, ctx.rank, ctx.heap_bases, BLOCK=BLOCK)
        scatter_kernel[(triton.cdiv(world * n, BLOCK), world)](gathered, world * n, ctx.rank, ctx.heap_bases,
                                                               BLOCK=BLOCK)
    ctx.barrier()
    expected = torch.cat([torch.arange(n, dtype=torch.float32) + 1000 * r for r in range(world)])
    assert torch.equal(gathered.cpu(), expected), f"rank {ctx.rank}: gathered data is wrong"
    print(f"rank {ctx.rank}: get/put ok ({world} slices of {n})")
    ctx.close()


if __name__ == "__main__":
    main()
