"""GEMM + all-scatter, pattern 4 of 4: **workgroup_specialized**.

Every rank holds A (M x K, the same on all ranks) and one column block B_r (K x N/W) of B; every
rank must end with the whole C = A @ B. One kernel, two kinds of programs: programs
``0 .. gemm_programs-1`` compute tiles of A @ B_r into this rank's C and release a per-tile flag;
the remaining programs acquire each flag and store the tile into every peer's C. The split is
configurable (``comm_programs`` in ``trident.ops.gemm_all_scatter``): the GEMM never stalls on a
store, and a few programs keep the links busy.

Why the communication programs have the *higher* ids: in the simulator a launch's programs run one
after another, so a program may only wait for lower ids. On a GPU all programs of this grid
(at most one per SM) are resident at once.

    trident run -n 2 examples/gemm_all_scatter_workgroup_specialized.py
    trident run -n 8 examples/gemm_all_scatter_workgroup_specialized.py --m 8192 --n 4608 --k 36864   # GPUs
"""
import _gemm_all_scatter_problem as problem
import torch
import triton
import triton.language as tl

import trident
from trident.ops.call_sync import enter_call, finish_call, wait_peers_ready
from trident.ops.tiles import tile_coords, tile_dot, tile_offsets


@triton.jit
def gemm_all_scatter_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm,
                            gemm_programs, state_ptr, ready_ptr, arrived_ptr, flags_ptr, rank, world_size,
                            heap_bases, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                            GROUP_M: tl.constexpr, WORLD_BLOCK: tl.constexpr):
    # c_ptr points at this rank's column block of C: a tile has the same offsets in every rank's C.
    # The epoch numbers the calls (flags only grow, so they never need a reset); program 0 also
    # tells every peer "I have entered this call".
    epoch = enter_call(state_ptr, ready_ptr, rank, world_size, heap_bases, WORLD_BLOCK)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid = tl.program_id(0)
    if pid < gemm_programs:
        # GEMM role: tiles pid, pid + gemm_programs, ...
        for tile in range(pid, num_pid_m * num_pid_n, gemm_programs):
            pid_m, pid_n = tile_coords(tile, num_pid_m, num_pid_n, GROUP_M)
            acc = tile_dot(a_ptr, b_ptr, pid_m, pid_n, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                           BLOCK_M, BLOCK_N, BLOCK_K, False)
            offs, mask = tile_offsets(pid_m, pid_n, M, N, stride_cm, 1, BLOCK_M, BLOCK_N)
            tl.store(c_ptr + offs, acc.to(c_ptr.dtype.element_ty), mask=mask)   # into my own C
            # Release: the tile is written. A local flag, read on this GPU only: gpu scope.
            trident.signal(flags_ptr + tile, epoch, rank, rank, heap_bases, scope="gpu")
    else:
        # Communication role: the remaining programs share the tiles in the same order.
        # A peer may still read its C from the previous call: wait until it has entered this one.
        wait_peers_ready(ready_ptr, epoch, rank, world_size, heap_bases)
        for tile in range(pid - gemm_programs, num_pid_m * num_pid_n, tl.num_programs(0) - gemm_programs):
            # Acquire: wait until the GEMM has released this tile in this call.
            trident.wait(flags_ptr + tile, epoch, rank, rank, heap_bases, cmp="ge", scope="gpu")
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
    BLOCK_M, BLOCK_N, BLOCK_K = p.tile
    flags = p.ctx.zeros(p.tiles, dtype=torch.int64)  # local: only this rank's programs use them
    comm_programs = 16 if p.on_gpu else 2
    gemm_programs = min(p.sms - comm_programs, p.tiles)

    def launch():
        gemm_all_scatter_kernel[(gemm_programs + comm_programs,)](
            p.A, p.B_local, p.block, p.M, p.n, p.K, p.A.stride(0), p.A.stride(1), p.B_local.stride(0),
            p.B_local.stride(1), p.block.stride(0), gemm_programs, p.state, p.ready, p.arrived, flags, p.ctx.rank,
            p.ctx.world_size, p.ctx.heap_bases, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, GROUP_M=8,
            WORLD_BLOCK=p.world_block)

    problem.run_twice(p, launch)
    problem.check_and_close(p, "workgroup_specialized")


if __name__ == "__main__":
    main()
