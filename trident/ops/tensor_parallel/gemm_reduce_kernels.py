"""Kernels of the GEMM + reduction ops: each rank's ``A @ B`` is a partial sum, summed across ranks.

Rank s holds A (M x K) and B (K x N), K being its shard of the inner dimension, so its product
is a partial sum of the whole M x N result. Two ways to sum it, chosen by the constexpr
``TO_EVERY_RANK``:

* reduce-scatter (gemm_reduce_scatter, ``TO_EVERY_RANK`` off): rank r keeps rows
  ``r*m .. r*m + m - 1`` (M = W*m) of the sum. The product is cut into W row shards of m rows,
  each tiled on its own (:func:`~trident.ops.gemm.tiles.shard_tile`), so a tile's rows all belong to
  one owner, and rank s stores its partial of rank r's rows into rank r's ``slots[s]``
  (:func:`push_tiles`).
* all-reduce (gemm_all_reduce, ``TO_EVERY_RANK`` on): every rank keeps the whole sum. The product
  is tiled once (:func:`~trident.ops.gemm.tiles.tile_coords`) and rank s stores each tile into
  ``slots[s]`` of *every* rank (one-shot: each tile is computed once and pushed W times;
  :func:`push_all_tiles`).

Either way a rank's own partial of its rows goes straight into its C, and every other rank's
into a symmetric ``slots`` array (W x rows x N, C's dtype; rows = m or M; ``slots[s]`` from rank s,
this rank's own slot unused); C is then its own partial plus the W - 1 peers' slots, in fp32. At
one rank there is nothing to sum: the patterns are the GEMM and the call's handshake.

* :func:`push_kernel` (``fused_sequential``): one persistent kernel computes every tile and
  pushes it; :func:`reduce_slots_kernel` then adds the peers' slots into C (after the handshake of
  :func:`~trident.ops.fused.sync.finish_call`, every peer's partials have landed when the first
  kernel ends).
* :func:`push_reduce_kernel` (``workgroup_specialized``): GEMM programs push tiles as in
  ``push_kernel`` and release a flag per tile where they stored it (``FLAGS[s * T + tile] =
  epoch`` in the receiver's sync block, T tiles per slot); reducer programs acquire the W flags of
  each of their tiles and sum it while the GEMM goes on. The roles come from the arrival ticket,
  GEMM programs first: a reducer waits only on GEMM programs that started before it (here, or at
  a peer, where they wait on nothing of their launch either), however few programs are resident
  at a time.

Every rank starts with the next rank and ends with itself, so at any time the ranks write to
different peers. A ``trace_ptr`` of None turns tracing off.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ... import trace
from ...device import signal, signal_peers, store, translate, wait
from ...device.bundles import Gemm, Team
from ..fused.sync import enter_call, finish_call, flag_words, wait_peers_ready
from ..gemm.tiles import shard_tile, tile_coords, tile_dot, tile_dot_range, tile_offsets


@triton.jit
def release_tile_flag(flag, epoch, owner, team):
    """Release a pushed tile's flag at ``owner`` (its copy of ``flag``). My own tiles' flags are
    read only by this GPU's reducers, so their release is gpu-scoped: a sys-scoped one makes the
    program wait, once per tile, until its stores are visible to the whole system."""
    if owner == team.rank:
        signal(flag, epoch, team.rank, team.rank, team.heap_bases, scope="gpu")
    else:
        signal(flag, epoch, team.rank, owner, team.heap_bases)


@triton.jit
def push_tiles(first, step, gemm, slots, c, m, flags_ptr, call, trace_ptr, team):
    """Tiles ``first, first + step, ...`` of my partial product (``gemm``: A has ``W * m`` rows), each
    stored into its owner's ``slots[rank]`` (``m x N``), or into my C (``m x N``, contiguous) where I own
    it; with a ``flags_ptr`` (not None) also release the tile's flag at the owner."""
    TRACE: tl.constexpr = trace_ptr is not None
    BLOCK_M: tl.constexpr = gemm.BLOCK_M
    BLOCK_N: tl.constexpr = gemm.BLOCK_N
    rank, world_size, N = team.rank, team.world_size, gemm.N
    per_shard = tl.cdiv(m, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    for tile in tl.range(first, world_size * per_shard, step):
        t0 = trace.now_if(TRACE)
        owner, pid_m, pid_n = shard_tile(tile, m, N, world_size, rank + 1, BLOCK_M, BLOCK_N, gemm.GROUP_M)
        row0 = owner * m + pid_m * BLOCK_M  # < M: an int32 (TMA coordinates are)
        acc = tile_dot_range(gemm, row0, pid_n * BLOCK_N, 0, tl.cdiv(gemm.K, gemm.BLOCK_K))
        trace.record(trace_ptr, trace.COMPUTE, tile, owner, t0, rank, TRACE)
        t0 = trace.now_if(TRACE)
        # One store, to my C or to my slot at the owner: a tile's addresses are computed once, as they are stored.
        mine = slots + tl.cast(rank, tl.int64) * m * N  # my slot, at the same offset in every rank's heap
        base = tl.where(owner == rank, c, translate(mine, rank, owner, team.heap_bases))
        offs, mask = tile_offsets(pid_m, pid_n, m, N, N, 1, BLOCK_M, BLOCK_N)
        tl.store(base + offs, acc.to(c.dtype.element_ty), mask=mask)
        if flags_ptr is not None:
            release_tile_flag(flags_ptr + rank * per_shard + tile % per_shard, call.epoch, owner, team)
        trace.record(trace_ptr, trace.COMM, tile, owner, t0, rank, TRACE)


@triton.jit
def push_all_tiles(first, step, gemm, slots, c, flags_ptr, call, trace_ptr, team):
    """Tiles ``first, first + step, ...`` of my partial product, each stored into ``slots[rank]`` of
    every other rank and into my C (``M x N``, contiguous); with a ``flags_ptr`` (not None) also release
    the tile's flag at every rank."""
    TRACE: tl.constexpr = trace_ptr is not None
    rank, world_size, M, N = team.rank, team.world_size, gemm.M, gemm.N
    num_pid_m = tl.cdiv(M, gemm.BLOCK_M)
    num_pid_n = tl.cdiv(N, gemm.BLOCK_N)
    tiles = num_pid_m * num_pid_n
    mine = slots + tl.cast(rank, tl.int64) * M * N  # my slot, at the same offset in every rank's heap
    for tile in tl.range(first, tiles, step):
        t0 = trace.now_if(TRACE)
        pid_m, pid_n = tile_coords(tile, num_pid_m, num_pid_n, gemm.GROUP_M)
        acc = tile_dot(gemm, pid_m, pid_n)
        trace.record(trace_ptr, trace.COMPUTE, tile, rank, t0, rank, TRACE)
        t0 = trace.now_if(TRACE)
        offs, mask = tile_offsets(pid_m, pid_n, M, N, N, 1, gemm.BLOCK_M, gemm.BLOCK_N)
        part = acc.to(slots.dtype.element_ty)
        for i in range(1, world_size):  # the next rank first
            store(mine + offs, part, rank, (rank + i) % world_size, team.heap_bases, mask=mask)
        tl.store(c + offs, acc.to(c.dtype.element_ty), mask=mask)
        if flags_ptr is not None:
            # Every copy first, then the flags: one release to all the peers at once (a release per peer
            # waited for each copy to land before the next was sent), and my own gpu-scoped.
            flag = flags_ptr + rank * tiles + tile
            signal_peers(flag, call.epoch, rank, world_size, team.heap_bases, call.WORLD_BLOCK)
            release_tile_flag(flag, call.epoch, rank, team)
        trace.record(trace_ptr, trace.COMM, tile, rank, t0, rank, TRACE)


@triton.jit
def _push(first, step, gemm, slots, c, rows, flags_ptr, call, trace_ptr, team, TO_EVERY_RANK: tl.constexpr):
    """:func:`push_all_tiles` or :func:`push_tiles` (``rows`` = m: a slot's rows), as ``TO_EVERY_RANK`` says."""
    if TO_EVERY_RANK:
        push_all_tiles(first, step, gemm, slots, c, flags_ptr, call, trace_ptr, team)
    else:
        push_tiles(first, step, gemm, slots, c, rows, flags_ptr, call, trace_ptr, team)


@triton.jit
def _partial_product(a, b, shape, strides, world_size, TILE: tl.constexpr, USE_TMA: tl.constexpr,
                     TO_EVERY_RANK: tl.constexpr):
    """The :class:`~trident.device.bundles.Gemm` of my partial product, from the kernels' launch
    arguments: A has ``rows`` rows (``shape = (rows, N, K)``) to every rank, else ``W * rows`` (every
    owner's m); ``TILE = (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M)``."""
    rows = shape[0]
    a_rows = rows if TO_EVERY_RANK else world_size * rows
    return Gemm(a, b, (a_rows, shape[1], shape[2]), strides, TILE[0], TILE[1], TILE[2], TILE[3], USE_TMA)


@triton.jit
def sum_slots(slots, c, offs, mask, m, N, rank, world_size):
    """``c[offs] + sum over s != rank of slots[s][offs]`` in fp32 (C holds my own partial), stored into
    ``c + offs`` in C's dtype."""
    acc = tl.load(c + offs, mask=mask, other=0.0).to(tl.float32)
    for s in range(world_size):
        if s != rank:
            acc += tl.load(slots + tl.cast(s, tl.int64) * m * N + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(c + offs, acc.to(c.dtype.element_ty), mask=mask)


@triton.jit
def push_kernel(
        a, b, slots, c,                                 # A, B (descriptors or pointers), the slots (symmetric), my C
        shape, strides,                                 # (rows, N, K), rows: of a slot (m, or M to every rank),
                                                        # K: my shard; (stride_am, stride_ak, stride_bk, stride_bn)
        sync_ptr, trace_ptr,                            # the sync block; the trace buffer or None
        rank, world_size, heap_bases,
        TILE: tl.constexpr,                             # (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M)
        USE_TMA: tl.constexpr, TO_EVERY_RANK: tl.constexpr, WORLD_BLOCK: tl.constexpr):
    """fused_sequential: every tile of my partial product goes into ``slots[rank]`` of its owner
    (of every rank with ``TO_EVERY_RANK``), or into my C where I own it."""
    team = Team(rank, world_size, heap_bases)
    rows = shape[0]
    gemm = _partial_product(a, b, shape, strides, world_size, TILE, USE_TMA, TO_EVERY_RANK)
    call, _ = enter_call(sync_ptr, slots, team, WORLD_BLOCK)
    team = wait_peers_ready(call, team)
    _push(tl.program_id(0), tl.num_programs(0), gemm, slots, c, rows,
          None, call, trace_ptr, team, TO_EVERY_RANK)  # no flags: reduce_slots_kernel runs after
    finish_call(call, team)


@triton.jit
def reduce_slots_kernel(slots, c, m, N, rank, world_size, BLOCK: tl.constexpr):
    """``C += the peers' slots`` (``m x N``, contiguous; C holds my own partial), after :func:`push_kernel`."""
    for start in tl.range(tl.program_id(0) * BLOCK, m * N, tl.num_programs(0) * BLOCK):
        offs = start + tl.arange(0, BLOCK).to(tl.int64)
        sum_slots(slots, c, offs, offs < m * N, m, N, rank, world_size)


#: Rows of a tile a reducer sums at a time: a whole tile's offsets and fp32 sums would take most of a
#: thread's registers, and the GEMM programs of the same kernel would pay for them (spills).
SUM_ROWS = tl.constexpr(32)


@triton.jit
def reduce_flagged_tiles(first, step,
                         slots, c, rows, N,               # my W slots and C (rows x N, contiguous)
                         call, trace_ptr, team,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """Tiles ``first, first + step, ...`` of C: acquire the tile's flag from every rank (rank s
    flags ``FLAGS[s * T + tile]`` of my sync block, T tiles; mine once my own partial is in C), then
    add the peers' slots into C while later tiles are still being computed (a reducer program of a
    ``workgroup_specialized`` kernel)."""
    TRACE: tl.constexpr = trace_ptr is not None
    rank = team.rank
    flags = flag_words(call, team)
    num_pid_m = tl.cdiv(rows, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    sources = tl.arange(0, call.WORLD_BLOCK)
    ROWS: tl.constexpr = BLOCK_M if BLOCK_M < SUM_ROWS else SUM_ROWS
    CHUNKS: tl.constexpr = BLOCK_M // ROWS
    for tile in tl.range(first, num_pid_m * num_pid_n, step):
        t0 = trace.now_if(TRACE)
        wait(flags + sources * (num_pid_m * num_pid_n) + tile, call.epoch, rank, rank, team.heap_bases, cmp="ge",
             mask=sources < team.world_size)
        trace.record(trace_ptr, trace.WAIT, tile, rank, t0, rank, TRACE)
        t0 = trace.now_if(TRACE)
        pid_m, pid_n = tile_coords(tile, num_pid_m, num_pid_n, GROUP_M)
        for chunk in tl.range(pid_m * CHUNKS, (pid_m + 1) * CHUNKS):  # the tile's rows as tiles of ROWS rows
            offs, mask = tile_offsets(chunk, pid_n, rows, N, N, 1, ROWS, BLOCK_N)
            sum_slots(slots, c, offs, mask, rows, N, rank, team.world_size)
        trace.record(trace_ptr, trace.COMPUTE, tile, rank, t0, rank, TRACE)


@triton.jit
def push_reduce_kernel(
        a, b, slots, c,                                 # A, B (descriptors or pointers), the slots, my rows of C
        shape, strides,                                 # (rows, N, K), rows: of a slot (m, or M to every rank),
                                                        # K: my shard; (stride_am, stride_ak, stride_bk, stride_bn)
        gemm_programs,                                  # the first gemm_programs to arrive push, the rest reduce
        sync_ptr, trace_ptr,                            # the sync block (its flags); the trace buffer or None
        rank, world_size, heap_bases,
        TILE: tl.constexpr,                             # (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M)
        USE_TMA: tl.constexpr, TO_EVERY_RANK: tl.constexpr, WORLD_BLOCK: tl.constexpr):
    """workgroup_specialized, two roles by arrival: the first ``gemm_programs`` programs to start
    push tiles and flag them where they stored them; the later ones reduce each of my tiles once
    all W ranks have flagged it. Reducers wait only on GEMM programs: this rank's have all
    started, and no rank's GEMM programs wait on a reducer."""
    team = Team(rank, world_size, heap_bases)
    rows = shape[0]
    gemm = _partial_product(a, b, shape, strides, world_size, TILE, USE_TMA, TO_EVERY_RANK)
    call, arrival = enter_call(sync_ptr, slots, team, WORLD_BLOCK)
    flags = flag_words(call, team)
    if arrival < gemm_programs:
        peers = wait_peers_ready(call, team)
        _push(arrival, gemm_programs, gemm, slots, c, rows, flags, call, trace_ptr, peers, TO_EVERY_RANK)
    else:
        reduce_flagged_tiles(arrival - gemm_programs, tl.num_programs(0) - gemm_programs,
                             slots, c, rows, gemm.N,
                             call, trace_ptr, team,
                             gemm.BLOCK_M, gemm.BLOCK_N, gemm.GROUP_M)
    finish_call(call, team)
