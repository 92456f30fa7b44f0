"""Kernels of GEMM + reduce-scatter: ``C_r = sum over ranks s of (A_s @ B_s)[rows of rank r]``.

Rank s holds A (W*m x K) and B (K x N), K being its shard of the inner dimension, so its
product is a partial sum of the whole M x N result. Rank r keeps rows ``r*m .. r*m + m - 1``
of the sum in C (m x N). The product is cut into W row shards of m rows, each tiled on its own
(:func:`~trident.ops.tiles.shard_tile`): a tile's rows all belong to one owner.

Each rank has a symmetric ``slots`` array (W x m x N, C's dtype): rank s stores its partial of
rank r's rows into rank r's ``slots[s]``; rank r sums its W slots in fp32.

* :func:`push_kernel` (``fused_sequential``): one persistent kernel computes every tile and
  stores it straight into its owner's slot; :func:`reduce_slots_kernel` then sums the slots
  (after the handshake of :func:`~trident.ops.call_sync.finish_call`, every peer's partials
  have landed when the first kernel ends).
* :func:`push_reduce_kernel` (``workgroup_specialized``): GEMM programs push tiles as in
  ``push_kernel`` and release a flag at the owner per tile (``FLAGS[s * T + tile] = epoch`` in
  the owner's sync block); reducer programs acquire the W flags of each of their tiles and sum
  it while the GEMM goes on. The roles come from the arrival ticket, GEMM programs first: a
  reducer waits only on GEMM programs that started before it (here, or at a peer, where they
  wait on nothing of their launch either), however few programs are resident at a time.

Every rank starts with the next rank's shard and ends with its own, so at any time the ranks
write to different peers. A ``trace_ptr`` of None turns tracing off.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .. import trace
from ..device import signal, store, wait
from .call_sync import enter_call, finish_call, flag_words, wait_peers_ready
from .tiles import shard_tile, tile_coords, tile_dot_range, tile_offsets


@triton.jit
def push_tiles(first, step,
               a, b, slots,
               m, N, K,
               stride_am, stride_ak, stride_bk, stride_bn,
               flags_ptr, epoch, trace_ptr, rank, world_size, heap_bases,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
               USE_TMA: tl.constexpr):
    """Tiles ``first, first + step, ...`` of my partial product, each stored into its owner's
    ``slots[rank]``; with a ``flags_ptr`` (not None) also release the tile's flag at the owner."""
    TRACE: tl.constexpr = trace_ptr is not None
    per_shard = tl.cdiv(m, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    for tile in tl.range(first, world_size * per_shard, step):
        t0 = trace.now_if(TRACE)
        owner, pid_m, pid_n = shard_tile(tile, m, N, world_size, rank + 1, BLOCK_M, BLOCK_N, GROUP_M)
        row0 = owner * m + pid_m * BLOCK_M  # < M: an int32 (TMA coordinates are)
        acc = tile_dot_range(a, b, row0, pid_n * BLOCK_N, world_size * m, N, K, stride_am, stride_ak, stride_bk,
                             stride_bn, 0, tl.cdiv(K, BLOCK_K), BLOCK_M, BLOCK_N, BLOCK_K, USE_TMA)
        trace.record(trace_ptr, trace.COMPUTE, tile, owner, t0, rank, TRACE)
        t0 = trace.now_if(TRACE)
        offs, mask = tile_offsets(pid_m, pid_n, m, N, N, 1, BLOCK_M, BLOCK_N)
        mine = slots + tl.cast(rank, tl.int64) * m * N  # my slot, at the same offset in every rank's heap
        store(mine + offs, acc.to(slots.dtype.element_ty), rank, owner, heap_bases, mask=mask)
        if flags_ptr is not None:
            signal(flags_ptr + rank * per_shard + tile % per_shard, epoch, rank, owner, heap_bases)
        trace.record(trace_ptr, trace.COMM, tile, owner, t0, rank, TRACE)


@triton.jit
def sum_slots(slots, c, offs, mask, m, N, world_size):
    """``sum over s of slots[s][offs]`` in fp32, stored into ``c + offs`` in C's dtype."""
    acc = tl.zeros(offs.shape, tl.float32)
    for s in range(world_size):
        acc += tl.load(slots + tl.cast(s, tl.int64) * m * N + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(c + offs, acc.to(c.dtype.element_ty), mask=mask)


@triton.jit
def push_kernel(
        a, b, slots,                                    # A, B (descriptors or pointers), the slots (symmetric)
        m, N, K,                                        # m: rows per rank; K: this rank's shard
        stride_am, stride_ak, stride_bk, stride_bn,
        sync_ptr, trace_ptr,                            # the sync block; the trace buffer or None
        rank, world_size, heap_bases,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
        USE_TMA: tl.constexpr, WORLD_BLOCK: tl.constexpr):
    """fused_sequential: every tile of my partial product goes straight into its owner's slot."""
    epoch, _ = enter_call(sync_ptr, rank, world_size, heap_bases, WORLD_BLOCK)
    wait_peers_ready(sync_ptr, epoch, rank, world_size, heap_bases)
    push_tiles(tl.program_id(0), tl.num_programs(0),
               a, b, slots,
               m, N, K,
               stride_am, stride_ak, stride_bk, stride_bn,
               None, epoch, trace_ptr, rank, world_size, heap_bases,  # no flags: reduce_slots_kernel runs after
               BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, USE_TMA)
    finish_call(sync_ptr, epoch, rank, world_size, heap_bases, WORLD_BLOCK)


@triton.jit
def reduce_slots_kernel(slots, c, m, N, world_size, BLOCK: tl.constexpr):
    """``C = sum of my W slots`` (``m x N``, contiguous), after :func:`push_kernel`."""
    for start in tl.range(tl.program_id(0) * BLOCK, m * N, tl.num_programs(0) * BLOCK):
        offs = start + tl.arange(0, BLOCK).to(tl.int64)
        sum_slots(slots, c, offs, offs < m * N, m, N, world_size)


@triton.jit
def reduce_flagged_tiles(first, step,
                         slots, c, rows, N,               # my W slots and C (rows x N, contiguous)
                         flags, epoch, trace_ptr, rank, world_size, heap_bases,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr,
                         WORLD_BLOCK: tl.constexpr):
    """Tiles ``first, first + step, ...`` of C: acquire the tile's flag from every rank (rank s
    flags ``flags[s * T + tile]``, T tiles), then sum the W slots into C while later tiles are
    still being computed (a reducer program of a ``workgroup_specialized`` kernel)."""
    TRACE: tl.constexpr = trace_ptr is not None
    num_pid_m = tl.cdiv(rows, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    sources = tl.arange(0, WORLD_BLOCK)
    for tile in tl.range(first, num_pid_m * num_pid_n, step):
        t0 = trace.now_if(TRACE)
        wait(flags + sources * (num_pid_m * num_pid_n) + tile, epoch, rank, rank, heap_bases, cmp="ge",
             mask=sources < world_size)
        trace.record(trace_ptr, trace.WAIT, tile, rank, t0, rank, TRACE)
        t0 = trace.now_if(TRACE)
        pid_m, pid_n = tile_coords(tile, num_pid_m, num_pid_n, GROUP_M)
        offs, mask = tile_offsets(pid_m, pid_n, rows, N, N, 1, BLOCK_M, BLOCK_N)
        sum_slots(slots, c, offs, mask, rows, N, world_size)
        trace.record(trace_ptr, trace.COMPUTE, tile, rank, t0, rank, TRACE)


@triton.jit
def push_reduce_kernel(
        a, b, slots, c,                                 # A, B (descriptors or pointers), the slots, my rows of C
        m, N, K,                                        # m: rows per rank; K: this rank's shard
        stride_am, stride_ak, stride_bk, stride_bn,
        gemm_programs,                                  # the first gemm_programs to arrive push, the rest reduce
        sync_ptr, trace_ptr,                            # the sync block (its flags); the trace buffer or None
        rank, world_size, heap_bases,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
        USE_TMA: tl.constexpr, WORLD_BLOCK: tl.constexpr):
    """workgroup_specialized, two roles by arrival: the first ``gemm_programs`` programs to start
    push tiles and flag them at the owner; the later ones reduce each of my tiles once all W ranks
    have flagged it. Reducers wait only on GEMM programs: this rank's have all started, and no
    rank's GEMM programs wait on a reducer."""
    epoch, arrival = enter_call(sync_ptr, rank, world_size, heap_bases, WORLD_BLOCK)
    flags = flag_words(sync_ptr, world_size)
    if arrival < gemm_programs:
        wait_peers_ready(sync_ptr, epoch, rank, world_size, heap_bases)
        push_tiles(arrival, gemm_programs,
                   a, b, slots,
                   m, N, K,
                   stride_am, stride_ak, stride_bk, stride_bn,
                   flags, epoch, trace_ptr, rank, world_size, heap_bases,
                   BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, USE_TMA)
    else:
        reduce_flagged_tiles(arrival - gemm_programs, tl.num_programs(0) - gemm_programs,
                             slots, c, m, N,
                             flags, epoch, trace_ptr, rank, world_size, heap_bases,
                             BLOCK_M, BLOCK_N, GROUP_M, WORLD_BLOCK)
    finish_call(sync_ptr, epoch, rank, world_size, heap_bases, WORLD_BLOCK)
