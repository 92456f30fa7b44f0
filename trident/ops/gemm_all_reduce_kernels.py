"""Kernels of GEMM + all-reduce: ``C = sum over ranks s of A_s @ B_s`` on every rank.

Rank s holds A (M x K) and B (K x N), K being its shard of the inner dimension, so its product
is a partial sum of the whole M x N result, and every rank keeps the whole sum. The product is
tiled once (:func:`~trident.ops.tiles.tile_coords`, T tiles).

Each rank has a symmetric ``slots`` array (W x M x N, C's dtype): rank s stores its partial tile
into ``slots[s]`` of *every* rank (one-shot: each tile is computed once and pushed W times);
every rank then sums its W slots in fp32 (the slot layout is gemm_reduce_scatter's with m = M,
so its :func:`~trident.ops.gemm_reduce_scatter_kernels.reduce_slots_kernel` and
:func:`~trident.ops.gemm_reduce_scatter_kernels.sum_slots` do the sums).

* :func:`push_all_kernel` (``fused_sequential``): one persistent kernel computes every tile and
  stores it into every rank's ``slots[rank]``; ``reduce_slots_kernel`` then sums the slots (after
  the handshake of :func:`~trident.ops.call_sync.finish_call`, every peer's partials have landed
  when the first kernel ends).
* :func:`push_all_reduce_kernel` (``workgroup_specialized``): GEMM programs push tiles as in
  ``push_all_kernel`` and release a flag per tile at every rank (``FLAGS[s * T + tile] = epoch``
  in each rank's sync block); reducer programs acquire the W flags of each tile and sum it while
  the GEMM goes on. The roles come from the arrival ticket, GEMM programs first, as in
  gemm_reduce_scatter: a reducer waits only on GEMM programs that started before it.

Every rank starts each tile with the next rank and ends with itself, so at any time the ranks
write to different peers. A ``trace_ptr`` of None turns tracing off.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .. import trace
from ..device import signal, store
from .call_sync import enter_call, finish_call, flag_words, wait_peers_ready
from .gemm_reduce_scatter_kernels import reduce_flagged_tiles, reduce_slots_kernel
from .tiles import tile_coords, tile_dot, tile_offsets

__all__ = ["push_all_kernel", "push_all_reduce_kernel", "push_all_tiles", "reduce_slots_kernel"]


@triton.jit
def push_all_tiles(first, step,
                   a, b, slots,
                   M, N, K,
                   stride_am, stride_ak, stride_bk, stride_bn,
                   flags_ptr, epoch, trace_ptr, rank, world_size, heap_bases,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                   USE_TMA: tl.constexpr):
    """Tiles ``first, first + step, ...`` of my partial product, each stored into ``slots[rank]`` of
    every rank; with a ``flags_ptr`` (not None) also release the tile's flag at every rank."""
    TRACE: tl.constexpr = trace_ptr is not None
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    tiles = num_pid_m * num_pid_n
    mine = slots + tl.cast(rank, tl.int64) * M * N  # my slot, at the same offset in every rank's heap
    for tile in tl.range(first, tiles, step):
        t0 = trace.now_if(TRACE)
        pid_m, pid_n = tile_coords(tile, num_pid_m, num_pid_n, GROUP_M)
        acc = tile_dot(a, b, pid_m, pid_n, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                       BLOCK_M, BLOCK_N, BLOCK_K, USE_TMA)
        trace.record(trace_ptr, trace.COMPUTE, tile, rank, t0, rank, TRACE)
        t0 = trace.now_if(TRACE)
        offs, mask = tile_offsets(pid_m, pid_n, M, N, N, 1, BLOCK_M, BLOCK_N)
        part = acc.to(slots.dtype.element_ty)
        for i in range(world_size):
            peer = (rank + 1 + i) % world_size  # the next rank first, myself last
            store(mine + offs, part, rank, peer, heap_bases, mask=mask)
            if flags_ptr is not None:
                signal(flags_ptr + rank * tiles + tile, epoch, rank, peer, heap_bases)
        trace.record(trace_ptr, trace.COMM, tile, rank, t0, rank, TRACE)


@triton.jit
def push_all_kernel(
        a, b, slots,                                    # A, B (descriptors or pointers), the slots (symmetric)
        M, N, K,                                        # K: this rank's shard
        stride_am, stride_ak, stride_bk, stride_bn,
        sync_ptr, trace_ptr,                            # the sync block; the trace buffer or None
        rank, world_size, heap_bases,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
        USE_TMA: tl.constexpr, WORLD_BLOCK: tl.constexpr):
    """fused_sequential: every tile of my partial product goes into ``slots[rank]`` of every rank."""
    epoch, _ = enter_call(sync_ptr, rank, world_size, heap_bases, WORLD_BLOCK)
    wait_peers_ready(sync_ptr, epoch, rank, world_size, heap_bases)
    push_all_tiles(tl.program_id(0), tl.num_programs(0),
                   a, b, slots,
                   M, N, K,
                   stride_am, stride_ak, stride_bk, stride_bn,
                   None, epoch, trace_ptr, rank, world_size, heap_bases,  # no flags: reduce_slots_kernel runs after
                   BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, USE_TMA)
    finish_call(sync_ptr, epoch, rank, world_size, heap_bases, WORLD_BLOCK)


@triton.jit
def push_all_reduce_kernel(
        a, b, slots, c,                                 # A, B (descriptors or pointers), the slots, C
        M, N, K,                                        # K: this rank's shard
        stride_am, stride_ak, stride_bk, stride_bn,
        gemm_programs,                                  # the first gemm_programs to arrive push, the rest reduce
        sync_ptr, trace_ptr,                            # the sync block (its flags); the trace buffer or None
        rank, world_size, heap_bases,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
        USE_TMA: tl.constexpr, WORLD_BLOCK: tl.constexpr):
    """workgroup_specialized, two roles by arrival: the first ``gemm_programs`` programs to start
    push tiles to every rank and flag them there; the later ones reduce each tile of C once all W
    ranks have flagged it. Reducers wait only on GEMM programs: this rank's have all started, and
    no rank's GEMM programs wait on a reducer."""
    epoch, arrival = enter_call(sync_ptr, rank, world_size, heap_bases, WORLD_BLOCK)
    flags = flag_words(sync_ptr, world_size)
    if arrival < gemm_programs:
        wait_peers_ready(sync_ptr, epoch, rank, world_size, heap_bases)
        push_all_tiles(arrival, gemm_programs,
                       a, b, slots,
                       M, N, K,
                       stride_am, stride_ak, stride_bk, stride_bn,
                       flags, epoch, trace_ptr, rank, world_size, heap_bases,
                       BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, USE_TMA)
    else:
        reduce_flagged_tiles(arrival - gemm_programs, tl.num_programs(0) - gemm_programs,
                             slots, c, M, N,
                             flags, epoch, trace_ptr, rank, world_size, heap_bases,
                             BLOCK_M, BLOCK_N, GROUP_M, WORLD_BLOCK)
    finish_call(sync_ptr, epoch, rank, world_size, heap_bases, WORLD_BLOCK)
