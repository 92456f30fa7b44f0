"""GEMM + all-scatter, pattern 2 of 4: **producer_consumer**.

Every rank holds A (M x K, the same on all ranks) and one column block B_r (K x N/W) of B; every
rank must end with the whole C = A @ B. Two kernels run at the same time on two CUDA streams,
the SMs split between them: the GEMM (producer) writes each tile into this rank's C and releases
a per-tile flag; the scatter kernel (consumer) acquires each flag and stores the tile into every
peer's C while the GEMM goes on with the next tiles.

In the simulator the two launches run one after the other (the GEMM first), which is one valid
schedule of the same program.

    trident run -n 2 examples/gemm_all_scatter_producer_consumer.py
    trident run -n 8 examples/gemm_all_scatter_producer_consumer.py --m 8192 --n 4608 --k 36864   # GPUs
"""
import _gemm_all_scatter_problem as problem
import torch
import triton
import triton.language as tl

import trident
from trident.ops.call_sync import enter_call, finish_call, wait_peers_ready
from trident.ops.tiles import tile_coords, tile_dot, tile_offsets


@triton.jit
def gemm_producer_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm,
                         state_ptr, flags_ptr, rank, heap_bases, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    # This call's epoch; the consumer advances it only after every flag of this call is set.
    epoch = tl.load(state_ptr) + 1
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    for tile in range(tl.program_id(0), num_pid_m * num_pid_n, tl.num_programs(0)):
        pid_m, pid_n = tile_coords(tile, num_pid_m, num_pid_n, GROUP_M)
        acc = tile_dot(a_ptr, b_ptr, pid_m, pid_n, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                       BLOCK_M, BLOCK_N, BLOCK_K, False)
        offs, mask = tile_offsets(pid_m, pid_n, M, N, stride_cm, 1, BLOCK_M, BLOCK_N)
        tl.store(c_ptr + offs, acc.to(c_ptr.dtype.element_ty), mask=mask)   # into my own C
        # Release: the tile is written. A local flag, read on this GPU only: gpu scope.
        trident.signal(flags_ptr + tile, epoch, rank, rank, heap_bases, scope="gpu")


@triton.jit
def scatter_consumer_kernel(c_ptr, M, N, stride_cm, state_ptr, ready_ptr, arrived_ptr, flags_ptr, rank, world_size,
                            heap_bases, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr,
                            WORLD_BLOCK: tl.constexpr):
    # The epoch numbers the calls; program 0 tells every peer "I have entered this call".
    epoch = enter_call(state_ptr, ready_ptr, rank, world_size, heap_bases, WORLD_BLOCK)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    # A peer may still read its C from the previous call: wait until it has entered this one.
    wait_peers_ready(ready_ptr, epoch, rank, world_size, heap_bases)
    for tile in range(tl.program_id(0), num_pid_m * num_pid_n, tl.num_programs(0)):
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
    flags = p.ctx.zeros(p.tiles, dtype=torch.int64)  # local: only this rank's two kernels use them
    comm_programs = 16 if p.on_gpu else 2
    side = torch.cuda.Stream(p.ctx.device) if p.on_gpu else None

    def launch():
        if side is not None:  # the consumer's stream waits for earlier work, not for the producer
            side.wait_stream(torch.cuda.current_stream())
        gemm_producer_kernel[(min(p.sms - comm_programs, p.tiles),)](
            p.A, p.B_local, p.block, p.M, p.n, p.K, p.A.stride(0), p.A.stride(1), p.B_local.stride(0),
            p.B_local.stride(1), p.block.stride(0), p.state, flags, p.ctx.rank, p.ctx.heap_bases,
            BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, GROUP_M=8)
        if side is not None:  # the consumer runs beside the producer, on its own stream
            torch.cuda.set_stream(side)
        scatter_consumer_kernel[(min(comm_programs, p.tiles),)](
            p.block, p.M, p.n, p.block.stride(0), p.state, p.ready, p.arrived, flags, p.ctx.rank, p.ctx.world_size,
            p.ctx.heap_bases, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, GROUP_M=8, WORLD_BLOCK=p.world_block)
        if side is not None:
            torch.cuda.set_stream(torch.cuda.default_stream())
            torch.cuda.current_stream().wait_stream(side)

    problem.run_twice(p, launch)
    problem.check_and_close(p, "producer_consumer")


if __name__ == "__main__":
    main()
