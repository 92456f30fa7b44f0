"""The collective kernels. All follow one shape:

    pid = arrival_ticket(sync_ptr + ARRIVAL)        # my index: my arrival ticket, not my program id
    epoch, shift = _enter(src, sync_ptr, pid, ...)  # publish where my input lies, meet every rank
    for each of my tiles: read peers, write mine  # persistent loop: tile = pid, pid + programs, ...
    _exit(epoch, sync_ptr, ...)                   # peers are done reading my input; count this call

``epoch`` is this program's call number, kept on the device. ``shift[p]`` says how many elements
rank p's input lies after mine: ranks may pass different heap tensors (or one a heap tensor and
another a staged plain one), and peers' copies are found through it, not assumed at my offset.

A program's index ``pid`` is its *arrival ticket* (:func:`trident.device.arrival_ticket` on the
``ARRIVAL_WORD``): 0, 1, 2, ... in the order the programs of the launch actually start on this
rank, not ``tl.program_id``. Program ``pid`` of one rank only ever waits for program ``pid`` of
the others, so the k-th program to start on a rank meets the k-th to start on every peer: whatever
order each GPU starts programs in, and however few are resident at a time, the programs that wait
are matched with programs that have started. The kernels also run in the simulator, where a
launch's programs run one after another. Epochs live on the device, so CUDA-graph replays stay
correct.

Every kernel takes one ``sync_ptr``: the workspace's sync block, symmetric int64 words zeroed
once, laid out as::

    COUNTS_WORD + pid                  the last call program pid finished (its epoch); local only
    ARGS_WORD + pid                    where this rank's input of program pid's call lies (heap
                                       offset), published for the peers at the entry sync
    ARRIVAL_WORD                       arrival tickets of the running launch (see below); local only
    FLAGS_WORD + (phase * MAX_PROGRAMS + pid) * world_size + r
                                       sync slot of program pid at phase (entry, middle, exit):
                                       the last epoch rank r announced there

Kernel signatures list one concern per line: the call's tensors and sizes, the sync block, the
team (``rank, world_size, heap_bases`` as in the device API), then the meta-parameters.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..device import arrival_ticket, load, sync_ranks
from .device import reduce_tile, shifted

#: Most programs a collective launches; also the number of per-program words in the sync block.
MAX_PROGRAMS = 256
#: Syncs a call can do (entry, middle, exit): each has its own slots.
PHASES = 3
#: Where each part of the sync block starts (int64 words; see the module docstring).
COUNTS_WORD = 0
ARGS_WORD = MAX_PROGRAMS
ARRIVAL_WORD = 2 * MAX_PROGRAMS
FLAGS_WORD = 2 * MAX_PROGRAMS + 1

_MAX_PROGRAMS = tl.constexpr(MAX_PROGRAMS)
_COUNTS = tl.constexpr(COUNTS_WORD)
_ARGS = tl.constexpr(ARGS_WORD)
_ARRIVAL = tl.constexpr(ARRIVAL_WORD)
_FLAGS = tl.constexpr(FLAGS_WORD)
_ENTRY, _MIDDLE, _EXIT = tl.constexpr(0), tl.constexpr(1), tl.constexpr(2)


def sync_words(world_size: int) -> int:
    """Size of the sync block (int64 words) for ``world_size`` ranks.

    Example::

        sync = ctx.zeros(sync_words(ctx.world_size), dtype=torch.int64)
    """
    return FLAGS_WORD + PHASES * MAX_PROGRAMS * world_size


@triton.jit
def _sync(sync_ptr, PHASE: tl.constexpr, epoch, pid,
          rank, world_size, heap_bases,
          WORLD_BLOCK: tl.constexpr):
    """Meet program ``pid`` (by arrival) of every rank at ``PHASE`` of call ``epoch``."""
    slots = sync_ptr + _FLAGS + (PHASE * _MAX_PROGRAMS + pid) * world_size
    sync_ranks(slots, epoch, rank, world_size, heap_bases, WORLD_BLOCK)


@triton.jit
def _enter(src_ptr,
           sync_ptr, pid,
           rank, world_size, heap_bases,
           WORLD_BLOCK: tl.constexpr):
    """Publish my input's heap offset, meet every rank (entry sync), read every rank's offset.

    Returns ``(epoch, shift)``. A rank overwrites its published offset only in its next call,
    after every peer has passed this call's later sync, so nobody reads a stale one.
    """
    epoch = tl.load(sync_ptr + _COUNTS + pid) + 1
    my_base = tl.load(heap_bases + rank)
    mine = tl.cast(src_ptr, tl.int64) - my_base
    slot = sync_ptr + _ARGS + pid
    tl.store(slot, mine)  # published by the release inside the sync
    _sync(sync_ptr, _ENTRY, epoch, pid, rank, world_size, heap_bases, WORLD_BLOCK)
    ranks = tl.arange(0, WORLD_BLOCK)
    valid = ranks < world_size
    their_slots = tl.load(heap_bases + ranks, mask=valid, other=0) + (tl.cast(slot, tl.int64) - my_base)
    theirs = tl.load(their_slots.to(tl.pointer_type(tl.int64)), mask=valid, other=0)
    ELEMENT: tl.constexpr = (src_ptr.dtype.element_ty.primitive_bitwidth + 7) // 8  # bool: 1 bit, 1 byte
    return epoch, tl.where(valid, (theirs - mine) // ELEMENT, 0)


@triton.jit
def _finish(epoch, sync_ptr, pid):
    """Count this call as done by this program (the next call's epoch follows it)."""
    tl.store(sync_ptr + _COUNTS + pid, epoch)


@triton.jit
def _exit(epoch,
          sync_ptr, pid,
          rank, world_size, heap_bases,
          WORLD_BLOCK: tl.constexpr):
    """Meet every rank again (nobody reads my input any more), then count this call as done."""
    _sync(sync_ptr, _EXIT, epoch, pid, rank, world_size, heap_bases, WORLD_BLOCK)
    _finish(epoch, sync_ptr, pid)


@triton.jit
def _tile(tile, limit, BLOCK: tl.constexpr):
    offs = tl.cast(tile, tl.int64) * BLOCK + tl.arange(0, BLOCK)
    return offs, offs < limit


@triton.jit
def _pull_tiles(src_ptr, dst_ptr, n, pid, rank, peer, heap_bases, BLOCK: tl.constexpr):
    """Copy this program's tiles of ``n`` elements of ``peer``'s copy of ``src`` into my ``dst``."""
    for tile in range(pid, tl.cdiv(n, BLOCK), tl.num_programs(0)):
        offs, mask = _tile(tile, n, BLOCK)
        tl.store(dst_ptr + offs, load(src_ptr + offs, rank, peer, heap_bases, mask=mask), mask=mask)


@triton.jit
def _stage_tiles(src_ptr, dst_ptr, n, pid, BLOCK: tl.constexpr):
    """Copy this program's tiles (``pid, pid + programs, ...``) of ``n`` elements from ``src`` to ``dst``.

    How a plain input gets onto the heap inside the kernel: program ``pid`` of every rank stages
    exactly the tiles that program ``pid`` of the peers later reads, and the entry sync's release
    publishes them, so no separate copy (nor its host time) is needed.
    """
    for tile in range(pid, tl.cdiv(n, BLOCK), tl.num_programs(0)):
        offs, mask = _tile(tile, n, BLOCK)
        tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=mask), mask=mask)


