"""The host side the four GEMM + all-scatter examples share: the problem, its buffers, the check.

Every rank holds the same A (M x K, same seed) and its column block B_local (K x N/W) of one B;
C (M x N) is on the heap because peers store into it. The sync state of the call handshake
(``trident/ops/call_sync.py``) is zeroed on every rank before anyone signals into it.
"""

import argparse
import dataclasses

import torch
import triton

import trident


@dataclasses.dataclass
class Problem:
    ctx: trident.Context
    M: int
    N: int
    K: int
    n: int                    # columns per rank
    A: torch.Tensor
    B: torch.Tensor
    B_local: torch.Tensor
    C: torch.Tensor           # on the heap
    block: torch.Tensor       # my column block of C: the same offsets in every rank's C
    state: torch.Tensor       # [epoch, finish ticket]
    ready: torch.Tensor       # ready[p]: rank p has entered the call
    arrived: torch.Tensor     # arrived[p]: rank p's block is in my C
    tile: tuple[int, int, int]  # BLOCK_M, BLOCK_N, BLOCK_K
    sms: int                  # programs that fit at once (4 stand-ins in the simulator)
    on_gpu: bool

    @property
    def tiles(self) -> int:
        return triton.cdiv(self.M, self.tile[0]) * triton.cdiv(self.n, self.tile[1])

    @property
    def world_block(self) -> int:
        return triton.next_power_of_2(self.ctx.world_size)


def setup(description: str) -> Problem:
    """Parse ``--m/--n/--k``, open a context and make the problem's tensors (collective)."""
    parser = argparse.ArgumentParser(description=description.split("\n")[0])
    parser.add_argument("--m", type=int, default=48)
    parser.add_argument("--n", type=int, default=0, help="columns of C on all ranks (default 24 per rank)")
    parser.add_argument("--k", type=int, default=40)
    args = parser.parse_args()
    ctx = trident.init(heap_size=1 << 26 if trident.config.BACKEND == "sim" else 4 << 30)
    w, on_gpu = ctx.world_size, ctx.backend == "cuda"
    M, K, N = args.m, args.k, args.n or 24 * w
    n = N // w
    gen = torch.Generator().manual_seed(0)
    A = torch.randn(M, K, generator=gen).to(torch.float16).to(ctx.device)
    B = torch.randn(K, N, generator=gen).to(torch.float16).to(ctx.device)
    C = ctx.empty(M, N, dtype=torch.float16)
    problem = Problem(ctx, M, N, K, n, A, B, B[:, ctx.rank * n:(ctx.rank + 1) * n].contiguous(), C,
                      C[:, ctx.rank * n:(ctx.rank + 1) * n], ctx.zeros(8, dtype=torch.int64),
                      ctx.zeros(w, dtype=torch.int64), ctx.zeros(w, dtype=torch.int64),
                      (128, 128, 64) if on_gpu else (16, 16, 16),
                      torch.cuda.get_device_properties(ctx.device).multi_processor_count if on_gpu else 4, on_gpu)
    ctx.barrier()  # the flags are zero everywhere before anyone signals
    return problem


def run_twice(problem: Problem, launch) -> None:
    """``launch()`` twice on the same buffers, C poisoned with NaN before each (the epochs keep the flags right)."""
    for _ in range(2):
        problem.C.fill_(float("nan"))
        problem.ctx.barrier()  # nobody stores into a C that is still being poisoned
        launch()
        problem.ctx.barrier()


def check_and_close(problem: Problem, pattern: str) -> None:
    """Compare C with torch, say so, close the context."""
    p = problem
    torch.testing.assert_close(p.C, (p.A.float() @ p.B.float()).half(), rtol=2e-2, atol=2e-2)
    print(f"rank {p.ctx.rank}: {pattern} GEMM + all-scatter of {p.M}x{p.N}x{p.K} matches torch")
    p.ctx.close()
