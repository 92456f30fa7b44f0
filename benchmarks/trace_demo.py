"""A traced kernel on every rank: tiles of a matmul, each sent to every rank (a GEMM + all-scatter).

Rank r computes its column block of ``C = A @ B`` (``A`` is M x K on every rank, ``B_r`` is its
K x N/W shard) tile by tile and stores each finished tile into every rank's ``C`` with
``trident.store``. With ``--trace`` each program records a COMPUTE event per tile and a COMM
event per peer, and the run writes a Chrome/Perfetto trace and a PNG timeline. It is a
demonstration of ``trident.trace``, not a tuned GEMM (see ``trident bench gemm`` for that).

    trident run -n 2 benchmarks/trace_demo.py --out results/trace_demo
    # -> results/trace_demo/trace.json (open in ui.perfetto.dev), timeline.png

In the simulator it runs a tiny problem with the host clock.
"""

from __future__ import annotations

import argparse
import os

import torch
import triton
import triton.language as tl

import trident
import trident.trace as tt


@triton.jit
def matmul_scatter_kernel(a_ptr, b_ptr, c_ptr, trace_ptr, M, N_SHARD, K, rank, world_size, heap_bases,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, TRACE: tl.constexpr):
    """One program: tile (pid_m, pid_n) of A @ B_rank, then the tile into every rank's C."""
    pid = tl.program_id(0)
    tiles_n = (N_SHARD + BLOCK_N - 1) // BLOCK_N
    pid_m, pid_n = pid // tiles_n, pid % tiles_n
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    t0 = tt.now()
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):  # M, N_SHARD, K are multiples of the blocks
        a = tl.load(a_ptr + rm[:, None] * K + (k + rk)[None, :])
        b = tl.load(b_ptr + (k + rk)[:, None] * N_SHARD + rn[None, :])
        acc = tl.dot(a, b, acc)
    tile = acc.to(c_ptr.dtype.element_ty)
    tt.record(trace_ptr, tt.COMPUTE, pid, rank, t0, rank, TRACE)
    # My columns of the full C: rank * N_SHARD + rn. Send to every rank, starting with the next one.
    cols = rank * N_SHARD + rn
    offs = rm[:, None] * (N_SHARD * world_size) + cols[None, :]
    for i in range(world_size):
        peer = (rank + 1 + i) % world_size
        t1 = tt.now()
        trident.store(c_ptr + offs, tile, rank, peer, heap_bases)
        tt.record(trace_ptr, tt.COMM, pid, peer, t1, rank, TRACE)


def run(ctx, m: int, n_shard: int, k: int, blocks: tuple[int, int, int], out: str | None, trace_on: bool = True):
    """Run the kernel once untraced (compile), once traced; check C; export the trace on rank 0.

    Returns:
        The gathered :class:`trident.trace.Events`.
    """
    bm, bn, bk = blocks
    w = ctx.world_size
    gen = torch.Generator().manual_seed(0)
    a_full = torch.randn(m, k, generator=gen).to(torch.float16)
    b_full = torch.randn(k, n_shard * w, generator=gen).to(torch.float16)
    a = ctx.as_symmetric(a_full.to(ctx.device))
    b = ctx.as_symmetric(b_full[:, ctx.rank * n_shard:(ctx.rank + 1) * n_shard].contiguous().to(ctx.device))
    c = ctx.zeros(m, n_shard * w, dtype=torch.float16)
    grid = ((m // bm) * (n_shard // bn),)
    trace = tt.Trace(ctx, capacity=grid[0] * (1 + w) * 2)
    ctx.barrier()
    for on in (False, trace_on):  # the first launch compiles; the traced one is the one we look at
        trace.reset()
        ctx.barrier()
        matmul_scatter_kernel[grid](a, b, c, trace.ptr, m, n_shard, k, ctx.rank, w, ctx.heap_bases,
                                    BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, TRACE=on)
        ctx.barrier()
    want = (a_full.float() @ b_full.float()).to(torch.float16)
    assert torch.allclose(c.cpu().float(), want.float(), atol=0.5, rtol=0.05), "C is wrong"
    events = trace.gather()
    if ctx.rank == 0 and out:
        os.makedirs(out, exist_ok=True)
        title = f"matmul tiles + all-scatter, {w} ranks, {m}x{n_shard * w}x{k}, {ctx.platform.backend}"
        trace.to_chrome(os.path.join(out, "trace.json"), title=title)
        trace.plot(os.path.join(out, "timeline.png"), title=title)
        print(f"{len(events)} events ({events.dropped} dropped) -> {out}/trace.json, {out}/timeline.png")
    ctx.free(a, b, c, trace.tensor)
    return events


def main() -> None:
    """Run the demo on this rank (``trident run -n N benchmarks/trace_demo.py``)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--m", type=int, default=4096)
    parser.add_argument("--n-shard", type=int, default=1024, help="columns of C each rank computes")
    parser.add_argument("--k", type=int, default=4096)
    parser.add_argument("--out", default="results/trace_demo")
    args = parser.parse_args()
    sim = trident.platform.SIMULATOR  # the heap is sized before there is a context to ask
    m, n_shard, k, blocks = (32, 32, 32, (16, 16, 16)) if sim else (args.m, args.n_shard, args.k, (128, 128, 64))
    ctx = trident.init(heap_size=(64 << 20) if sim else 2 * (m * k + k * n_shard) + 16 * m * n_shard + (256 << 20))
    run(ctx, m, n_shard, k, blocks, args.out)
    ctx.close()


if __name__ == "__main__":
    main()
