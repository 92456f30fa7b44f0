"""Where the host time of one call goes (dev tool, one GPU): cProfile over repeated calls of the
host cases of ``trident bench latency`` (the same calls, the same shapes), top entries by own time.

    PYTHONPATH=$PWD TRIDENT_BACKEND=cuda python3 scripts/host_profile.py ["gemm_all_reduce small" ...]

Each argument picks the cases whose name contains it (default: every fused op, both shapes).
"""

import cProfile
import pstats
import sys

import torch

import trident
from trident.bench.latency import _host_cases


def main():
    wanted = sys.argv[1:]
    ctx = trident.init(heap_size=2 << 30)
    cases, keep = _host_cases(ctx, small_only=False)
    for name, group, fn in cases:
        if (wanted and not any(w in name for w in wanted)) or (not wanted and group != "fused op"):
            continue
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
        stats = pstats.Stats(prof)
        stats.sort_stats("tottime").print_stats(16)
        stats.sort_stats("cumulative").print_stats(30)
    del keep
    ctx.close()


if __name__ == "__main__":
    main()
