"""Step 6: communication fused into a GEMM: ``C = A @ B`` on every rank, each rank computing one column block.

Every rank holds A (M x K, the same on all ranks) and its column block B_r (K x N/W) of B; every
rank must end with the whole C (M x N, on the heap). Two ways:

1. By hand, composing the library's device pieces: a persistent kernel walks the output tiles of
   ``A @ B_r`` with ``trident.ops.gemm.tiles`` (``tile_coords``: which tile, ``tile_dot``: its fp32
   accumulator, ``tile_offsets``: where it goes) and, as soon as a tile is in registers, stores it
   into every rank's C with ``trident.store``. No second kernel, no staging buffer: sending tile t
   overlaps computing the tiles after it. Host barriers around the launch keep the ranks in step.
2. With the library op ``trident.ops.gemm_all_scatter(ctx, A, B_local, C, pattern=...)``, which
   does the same in several overlap patterns (docs/gemm-all-scatter.md) and synchronizes on the
   device, without host barriers, so calls can follow each other (or be captured in a CUDA graph).

    trident run -n 2 examples/06_gemm_all_scatter.py
    trident run -n 8 examples/06_gemm_all_scatter.py --m 8192 --n 4608 --k 36864     # 8 GPUs

Next: 07_tensor_parallel_mlp.py builds a model block from the library's fused ops.
"""

import argparse

import torch
import triton
import triton.language as tl

import trident
import trident.ops
from trident.ops.gemm.tiles import Gemm, tile_coords, tile_dot, tile_offsets


@triton.jit
def gemm_all_scatter_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm,
                            rank, world_size, heap_bases, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                            BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    # c_ptr points at this rank's column block of C (N is the block's width): a tile has the same
    # offsets in every rank's C, so trident.store can put it at the same place everywhere.
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    # A and B with their sizes, strides and tiling, as one argument for tile_dot.
    # False: plain pointers, any layout (True: TMA descriptors).
    gemm = Gemm(a_ptr, b_ptr, (M, N, K), (stride_am, stride_ak, stride_bk, stride_bn), BLOCK_M, BLOCK_N, BLOCK_K,
                GROUP_M, False)
    # Persistent: program p takes tiles p, p + P, p + 2P, ... (P programs, at most one per SM).
    for tile in range(tl.program_id(0), num_pid_m * num_pid_n, tl.num_programs(0)):
        pid_m, pid_n = tile_coords(tile, num_pid_m, num_pid_n, GROUP_M)
        acc = tile_dot(gemm, pid_m, pid_n)
        values = acc.to(c_ptr.dtype.element_ty)
        offs, mask = tile_offsets(pid_m, pid_n, M, N, stride_cm, 1, BLOCK_M, BLOCK_N)
        # The scatter: starting with my own C, then the next ranks', so that ranks do not all
        # store into rank 0 at once.
        for i in range(world_size):
            peer = (rank + i) % world_size
            trident.store(c_ptr + offs, values, rank, peer, heap_bases, mask=mask)


def by_hand(ctx, A, B_local, C):
    """Way 1: the kernel above, between two host barriers."""
    M, K = A.shape
    n = B_local.shape[1]
    block = C[:, ctx.rank * n:(ctx.rank + 1) * n]  # my column block: a strided view into C
    # Small tiles in the simulator, whose programs run one after another on the CPU.
    BLOCK_M, BLOCK_N, BLOCK_K = (16, 16, 16) if ctx.platform.simulator else (128, 128, 64)
    tiles = triton.cdiv(M, BLOCK_M) * triton.cdiv(n, BLOCK_N)
    ctx.barrier()  # nobody stores into a C that its rank is still writing or reading
    gemm_all_scatter_kernel[(min(tiles, ctx.platform.program_limit),)](
        A, B_local, block, M, n, K, A.stride(0), A.stride(1), B_local.stride(0), B_local.stride(1),
        block.stride(0), ctx.rank, ctx.world_size, ctx.heap_bases,
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, GROUP_M=8)
    ctx.barrier()  # every rank's tiles have landed in my C


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--m", type=int, default=48)
    parser.add_argument("--n", type=int, default=0, help="columns of C, all ranks together (default 24 per rank)")
    parser.add_argument("--k", type=int, default=40)
    args = parser.parse_args()
    # C is the only tensor of ours on the heap (2 bytes an element); the op adds a little of its own.
    ctx = trident.init(heap_size=(1 << 26) + 4 * args.m * args.n)
    w = ctx.world_size
    M, K, N = args.m, args.k, args.n or 24 * w  # ragged against the tiles on purpose
    if N % w:
        raise SystemExit(f"--n {N} must be divisible by the world size {w}")
    n = N // w

    gen = torch.Generator().manual_seed(0)  # the same A and B on every rank; each keeps its block of B
    A = torch.randn(M, K, generator=gen).half().to(ctx.device)
    B = torch.randn(K, N, generator=gen).half().to(ctx.device)
    B_local = B[:, ctx.rank * n:(ctx.rank + 1) * n].contiguous()
    C = ctx.empty(M, N, dtype=torch.float16)  # peers store into it: on the heap
    want = (A.float() @ B.float()).half()

    # NaN before each run: a tile nobody stored would show.
    C.fill_(float("nan"))
    by_hand(ctx, A, B_local, C)
    torch.testing.assert_close(C, want, rtol=2e-2, atol=2e-2)
    done = ["by hand"]

    # The library op, in each pattern. baseline (and auto, which may choose it) is torch.matmul +
    # NCCL's all-gather: only where NCCL can run, a GPU per rank.
    skip = () if ctx.platform.nccl_usable else ("baseline", "auto")
    for pattern in [p for p in trident.ops.PATTERNS if p not in skip]:
        C.fill_(float("nan"))
        trident.ops.gemm_all_scatter(ctx, A, B_local, C, pattern=pattern)
        torch.testing.assert_close(C, want, rtol=2e-2, atol=2e-2, msg=lambda m, p=pattern: f"{p}: {m}")
        done.append(pattern)
    print(f"rank {ctx.rank}: GEMM + all-scatter of {M}x{N}x{K} on {w} ranks matches torch: {', '.join(done)}")
    ctx.close()


if __name__ == "__main__":
    main()
