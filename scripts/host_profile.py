"""Where the host time of one call goes (dev tool, one GPU): cProfile over repeated calls of
trident.ops.matmul and gemm_all_scatter(fused_sequential) at one rank, top entries by own time.

    PYTHONPATH=$PWD TRIDENT_BACKEND=cuda python3 scripts/host_profile.py [M N K]
"""

import cProfile
import pstats
import sys

import torch

import trident


def main():
    M, N, K = (int(x) for x in sys.argv[1:4]) if len(sys.argv) > 3 else (4096, 4096, 4096)
    ctx = trident.init(heap_size=2 << 30)
    A = torch.randn(M, K, device=ctx.device, dtype=torch.bfloat16)
    B = torch.randn(K, N, device=ctx.device, dtype=torch.bfloat16)
    C = ctx.empty(M, N, dtype=torch.bfloat16)
    out = torch.empty(M, N, device=ctx.device, dtype=torch.bfloat16)
    calls = {"matmul": lambda: trident.ops.matmul(A, B, out=out),
             "gemm_all_scatter fused_sequential": lambda: trident.ops.gemm_all_scatter(
                 ctx, A, B, C, pattern="fused_sequential"),
             "gemm_all_scatter workgroup_specialized": lambda: trident.ops.gemm_all_scatter(
                 ctx, A, B, C, pattern="workgroup_specialized")}
    for name, fn in calls.items():
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(50):
            fn()
            torch.cuda._sleep(1_000_000)  # keep the GPU busy so launches never wait for it
        prof.disable()
        torch.cuda.synchronize()
        print(f"== {name}: 50 calls")
        pstats.Stats(prof).sort_stats("tottime").print_stats(14)
    ctx.close()


if __name__ == "__main__":
    main()
