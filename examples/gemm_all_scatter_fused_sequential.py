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

import _gemm_all_scatter_problem as problem
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
    p = problem.setup(__doc__)
    BLOCK_M, BLOCK_N, BLOCK_K = p.tile
    grid = (min(p.sms if p.on_gpu else 2, p.tiles),)

    def launch():
        gemm_all_scatter_kernel[grid](
            p.A, p.B_local, p.block, p.M, p.n, p.K, p.A.stride(0), p.A.stride(1), p.B_local.stride(0),
            p.B_local.stride(1), p.block.stride(0), p.state, p.ready, p.arrived, p.ctx.rank, p.ctx.world_size,
            p.ctx.heap_bases, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, GROUP_M=8, WORLD_BLOCK=p.world_block)

    problem.run_twice(p, launch)
    problem.check_and_close(p, "fused_sequential")


if __name__ == "__main__":
    main()