@triton.jit
def all_gather_kernel(
    src_ptr, inp_ptr, out_ptr, n,  # my n input elements (src; inp: on the heap); out holds every rank's
    sync_ptr,
    rank, world_size, heap_bases,
    STAGE: tl.constexpr, BLOCK: tl.constexpr, WORLD_BLOCK: tl.constexpr,
):
    """Every rank reads every peer's ``n`` input elements into its slot of ``out``.

    With ``STAGE`` the input ``src`` is not on the heap: it is first copied into ``inp`` (a heap buffer).
    """
    pid = arrival_ticket(sync_ptr + _ARRIVAL)  # the launch's programs by arrival, not by program id
    if STAGE:
        _stage_tiles(src_ptr, inp_ptr, n, pid, BLOCK)
    epoch, shift = _enter(inp_ptr, sync_ptr, pid, rank, world_size, heap_bases, WORLD_BLOCK)
    for tile in range(pid, tl.cdiv(n, BLOCK), tl.num_programs(0)):
        offs, mask = _tile(tile, n, BLOCK)
        for i in range(world_size):
            peer = (rank + i) % world_size
            value = load(shifted(inp_ptr, shift, peer) + offs, rank, peer, heap_bases, mask=mask)
            tl.store(out_ptr + tl.cast(peer, tl.int64) * n + offs, value, mask=mask)
    _exit(epoch, sync_ptr, pid, rank, world_size, heap_bases, WORLD_BLOCK)


