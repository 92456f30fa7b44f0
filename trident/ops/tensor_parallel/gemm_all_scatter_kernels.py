"""Kernels of the GEMM + all-scatter patterns, built from a few device functions.

Every rank computes its column block ``A @ B_local`` tile by tile; each tile must end up in the
same place of every rank's ``C``. ``c`` below always points at the first element of *this
rank's* column block of ``C`` (``C[:, rank * N_local]``), so a tile's offsets are the same in
every rank's heap and ``trident.store(c + offs, tile, rank, peer, heap_bases)`` puts it there.

Synchronization: the call-level handshake of :mod:`trident.ops.fused.sync` (``enter_call``,
``wait_peers_ready`` before the first store into a peer, ``finish_call``), all in the one sync
block ``sync_ptr``, plus its tile flags in ``producer_consumer`` and ``workgroup_specialized``:
the GEMM releases ``FLAGS[tile] = epoch`` after writing a tile into the local ``C``; the
communication side acquires it, then reads the tile back and stores it into every peer's ``C``.
In ``workgroup_specialized`` the GEMM programs are the first to arrive (their role comes from the
arrival ticket of ``enter_call``, not from the program id), so a communication program waits only
on GEMM programs that started before it: the launch finishes however few of its programs are
resident at a time, and in the simulator (programs one after another) nothing waits for a
program not yet run. ``producer_consumer``'s GEMM kernel waits on nothing, and its scatter kernel
has fewer programs than the SMs (``split_roles``), so the GEMM always has an SM to run on.

A ``trace_ptr`` of None turns tracing off (the trace calls compile to nothing).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ... import trace
from ...device import signal, store, wait
from ...device.bundles import CallSync, Gemm, Output, Team
from ..fused.sync import call_epoch, enter_call, finish_call, flag_words, wait_peers_ready
from ..gemm.tiles import output_tile, tile_coords, tile_dot, tile_offsets


@triton.jit
def scatter_tile(c, offs, mask, values, tile, trace_ptr, team, FIRST: tl.constexpr):
    """Store a tile into peers ``rank + FIRST, ..., rank + world_size - 1`` (mod world_size).

    ``FIRST=0`` includes this rank's own ``C``; starting at the next rank spreads the traffic over
    the links instead of every rank hitting rank 0 first.
    """
    TRACE: tl.constexpr = trace_ptr is not None
    for i in range(FIRST, team.world_size):
        peer = (team.rank + i) % team.world_size
        t0 = trace.now_if(TRACE)
        store(c + offs, values, team.rank, peer, team.heap_bases, mask=mask)
        trace.record(trace_ptr, trace.COMM, tile, peer, t0, team.rank, TRACE)


@triton.jit
def produce_tiles(first, step, gemm, out, call, team, trace_ptr):
    """GEMM tiles ``first, first + step, ...`` into the local ``C``, each tile's flag released when written."""
    TRACE: tl.constexpr = trace_ptr is not None
    num_pid_m = tl.cdiv(gemm.M, gemm.BLOCK_M)
    num_pid_n = tl.cdiv(gemm.N, gemm.BLOCK_N)
    flags = flag_words(call, team)
    for tile in tl.range(first, num_pid_m * num_pid_n, step):
        t0 = trace.now_if(TRACE)
        pid_m, pid_n = tile_coords(tile, num_pid_m, num_pid_n, gemm.GROUP_M)
        acc = tile_dot(gemm, pid_m, pid_n)
        offs, mask = output_tile(out, pid_m, pid_n)
        tl.store(out.c + offs, acc.to(out.c.dtype.element_ty), mask=mask)
        signal(flags + tile, call.epoch, team.rank, team.rank, team.heap_bases, scope="gpu")  # read on this GPU only
        trace.record(trace_ptr, trace.COMPUTE, tile, team.rank, t0, team.rank, TRACE)


#: Tile flags a consumer acquires with one ``wait``: an ordered read of 8 flags costs about what one
#: costs, and after each wave of GEMM tiles the consumer has many finished tiles to catch up on.
FLAG_CHUNK = tl.constexpr(8)


