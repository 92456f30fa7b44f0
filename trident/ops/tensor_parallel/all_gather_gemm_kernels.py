"""Kernels of all-gather + GEMM: ``C = all_gather(A_local) @ B``, with A gathered while the GEMM runs.

Rank r holds ``A_local`` (m x K, symmetric: peers read it) and B (K x N). When the caller's A_local
is not on the heap, ``a_local`` is its stage (a heap buffer of the same layout) and ``source`` the
caller's tensor: the kernel copies it into the stage before announcing the call
(:func:`~trident.ops.fused.sync.enter_call_staging`) and reads its own rows from ``source``; else
``source`` is None. ``C`` (W*m x N) is
cut into W row shards of m rows, one per source rank, each tiled on its own
(:func:`~trident.ops.gemm.tiles.shard_tile`): a tile's rows of A all come from one rank. Every
rank walks the shards starting with its own, whose rows need no communication.

* :func:`pull_kernel` (``fused_sequential``): each tile reads its rows of A straight from the
  source rank's heap in the K loop (remote loads); nothing is copied. A remote row block is read
  once per tile column, so the traffic is ``N / BLOCK_N`` times A's size.
* :func:`gather_gemm_kernel` (``workgroup_specialized``): the first programs to start (by arrival
  ticket, not program id) copy the peers' row blocks of A into a local ``a_full`` (each once) and
  release one flag per block; every program runs the GEMM, the gather programs once every block is
  taken: own rows straight from ``A_local`` (no copy, no wait), a peer's block from ``a_full`` once
  its flag is acquired. Blocks are claimed from a work counter; of the tiles, every round but the
  last two is dealt out statically among the programs that multiply from the start, and the rest
  are claimed one at a time (a program claims its next tile before computing the one it holds), so
  no program idles while tiles remain and claims cost only in the last rounds. A tile waits only on
  a block that a gather program, started before it and waiting on nothing but its peers' entry,
  copies, however few programs of the launch are resident at a time; at one rank there is nothing
  to gather (no gather programs).

B is read through a TMA descriptor where its layout allows (``B_TMA``; A's rows, from a different
tensor tile by tile, through pointers): a pointer tensor of B held across the K loop took as many
registers as the accumulator and made the compiler spill.

Both use the call handshake of :mod:`trident.ops.fused.sync` (one sync block, ``sync_ptr``):
peers' ``A_local`` is read only after they entered the call, and the kernel ends only after every
peer is done reading ours. A ``trace_ptr`` of None turns tracing off.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ... import trace
from ...device import signal, translate, wait
from ...device.bundles import Gemm, Team
from ..fused.sync import claim_work, enter_call, enter_call_staging, finish_call, flag_words, wait_peers_ready
from ..gemm.tiles import shard_tile, tile_dot, tile_offsets


@triton.jit
def pull_kernel(
        a_local, source, b, c,                          # my rows of A (symmetric), the plain A_local it is staged
                                                        # from (or None), B, C (every rank's rows)
        shape, strides,                                 # (m, N, K), m: rows per rank;
                                                        # (stride_am, stride_ak, stride_bk, stride_bn, stride_cm)
        sync_ptr, trace_ptr,                            # the sync block; the trace buffer or None
        rank, world_size, heap_bases,
        TILE: tl.constexpr,                             # (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M)
        B_TMA: tl.constexpr, WORLD_BLOCK: tl.constexpr):
    """fused_sequential: one persistent kernel; each tile multiplies rows of A read from their owner."""
    TRACE: tl.constexpr = trace_ptr is not None
    BLOCK_M: tl.constexpr = TILE[0]
    BLOCK_N: tl.constexpr = TILE[1]
    team = Team(rank, world_size, heap_bases)
    m, N = shape[0], shape[1]
    call, _, a_own = _enter(sync_ptr, a_local, source, shape, team, WORLD_BLOCK)
    team = wait_peers_ready(call, team)
    tiles = world_size * tl.cdiv(m, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    for tile in tl.range(tl.program_id(0), tiles, tl.num_programs(0)):
        t0 = trace.now_if(TRACE)
        src, pid_m, pid_n = shard_tile(tile, m, N, world_size, rank, BLOCK_M, BLOCK_N, TILE[3])
        a_src = tl.where(src == rank, a_own, translate(a_local, rank, src, team.heap_bases))  # src's A_local
        gemm = Gemm(a_src, b, shape, strides, BLOCK_M, BLOCK_N, TILE[2], TILE[3], False, B_TMA)
        acc = tile_dot(gemm, pid_m, pid_n)
        _store_rows(c, shape, strides, src, acc, pid_m, pid_n, BLOCK_M, BLOCK_N)
        trace.record(trace_ptr, trace.COMPUTE, tile, src, t0, rank, TRACE)
    finish_call(call, team)


@triton.jit
def _enter(sync_ptr, a_local, source, shape, team, WORLD_BLOCK: tl.constexpr):
    """``(call, arrival, a_own)``: enter the call (staging ``source`` into ``a_local`` first when given) and
    where this rank's own rows are read: ``source`` when given (no wait for the stage), else ``a_local``."""
    if source is not None:
        call, arrival = enter_call_staging(sync_ptr, a_local, source, shape[0] * shape[2], team, WORLD_BLOCK)
        a_own = source
    else:
        call, arrival = enter_call(sync_ptr, a_local, team, WORLD_BLOCK)
        a_own = a_local
    return call, arrival, a_own