@triton.jit
def reduce_scatter_kernel(
    src_ptr, inp_ptr, out_ptr, m,  # world_size chunks of m input elements (src; inp: on the heap)
    sync_ptr,
    rank, world_size, heap_bases,
    OP: tl.constexpr, ACC: tl.constexpr, STAGE: tl.constexpr,
    BLOCK: tl.constexpr, WORLD_BLOCK: tl.constexpr,
):
    """Rank r reduces chunk r (``m`` elements) of every rank's input into ``out``.

    With ``STAGE`` the input ``src`` is not on the heap: it is first copied into ``inp`` (a heap
    buffer), each chunk tiled as the reduction reads it, so program ``pid`` stages what the peers'
    programs ``pid`` read.
    """
    pid = arrival_ticket(sync_ptr + _ARRIVAL)  # the launch's programs by arrival, not by program id
    if STAGE:
        for chunk in range(world_size):
            start = tl.cast(chunk, tl.int64) * m
            _stage_tiles(src_ptr + start, inp_ptr + start, m, pid, BLOCK)
    epoch, shift = _enter(inp_ptr, sync_ptr, pid, rank, world_size, heap_bases, WORLD_BLOCK)
    for tile in range(pid, tl.cdiv(m, BLOCK), tl.num_programs(0)):
        offs, mask = _tile(tile, m, BLOCK)
        mine = inp_ptr + tl.cast(rank, tl.int64) * m + offs
        tl.store(out_ptr + offs, reduce_tile(mine, rank, world_size, heap_bases, mask, OP, ACC, shift), mask=mask)
    _exit(epoch, sync_ptr, pid, rank, world_size, heap_bases, WORLD_BLOCK)


@triton.jit
def all_to_all_kernel(
    src_ptr, inp_ptr, out_ptr, table_ptr, inner, equal_rows,  # rows of `inner` elements, moved as the table says
    sync_ptr,
    rank, world_size, heap_bases,
    EQUAL: tl.constexpr, STAGE: tl.constexpr, BLOCK: tl.constexpr, WORLD_BLOCK: tl.constexpr,
):
    """Rows ``table[0:W]`` = how many rows each rank sends to each rank, ``table[W:2W]`` = where they start
    in its input, ``table[2W:3W]`` = where the rows from each rank start in my output (this rank's table).

    With ``EQUAL`` every rank sends ``equal_rows`` rows to every rank, in rank order: no table is read.
    With ``STAGE`` (equal rows only) the input ``src`` is not on the heap: it is first copied into
    ``inp`` (a heap buffer), each rank's chunk tiled as the peers' programs ``pid`` read it.
    """
    pid = arrival_ticket(sync_ptr + _ARRIVAL)  # the launch's programs by arrival, not by program id
    if STAGE:
        for chunk in range(world_size):
            start = tl.cast(chunk, tl.int64) * equal_rows * inner
            _stage_tiles(src_ptr + start, inp_ptr + start, equal_rows * inner, pid, BLOCK)
    epoch, shift = _enter(inp_ptr, sync_ptr, pid, rank, world_size, heap_bases, WORLD_BLOCK)
    for i in range(world_size):
        peer = (rank + i) % world_size
        if EQUAL:
            count = equal_rows * inner
            src = shifted(inp_ptr, shift, peer) + tl.cast(rank, tl.int64) * count
            dst = out_ptr + tl.cast(peer, tl.int64) * count
        else:
            count = load(table_ptr + rank, rank, peer, heap_bases) * inner
            first = load(table_ptr + world_size + rank, rank, peer, heap_bases)
            src = shifted(inp_ptr, shift, peer) + first * inner
            dst = out_ptr + tl.load(table_ptr + 2 * world_size + peer) * inner
        _pull_tiles(src, dst, count, pid, rank, peer, heap_bases, BLOCK)
    _exit(epoch, sync_ptr, pid, rank, world_size, heap_bases, WORLD_BLOCK)


@triton.jit
def broadcast_kernel(
    src_ptr, x_ptr, out_ptr, n, src,  # rank src's n elements (its src, through x on the heap) into every rank's out
    sync_ptr,
    rank, world_size, heap_bases,
    STAGE: tl.constexpr, COPY: tl.constexpr, BLOCK: tl.constexpr, WORLD_BLOCK: tl.constexpr,
):
    """Every rank but ``src`` reads ``src``'s ``x`` (on the heap) into its own ``out``.

    On rank ``src``: with ``STAGE`` the caller's tensor (``src_ptr``, not on the heap) is first
    copied into ``x``; with ``COPY`` it is also copied into ``out`` (a result in another tensor).
    """
    pid = arrival_ticket(sync_ptr + _ARRIVAL)  # the launch's programs by arrival, not by program id
    if STAGE:
        _stage_tiles(src_ptr, x_ptr, n, pid, BLOCK)
    epoch, shift = _enter(x_ptr, sync_ptr, pid, rank, world_size, heap_bases, WORLD_BLOCK)
    if rank != src:
        _pull_tiles(shifted(x_ptr, shift, src), out_ptr, n, pid, rank, src, heap_bases, BLOCK)
    elif COPY:
        _stage_tiles(src_ptr, out_ptr, n, pid, BLOCK)
    _exit(epoch, sync_ptr, pid, rank, world_size, heap_bases, WORLD_BLOCK)


