"""GEMM + all-scatter, pattern 1 of 4: **bulk_synchronous**.

Every rank holds A (M x K, the same on all ranks) and one column block B_r (K x N/W) of B; every
rank must end with the whole C = A @ B. The simplest schedule: the whole GEMM first
(``trident.ops.matmul`` straight into this rank's column block of C), then a second kernel stores
that block into every peer's C. Nothing overlaps: the reference point for the other patterns,
and already one copy less than torch.matmul + all_gather + a layout fix.

    trident run -n 2 examples/gemm_all_scatter_bulk_synchronous.py
    trident run -n 8 examples/gemm_all_scatter_bulk_synchronous.py --m 8192 --n 4608 --k 36864   # GPUs
"""
import argparse

import torch
import triton
import triton.language as tl

import trident
from trident.ops.call_sync import enter_call, finish_call, wait_peers_ready
from trident.ops.tiles import tile_coords, tile_offsets


@triton.jit
def all_scatter_kernel(c_ptr, M, N, stride_cm, state_ptr, ready_ptr, arrived_ptr, rank, world_size, heap_bases,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr,
                       WORLD_BLOCK: tl.constexpr):
    # c_ptr points at this rank's column block of C: a tile has the same offsets in every rank's C.
    # The epoch numbers the calls; program 0 tells every peer "I have entered this call".
    epoch = enter_call(state_ptr, ready_ptr, rank, world_size, heap_bases, WORLD_BLOCK)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    # A peer may still read its C from the previous call: wait until it has entered this one.
    wait_peers_ready(ready_ptr, epoch, rank, world_size, heap_bases)
    # The GEMM kernel before this one (same stream) has finished: no tile flags needed.
    for tile in range(tl.program_id(0), num_pid_m * num_pid_n, tl.num_programs(0)):
        pid_m, pid_n = tile_coords(tile, num_pid_m, num_pid_n, GROUP_M)
        offs, mask = tile_offsets(pid_m, pid_n, M, N, stride_cm, 1, BLOCK_M, BLOCK_N)
        values = tl.load(c_ptr + offs, mask=mask)
        for i in range(1, world_size):                  # every peer, starting with the next rank
            peer = (rank + i) % world_size
            trident.store(c_ptr + offs, values, rank, peer, heap_bases, mask=mask)
    # The last program to finish: "my block is in your C" to every peer, then wait for theirs.
    finish_call(state_ptr, arrived_ptr, epoch, rank, world_size, heap_bases, WORLD_BLOCK)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--m", type=int, default=48)
    parser.add_argument("--n", type=int, default=0, help="columns of C on all ranks (default 24 per rank)")
    parser.add_argument("--k", type=int, default=40)
    args = parser.parse_args()
    ctx = trident.init(heap_size=1 << 26 if trident.config.BACKEND == "sim" else 4 << 30)
    w = ctx.world_size
    M, K, N = args.m, args.k, args.n or 24 * w
    n = N // w
    dtype = torch.float16
    big = ctx.backend == "cuda"
    BLOCK_M, BLOCK_N, BLOCK_K = (128, 128, 64) if big else (16, 16, 16)

    # The same A on every rank (same seed); B_r is rank r's column block of one B.
    gen = torch.Generator().manual_seed(0)
    A = torch.randn(M, K, generator=gen).to(dtype).to(ctx.device)
    B = torch.randn(K, N, generator=gen).to(dtype).to(ctx.device)
    B_local = B[:, ctx.rank * n:(ctx.rank + 1) * n].contiguous()
    C = ctx.empty(M, N, dtype=dtype)                    # peers store into it: on the heap
    state = ctx.zeros(8, dtype=torch.int64)             # [epoch, finish ticket]
    ready, arrived = ctx.zeros(w, dtype=torch.int64), ctx.zeros(w, dtype=torch.int64)
    ctx.barrier()                                       # flags are zero everywhere before anyone signals

    block = C[:, ctx.rank * n:(ctx.rank + 1) * n]
    tiles = triton.cdiv(M, BLOCK_M) * triton.cdiv(n, BLOCK_N)
    sms = torch.cuda.get_device_properties(ctx.device).multi_processor_count if big else 4
    for _ in range(2):  # twice on the same buffers: the epochs keep the flags right
        C.fill_(float("nan"))
        ctx.barrier()
        trident.ops.matmul(A, B_local, out=block)          # 1. the whole GEMM, into my block of C
        all_scatter_kernel[(min(sms, tiles),)](             # 2. then my block into every peer's C
            block, M, n, block.stride(0), state, ready, arrived, ctx.rank, w, ctx.heap_bases,
            BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, GROUP_M=8, WORLD_BLOCK=triton.next_power_of_2(w))
        ctx.barrier()
    torch.testing.assert_close(C, (A.float() @ B.float()).to(dtype), rtol=2e-2, atol=2e-2)
    print(f"rank {ctx.rank}: bulk_synchronous GEMM + all-scatter of {M}x{N}x{K} matches torch")
    ctx.close()


if __name__ == "__main__":
    main()