@triton.jit
def _store_rows(c, shape, strides, src, acc, pid_m, pid_n, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Store tile ``(pid_m, pid_n)`` of source rank ``src``'s row shard (``m x N``, ``shape = (m, N, K)``)
    into C (``W*m x N``, row stride ``strides[4]``) in C's dtype."""
    m, N, stride_cm = shape[0], shape[1], strides[4]
    offs, mask = tile_offsets(pid_m, pid_n, m, N, stride_cm, 1, BLOCK_M, BLOCK_N)
    tl.store(c + tl.cast(src, tl.int64) * m * stride_cm + offs, acc.to(c.dtype.element_ty), mask=mask)


@triton.jit
def copy_rows(src_ptr, dst_ptr, row0, rows, K, stride_src, stride_dst, rank, peer, heap_bases,
              BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """Copy rows ``row0 .. row0 + BLOCK_M - 1`` (those below ``rows``) of a ``rows x K`` matrix
    from ``peer``'s copy of ``src_ptr`` into the local ``dst_ptr``, ``BLOCK_K`` columns at a time."""
    rm = row0 + tl.arange(0, BLOCK_M)
    rk = tl.arange(0, BLOCK_K)
    src = translate(src_ptr, rank, peer, heap_bases) + rm.to(tl.int64)[:, None] * stride_src
    dst = dst_ptr + rm.to(tl.int64)[:, None] * stride_dst
    for k in range(0, K, BLOCK_K):
        mask = (rm < rows)[:, None] & (k + rk < K)[None, :]
        tl.store(dst + (k + rk)[None, :], tl.load(src + (k + rk)[None, :], mask=mask), mask=mask)


@triton.jit
def _next_tile(call, static_next, j, mine, static_tiles):
    """Tile ``j`` (0, 1, ...) of a program with ``mine`` static tiles: ``static_next`` while ``j < mine``,
    then ``static_tiles`` + the next claim of work counter 1 (:func:`claim_work`)."""
    tile = tl.cast(static_next, tl.int64)  # a claim is an int64
    if j >= mine:
        tile = static_tiles + claim_work(call, 1)
    return tile


@triton.jit
def gather_gemm_kernel(
        a_local, source, a_full, b, c,                  # my rows of A (symmetric), the plain A_local it is staged
                                                        # from (or None), all rows (W*m x K), B, C
        shape, strides,                                 # (m, N, K), m: rows per rank;
                                                        # (stride_am, stride_ak, stride_bk, stride_bn, stride_cm)
        gather_programs,                                # the first gather_programs to arrive gather, the rest multiply
        sync_ptr, trace_ptr,                            # the sync block (its flags); the trace buffer or None
        rank, world_size, heap_bases,
        TILE: tl.constexpr,                             # (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M)
        B_TMA: tl.constexpr, WORLD_BLOCK: tl.constexpr):
    """workgroup_specialized: the first ``gather_programs`` programs to start claim the peers' row
    blocks of A (work counter 0) and copy each into ``a_full`` (``W*m x K``, row stride K; my own rows
    are not copied), releasing ``FLAGS[block]``. The later programs multiply from the start: the GEMM's
    tiles in order, my own rows first, straight from the caller's A_local with no wait, then each peer
    block once its flag is acquired; all rounds of tiles but the last two dealt out among them, the
    rest claimed (work counter 1) by every program, gather programs included once every block is
    claimed. The later programs started after every gather program, so a tile waits only on a block
    some running program copies, whichever programs the GPU runs first. At one rank there is nothing
    to gather and the launch has no gather programs."""
    TRACE: tl.constexpr = trace_ptr is not None
    BLOCK_M: tl.constexpr = TILE[0]
    BLOCK_N: tl.constexpr = TILE[1]
    team = Team(rank, world_size, heap_bases)
    m, N, K = shape[0], shape[1], shape[2]
    call, arrival, a_own = _enter(sync_ptr, a_local, source, shape, team, WORLD_BLOCK)
    flags = flag_words(call, team)
    blocks = tl.cdiv(m, BLOCK_M)  # row blocks per source rank
    if arrival < gather_programs:
        peers = wait_peers_ready(call, team)
        i = claim_work(call, 0)
        while i < (world_size - 1) * blocks:
            t0 = trace.now_if(TRACE)
            src = (rank + 1 + i // blocks) % world_size  # the peers' rows, in the GEMM's order
            block = src * blocks + i % blocks
            shard = a_full + tl.cast(src, tl.int64) * m * K
            copy_rows(a_local, shard, (i % blocks) * BLOCK_M, m, K, strides[0], K, rank, src, peers.heap_bases,
                      BLOCK_M, TILE[2])
            signal(flags + block, call.epoch, rank, rank, heap_bases, scope="gpu")  # read on this GPU only
            trace.record(trace_ptr, trace.COMM, block, src, t0, rank, TRACE)
            i = claim_work(call, 0)
    tiles = world_size * blocks * tl.cdiv(N, BLOCK_N)
    # The schedule: every round of tiles but the last two is dealt out statically among the programs that
    # start multiplying at once (program c of them takes tiles c, c + P, ...; no claim), the rest is
    # claimed one tile at a time by every program, the gather programs included once they are done (the
    # balance a dynamic schedule gives, at the cost of a claim per tile only in the last rounds).
    multipliers = tl.num_programs(0) - gather_programs
    static_tiles = tl.maximum(tiles // multipliers - 1, 0) * multipliers
    mine = 0  # my static tiles
    if arrival >= gather_programs:
        mine = static_tiles // multipliers
    tile = _next_tile(call, arrival - gather_programs, 0, mine, static_tiles)
    j = 1
    while tile < tiles:
        # The next tile is known (or claimed) before this one is computed, so a claim's round trip
        # hides behind the K loop instead of holding up the next tile's first loads.
        next_tile = _next_tile(call, tile + multipliers, j, mine, static_tiles)
        j += 1
        src, pid_m, pid_n = shard_tile(tile, m, N, world_size, rank, BLOCK_M, BLOCK_N, TILE[3])
        t0 = trace.now_if(TRACE)
        own = src == rank  # my own rows are read where they are, with no wait
        if not own:
            wait(flags + src * blocks + pid_m, call.epoch, rank, rank, heap_bases, cmp="ge", scope="gpu")
            trace.record(trace_ptr, trace.WAIT, tile, src, t0, rank, TRACE)
            t0 = trace.now_if(TRACE)
        # One tile_dot for both sources (two would pipeline two K loops, each with its own shared-memory
        # stages: past the 227 KiB a Hopper SM has at the default tiles), with A_local's strides for both:
        # A_local is contiguous (checked), laid out as a_full's shards are, so the compiler still sees the
        # unit column stride (a stride chosen per tile would hide it).
        # a_full was written by this kernel with ordinary stores: read with ordinary loads too (TMA would
        # need a proxy fence first).
        a_rows = tl.where(own, a_own, a_full + tl.cast(src, tl.int64) * m * K)
        acc = tile_dot(Gemm(a_rows, b, shape, (strides[0], strides[1], strides[2], strides[3]),
                            BLOCK_M, BLOCK_N, TILE[2], TILE[3], False, B_TMA), pid_m, pid_n)
        _store_rows(c, shape, strides, src, acc, pid_m, pid_n, BLOCK_M, BLOCK_N)
        trace.record(trace_ptr, trace.COMPUTE, tile, src, t0, rank, TRACE)
        tile = next_tile
    finish_call(call, team)
