"""Step 1: reading and writing a peer's memory from a kernel, with trident.load and trident.store.

Every rank reads its left neighbour's vector and writes twice that into its right neighbour's
buffer. The device API takes ``(pointer into my copy, ..., rank, peer, heap_bases)``: the pointer
is to this rank's symmetric tensor, and ``heap_bases`` (every rank's heap address, as mapped
here) lets trident translate it to the same tensor in ``peer``'s heap. Host barriers order the
ranks: before the kernel (every x is written) and after it (every store has landed).

    trident run -n 4 examples/01_load_store.py

Next: 02_put_get.py copies whole blocks between ranks in one call each.
"""

import torch
import triton
import triton.language as tl

import trident


@triton.jit
def shift_right_kernel(x_ptr, y_ptr, n, rank, world_size, heap_bases, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    left = (rank + world_size - 1) % world_size
    right = (rank + 1) % world_size
    x = trident.load(x_ptr + offs, rank, left, heap_bases, mask=mask)        # read the left peer's x
    trident.store(y_ptr + offs, x * 2, rank, right, heap_bases, mask=mask)   # write into the right peer's y


def main():
    ctx = trident.init(heap_size=1 << 24)
    n, BLOCK = 1000, 256  # n is not a multiple of BLOCK on purpose
    x = ctx.full((n,), float(ctx.rank))
    y = ctx.zeros(n)
    ctx.barrier()  # every rank's x is written before anyone reads it
    shift_right_kernel[(triton.cdiv(n, BLOCK),)](x, y, n, ctx.rank, ctx.world_size, ctx.heap_bases,
                                                 BLOCK=BLOCK)
    ctx.barrier()  # every store has landed
    # Rank r's y was written by rank r-1, which read rank r-2's x.
    expected = 2.0 * ((ctx.rank - 2) % ctx.world_size)
    assert torch.equal(y, torch.full_like(y, expected)), f"rank {ctx.rank}: {y[:4]} != {expected}"
    print(f"rank {ctx.rank}: load/store ok (y = {expected})")
    ctx.close()


if __name__ == "__main__":
    main()