@triton.jit
def all_reduce_one_shot_kernel(
    src_ptr, x_ptr, scratch_ptr, out_ptr, n,  # n elements: src's reduced over ranks into out, through x
    sync_ptr,
    rank, world_size, heap_bases,
    OP: tl.constexpr, ACC: tl.constexpr,
    STAGE: tl.constexpr, BLOCK: tl.constexpr, WORLD_BLOCK: tl.constexpr,
):
    """Every rank reads every peer's whole tensor ``x`` (on the heap).

    In place (``STAGE`` off: ``src``, ``x`` and ``out`` are one tensor) results wait in ``scratch``
    until peers are done reading ``x``. With ``STAGE`` the caller's ``src`` is first copied into
    ``x`` (a heap buffer), and results go straight to ``out``, which no peer reads.
    """
    pid = arrival_ticket(sync_ptr + _ARRIVAL)  # the launch's programs by arrival, not by program id
    if STAGE:
        _stage_tiles(src_ptr, x_ptr, n, pid, BLOCK)
    epoch, shift = _enter(x_ptr, sync_ptr, pid, rank, world_size, heap_bases, WORLD_BLOCK)
    for tile in range(pid, tl.cdiv(n, BLOCK), tl.num_programs(0)):
        offs, mask = _tile(tile, n, BLOCK)
        total = reduce_tile(x_ptr + offs, rank, world_size, heap_bases, mask, OP, ACC, shift)
        if STAGE:
            tl.store(out_ptr + offs, total.to(out_ptr.dtype.element_ty), mask=mask)
        else:
            tl.store(scratch_ptr + offs, total, mask=mask)
    _exit(epoch, sync_ptr, pid, rank, world_size, heap_bases, WORLD_BLOCK)
    if not STAGE:
        for tile in range(pid, tl.cdiv(n, BLOCK), tl.num_programs(0)):
            offs, mask = _tile(tile, n, BLOCK)
            tl.store(out_ptr + offs, tl.load(scratch_ptr + offs, mask=mask), mask=mask)


@triton.jit
def all_reduce_two_shot_kernel(
    src_ptr, x_ptr, scratch_ptr, out_ptr, n, chunk,  # n elements (world_size chunks of `chunk`), src into out
    sync_ptr,
    rank, world_size, heap_bases,
    OP: tl.constexpr, ACC: tl.constexpr,
    STAGE: tl.constexpr, BLOCK: tl.constexpr, WORLD_BLOCK: tl.constexpr,
):
    """Reduce-scatter into scratch (rank r owns chunk r), then every rank gathers every chunk into ``out``.

    Tile t of every chunk belongs to the same program on every rank, so after the middle sync of
    program ``pid`` the tiles it gathers are reduced, and nobody reads them from ``x`` any more.
    Scratch (a workspace buffer: the same offset everywhere) is reused only after the next call's
    entry sync, so no exit sync is needed. With ``STAGE`` the caller's ``src`` is first copied into
    ``x`` on the heap (program ``pid`` stages tile t of every chunk, which is what program ``pid``
    of each peer reads); without, ``src``, ``x`` and ``out`` are one tensor.
    """
    pid = arrival_ticket(sync_ptr + _ARRIVAL)  # the launch's programs by arrival, not by program id
    tiles = tl.cdiv(chunk, BLOCK)
    if STAGE:
        for owner in range(world_size):
            for tile in range(pid, tiles, tl.num_programs(0)):
                local, in_chunk = _tile(tile, chunk, BLOCK)
                offs = tl.cast(owner, tl.int64) * chunk + local
                mask = in_chunk & (offs < n)
                tl.store(x_ptr + offs, tl.load(src_ptr + offs, mask=mask), mask=mask)
    epoch, shift = _enter(x_ptr, sync_ptr, pid, rank, world_size, heap_bases, WORLD_BLOCK)
    for tile in range(pid, tiles, tl.num_programs(0)):
        local, in_chunk = _tile(tile, chunk, BLOCK)
        offs = tl.cast(rank, tl.int64) * chunk + local
        mask = in_chunk & (offs < n)
        total = reduce_tile(x_ptr + offs, rank, world_size, heap_bases, mask, OP, ACC, shift)
        tl.store(scratch_ptr + offs, total, mask=mask)
    _sync(sync_ptr, _MIDDLE, epoch, pid, rank, world_size, heap_bases, WORLD_BLOCK)
    for i in range(world_size):
        owner = (rank + i) % world_size
        for tile in range(pid, tiles, tl.num_programs(0)):
            local, in_chunk = _tile(tile, chunk, BLOCK)
            offs = tl.cast(owner, tl.int64) * chunk + local
            mask = in_chunk & (offs < n)
            tl.store(out_ptr + offs, load(scratch_ptr + offs, rank, owner, heap_bases, mask=mask), mask=mask)
    _finish(epoch, sync_ptr, pid)
