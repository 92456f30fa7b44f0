"""GEMM + all-scatter, pattern 3 of 4: **fused_sequential**.

Every rank holds A (M x K, the same on all ranks) and one column block B_r (K x N/W) of B. Every
rank must end with the whole C = A @ B. Here one persistent kernel does it all: each program
computes an output tile of its rank's block A @ B_r and, as soon as the tile is in registers,
stores it into *every* rank's C with ``trident.store``. No second kernel, no staging buffer: the
communication of tile t overlaps the computation of the tiles after it.

    trident run -n 2 examples/gemm_all_scatter_fused_sequential.py
    trident run -n 8 examples/gemm_all_scatter_fused_sequential.py --m 8192 --n 4608 --k 36864   # GPUs

The building blocks come from ``trident.ops``: ``tile_coords`` (grouped tile order),
``tile_dot`` (one tile's fp32 accumulator) and ``tile_offsets``; the three synchronization
helpers are explained where they are used. ``trident.ops.gemm_all_scatter(..., pattern=
"fused_sequential")`` runs this same kernel (with TMA loads and tracing).
"""

import argparse

import torch
import triton
import triton.language as tl

import trident
from trident.ops.call_sync import enter_call, finish_call, wait_peers_ready
from trident.ops.tiles import tile_coords, tile_dot, tile_offsets


@triton.jit
def gemm_all_scatter_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm,
                            state_ptr, ready_ptr, arrived_ptr, rank, world_size, heap_bases,
                            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                            GROUP_M: tl.constexpr, WORLD_BLOCK: tl.constexpr):
    # c_ptr points at this rank's column block of C (C[:, rank * N]), so a tile has the same
    # offsets in every rank's C. N is the block's width (N_total / world_size).
    #
    # Which call is this? The epoch (1, 2, 3, ...) lives on the device and only grows, so flags
    # never need resetting. Program 0 also tells every peer "I have entered this call".
    epoch = enter_call(state_ptr, ready_ptr, rank, world_size, heap_bases, WORLD_BLOCK)
    # A peer may still be reading its C from the previous call: store into it only once it has
    # entered this one.
    wait_peers_ready(ready_ptr, epoch, rank, world_size, heap_bases)

    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    # Persistent: program p takes tiles p, p + P, p + 2P, ... (P programs, about one per SM).
    for tile in range(tl.program_id(0), num_pid_m * num_pid_n, tl.num_programs(0)):
        pid_m, pid_n = tile_coords(tile, num_pid_m, num_pid_n, GROUP_M)
        acc = tile_dot(a_ptr, b_ptr, pid_m, pid_n, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                       BLOCK_M, BLOCK_N, BLOCK_K, False)
        values = acc.to(c_ptr.dtype.element_ty)
        offs, mask = tile_offsets(pid_m, pid_n, M, N, stride_cm, 1, BLOCK_M, BLOCK_N)
        # The scatter: the same tile into every rank's C, starting with my own.
        for i in range(world_size):
            peer = (rank + i) % world_size
            trident.store(c_ptr + offs, values, rank, peer, heap_bases, mask=mask)

    # The last program of this rank to finish releases "my block is in your C" to every peer,
    # then acquires the same from all of them: when the kernel ends, my C is complete.
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
    programs = torch.cuda.get_device_properties(ctx.device).multi_processor_count if big else 2
    grid = (min(programs, triton.cdiv(M, BLOCK_M) * triton.cdiv(n, BLOCK_N)),)
    for _ in range(2):  # twice on the same buffers: the epochs keep the flags right
        C.fill_(float("nan"))
        ctx.barrier()
        gemm_all_scatter_kernel[grid](A, B_local, block, M, n, K, A.stride(0), A.stride(1), B_local.stride(0),
                                      B_local.stride(1), block.stride(0), state, ready, arrived, ctx.rank, w,
                                      ctx.heap_bases, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, GROUP_M=8,
                                      WORLD_BLOCK=triton.next_power_of_2(w))
        ctx.barrier()
    torch.testing.assert_close(C, (A.float() @ B.float()).to(dtype), rtol=2e-2, atol=2e-2)
    print(f"rank {ctx.rank}: fused_sequential GEMM + all-scatter of {M}x{N}x{K} matches torch")
    ctx.close()


if __name__ == "__main__":
    main()