@triton.jit
def consume_tiles(first, step, out, call, team, trace_ptr, WAIT_FLAGS: tl.constexpr):
    """Scatter tiles ``first, first + step, ...`` of the local column block ``out`` into every peer's ``C``.

    With ``WAIT_FLAGS`` the tiles are first acquired from the GEMM through their flags,
    :data:`FLAG_CHUNK` tiles per ``wait`` (one wait event each when tracing).
    """
    TRACE: tl.constexpr = trace_ptr is not None
    num_pid_m = tl.cdiv(out.M, out.BLOCK_M)
    num_pid_n = tl.cdiv(out.N, out.BLOCK_N)
    tiles = num_pid_m * num_pid_n
    flags = flag_words(call, team)
    team = wait_peers_ready(call, team)
    for chunk in tl.range(first, tiles, step * FLAG_CHUNK):
        if WAIT_FLAGS:
            t0 = trace.now_if(TRACE)
            group = chunk + tl.arange(0, FLAG_CHUNK) * step
            wait(flags + group, call.epoch, team.rank, team.rank, team.heap_bases, cmp="ge", mask=group < tiles,
                 scope="gpu")
            trace.record(trace_ptr, trace.WAIT, chunk, team.rank, t0, team.rank, TRACE)
        if team.world_size > 1:  # alone, there is nothing to read back and send
            for i in range(FLAG_CHUNK):
                tile = chunk + i * step
                if tile < tiles:
                    pid_m, pid_n = tile_coords(tile, num_pid_m, num_pid_n, out.GROUP_M)
                    send_tile(out, pid_m, pid_n, tile, trace_ptr, team)


#: Rows of a tile :func:`send_tile` copies at a time. A whole tile's element offsets and values take
#: about 300 registers per thread; a kernel that also holds a GEMM then spills, and the compiler
#: pays for it inside the GEMM's K loop too (it recomputes values there to free registers).
SEND_ROWS = tl.constexpr(32)


@triton.jit
def send_tile(out, pid_m, pid_n, tile, trace_ptr, team):
    """Copy tile ``(pid_m, pid_n)`` of the local column block ``out`` into every peer's ``C`` (the
    next rank first), :data:`SEND_ROWS` rows at a time (or the tile's, if fewer); one trace event per peer."""
    TRACE: tl.constexpr = trace_ptr is not None
    ROWS: tl.constexpr = out.BLOCK_M if out.BLOCK_M < SEND_ROWS else SEND_ROWS
    CHUNKS: tl.constexpr = out.BLOCK_M // ROWS
    for i in range(1, team.world_size):
        peer = (team.rank + i) % team.world_size
        t0 = trace.now_if(TRACE)
        for chunk in tl.range(pid_m * CHUNKS, (pid_m + 1) * CHUNKS):  # the tile's rows as tiles of ROWS rows
            offs, mask = tile_offsets(chunk, pid_n, out.M, out.N, out.stride_cm, out.stride_cn, ROWS, out.BLOCK_N)
            store(out.c + offs, tl.load(out.c + offs, mask=mask), team.rank, peer, team.heap_bases, mask=mask)
        trace.record(trace_ptr, trace.COMM, tile, peer, t0, team.rank, TRACE)


@triton.jit
def fused_sequential_kernel(
        a, b, c,                                        # A, B_local (descriptors or pointers), my block of C
        shape, strides,                                 # (M, N, K), N: this rank's columns;
                                                        # (stride_am, stride_ak, stride_bk, stride_bn, stride_cm)
        sync_ptr, trace_ptr,                            # the sync block; the trace buffer or None
        rank, world_size, heap_bases,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
        USE_TMA: tl.constexpr, WORLD_BLOCK: tl.constexpr):
    """One persistent kernel: each tile is computed, then stored straight into every rank's ``C``."""
    TRACE: tl.constexpr = trace_ptr is not None
    team = Team(rank, world_size, heap_bases)
    gemm = Gemm(a, b, shape, strides, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, USE_TMA)
    out = Output(c, gemm.M, gemm.N, strides[4], 1, BLOCK_M, BLOCK_N, GROUP_M)
    call, _ = enter_call(sync_ptr, c - rank * gemm.N, team, WORLD_BLOCK)  # C itself: c is my column block
    team = wait_peers_ready(call, team)
    num_pid_m = tl.cdiv(gemm.M, BLOCK_M)
    num_pid_n = tl.cdiv(gemm.N, BLOCK_N)
    for tile in tl.range(tl.program_id(0), num_pid_m * num_pid_n, tl.num_programs(0)):
        t0 = trace.now_if(TRACE)
        pid_m, pid_n = tile_coords(tile, num_pid_m, num_pid_n, GROUP_M)
        acc = tile_dot(gemm, pid_m, pid_n)
        values = acc.to(c.dtype.element_ty)
        trace.record(trace_ptr, trace.COMPUTE, tile, rank, t0, rank, TRACE)
        offs, mask = output_tile(out, pid_m, pid_n)
        scatter_tile(c, offs, mask, values, tile, trace_ptr, team, 0)
    finish_call(call, team)


