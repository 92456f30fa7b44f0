"""Step 4: message passing between ranks inside a kernel, with trident.signal and trident.wait.

The pattern behind every fused operation: write the data into the peer (``put``/``store``), then
``signal`` a flag there (release: the data is visible before the flag); the peer ``wait``s on its
flag (acquire) and only then reads. Here each rank sends a block to its right neighbour and
waits for the one from its left (a ring); then every rank sends a block to rank 0, which counts
the arrivals with ``signal(..., op="add")`` (all-to-one). No host barrier between sending and
reading: the flags order it.

    trident run -n 4 examples/04_message_passing.py

Next: 05_fused_allreduce_rmsnorm.py fuses a collective into a compute kernel.
"""

import torch
import triton
import triton.language as tl

import trident


@triton.jit
def ring_kernel(data_ptr, inbox_ptr, flag_ptr, out_ptr, n, rank, world_size, heap_bases,
                BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    right = (rank + 1) % world_size
    trident.put(data_ptr + offs, inbox_ptr + offs, rank, right, heap_bases, mask=mask)  # data first,
    trident.signal(flag_ptr, 1, rank, right, heap_bases)                                 # then release
    trident.wait(flag_ptr, 1, rank, rank, heap_bases)                                    # acquire mine,
    tl.store(out_ptr + offs, tl.load(inbox_ptr + offs, mask=mask) + 1, mask=mask)        # then read


@triton.jit
def to_root_kernel(data_ptr, slots_ptr, count_ptr, n, rank, world_size, heap_bases, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    trident.put(data_ptr + offs, slots_ptr + rank * n + offs, rank, 0, heap_bases, mask=mask)
    trident.signal(count_ptr, 1, rank, 0, heap_bases, op="add")
    if rank == 0:
        trident.wait(count_ptr, world_size, rank, rank, heap_bases)


def main():
    ctx = trident.init(heap_size=1 << 24)
    n, world = 100, ctx.world_size
    data = ctx.full((n,), float(ctx.rank))
    inbox, out = ctx.zeros(n), ctx.zeros(n)
    flag = ctx.zeros(1, dtype=torch.int32)
    slots, count = ctx.zeros(world * n), ctx.zeros(1, dtype=torch.int32)
    ctx.barrier()
    ring_kernel[(1,)](data, inbox, flag, out, n, ctx.rank, world, ctx.heap_bases, BLOCK=128)
    to_root_kernel[(1,)](data, slots, count, n, ctx.rank, world, ctx.heap_bases, BLOCK=128)
    ctx.barrier()
    left = (ctx.rank - 1) % world
    assert torch.equal(out.cpu(), torch.full((n,), left + 1.0)), f"rank {ctx.rank}: ring result is wrong"
    if ctx.rank == 0:
        expected = torch.arange(world, dtype=torch.float32).repeat_interleave(n)
        assert torch.equal(slots.cpu(), expected), "all-to-one result is wrong"
    print(f"rank {ctx.rank}: message passing ok")
    ctx.close()


if __name__ == "__main__":
    main()
