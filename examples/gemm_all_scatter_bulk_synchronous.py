"""GEMM + all-scatter, pattern 1 of 4: **bulk_synchronous**.

Every rank holds A (M x K, the same on all ranks) and one column block B_r (K x N/W) of B; every
rank must end with the whole C = A @ B. The simplest schedule: the whole GEMM first
(``trident.ops.matmul`` straight into this rank's column block of C), then a second kernel stores
that block into every peer's C. Nothing overlaps: the reference point for the other patterns,
and already one copy less than torch.matmul + all_gather + a layout fix.

    trident run -n 2 examples/gemm_all_scatter_bulk_synchronous.py
    trident run -n 8 examples/gemm_all_scatter_bulk_synchronous.py --m 8192 --n 4608 --k 36864   # GPUs
"""
import _gemm_all_scatter_problem as problem
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
    p = problem.setup(__doc__)
    BLOCK_M, BLOCK_N, _ = p.tile

    def launch():
        trident.ops.matmul(p.A, p.B_local, out=p.block)          # 1. the whole GEMM, into my block of C
        all_scatter_kernel[(min(p.sms, p.tiles),)](                # 2. then my block into every peer's C
            p.block, p.M, p.n, p.block.stride(0), p.state, p.ready, p.arrived, p.ctx.rank, p.ctx.world_size,
            p.ctx.heap_bases, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, GROUP_M=8, WORLD_BLOCK=p.world_block)

    problem.run_twice(p, launch)
    problem.check_and_close(p, "bulk_synchronous")


if __name__ == "__main__":
    main()