@triton.jit
def workgroup_specialized_kernel(
        a, b, c,                                        # A, B_local (descriptors or pointers), my block of C
        shape, strides,                                 # (M, N, K), N: this rank's columns;
                                                        # (stride_am, stride_ak, stride_bk, stride_bn, stride_cm)
        gemm_programs,                                  # the first gemm_programs to arrive compute, the rest scatter
        sync_ptr, trace_ptr,                            # the sync block; the trace buffer or None
        rank, world_size, heap_bases,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
        USE_TMA: tl.constexpr, WORLD_BLOCK: tl.constexpr):
    """One kernel, two roles by arrival: the first ``gemm_programs`` programs to start compute
    tiles and release their flags; the later ones acquire the flags and scatter, so they wait only
    on GEMM programs already running (or done), whichever programs the GPU runs first."""
    team = Team(rank, world_size, heap_bases)
    gemm = Gemm(a, b, shape, strides, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, USE_TMA)
    out = Output(c, gemm.M, gemm.N, strides[4], 1, BLOCK_M, BLOCK_N, GROUP_M)
    call, arrival = enter_call(sync_ptr, c - rank * gemm.N, team, WORLD_BLOCK)  # C itself: c is my column block
    if arrival < gemm_programs:
        produce_tiles(arrival, gemm_programs, gemm, out, call, team, trace_ptr)
    else:
        consume_tiles(arrival - gemm_programs, tl.num_programs(0) - gemm_programs, out, call, team, trace_ptr, True)
    finish_call(call, team)


@triton.jit
def producer_kernel(
        a, b, c,                                        # A, B_local (descriptors or pointers), my block of C
        shape, strides,                                 # (M, N, K), N: this rank's columns;
                                                        # (stride_am, stride_ak, stride_bk, stride_bn, stride_cm)
        sync_ptr, trace_ptr,                            # the sync block (its flags); the trace buffer or None
        rank, world_size, heap_bases,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
        USE_TMA: tl.constexpr):
    """producer_consumer's GEMM (one stream): tiles into the local ``C``, each flag released when written.

    It reads the epoch that the scatter kernel advances only after every flag of this call is set,
    i.e. after every program of this kernel that has tiles has started. It does not enter the call
    (the scatter kernel does), so its call state has no use for ``WORLD_BLOCK``.
    """
    team = Team(rank, world_size, heap_bases)
    gemm = Gemm(a, b, shape, strides, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, USE_TMA)
    out = Output(c, gemm.M, gemm.N, strides[4], 1, BLOCK_M, BLOCK_N, GROUP_M)
    call = CallSync(sync_ptr, call_epoch(sync_ptr), 0, 1)
    produce_tiles(tl.program_id(0), tl.num_programs(0), gemm, out, call, team, trace_ptr)


@triton.jit
def scatter_kernel(
        c,                                              # my column block of C
        M, N, stride_cm,                                # N: this rank's columns
        sync_ptr, trace_ptr,                            # the sync block; the trace buffer or None
        rank, world_size, heap_bases,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr, WORLD_BLOCK: tl.constexpr,
        WAIT_FLAGS: tl.constexpr):
    """The all-scatter: producer_consumer's consumer (``WAIT_FLAGS``: tile by tile as the GEMM
    releases them, on a second stream) or bulk_synchronous's second kernel (after the whole GEMM).
    Its programs wait on the GEMM kernel, never on each other: the program id picks their tiles."""
    team = Team(rank, world_size, heap_bases)
    out = Output(c, M, N, stride_cm, 1, BLOCK_M, BLOCK_N, GROUP_M)
    call, _ = enter_call(sync_ptr, c - rank * N, team, WORLD_BLOCK)  # C itself: c is my column block
    consume_tiles(tl.program_id(0), tl.num_programs(0), out, call, team, trace_ptr, WAIT_FLAGS)
    finish_call(call, team)
