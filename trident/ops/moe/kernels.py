"""The kernel of ``trident.ops.moe_dispatch`` (docs/moe.md); the combine's are in :mod:`.combine_kernels`.

One launch, built on the fused ops' call protocol (:mod:`trident.ops.fused.sync`): ``enter_call``
gives the call's epoch and each program's arrival ticket, ``wait_peers_ready`` comes before a
program's first store into a peer, ``finish_call`` ends the call (when a kernel ends, every peer's
stores into this rank have landed). Flags are the sync block's tile flags, holding the epoch of the
call that set them, so nothing is ever reset.

Contiguous layout (``moe_dispatch_kernel``), roles by arrival ticket:

* ticket 0, the *planner*, waits on nothing of its own launch: it counts this rank's routing per
  expert (a histogram), puts the counts into row ``rank`` of every rank's count matrix (``[W, E]``,
  on the heap) and raises its flag there, waits for every rank's row (which doubles as the call's
  entry handshake: a peer's row follows its READY), then lays out every rank's
  receive buffer from the whole matrix: expert by expert, and inside an expert source rank by
  source rank. It writes this rank's ``recv_offsets``/``recv_counts``, the status words, and a
  *cursor* per expert: where this rank's rows for that expert start at its owner. Then it raises
  the local *layout* flag.
* every program (the planner too, afterwards) waits for the layout flag (set by ticket 0, which
  started first), then sends its (token, j) choices, ``PAIRS`` at a time: per choice an atomic add
  on the expert's cursor gives the row's slot at the owner, and the step's rows (with their
  scales, origins and j) are stored straight into the owners' receive buffers as one block of
  ``PAIRS`` rows, each row to its own owner. No flag per row: the call's exit handshake makes
  every peer's rows land before the kernel ends.

Masked layout: no planner; every program claims its rows' slots at the owners' cursors (a region
per local expert) and sends them; the call's last program turns its cursors into counts.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ...device import atomic_add, signal, store, wait
from ...device.bundles import Team
from ...device.memory import control_block, record_fault
from ...device.words import ERR_CAPACITY
from ..fused.sync import enter_call, finish_call, flag_words, wait_peers_ready

#: Status words (int64, local) a dispatch writes: the rows this rank receives (before clamping to
#: the capacity), the most rows any rank receives, and that rank.
STATUS_RECEIVED, STATUS_NEEDED, STATUS_WORST = 0, 1, 2
STATUS_WORDS = 4
_RECEIVED, _NEEDED, _WORST = tl.constexpr(STATUS_RECEIVED), tl.constexpr(STATUS_NEEDED), tl.constexpr(STATUS_WORST)

_FILL = tl.constexpr(1024)


@triton.jit
def _plan(topk_ptr, counts_ptr, local_ptr, status_ptr, sizes, call, team,
          E_BLOCK: tl.constexpr, CHUNK: tl.constexpr, REPORT: tl.constexpr):
    """The planner's part (ticket 0): count, exchange the counts, lay out every receive buffer.

    ``sizes`` is the kernel's; ``local_ptr`` holds the cursors, the scratch, then this rank's
    ``recv_offsets`` and ``recv_counts``."""
    tokens, _, _, k, experts_local, _, capacity = sizes
    rank, world_size, heap_bases, epoch = team.rank, team.world_size, team.heap_bases, call.epoch
    flags = flag_words(call, team)
    experts = experts_local * world_size
    offsets_ptr = local_ptr + 2 * experts
    recv_counts_ptr = offsets_ptr + experts_local
    e = tl.arange(0, E_BLOCK)
    in_e = e < experts
    entries = tokens * k
    hist = tl.zeros([E_BLOCK], dtype=tl.int32)
    for start in range(0, entries, CHUNK):
        offs = start + tl.arange(0, CHUNK)
        ids = tl.load(topk_ptr + offs, mask=offs < entries, other=-1)
        valid = (ids >= 0) & (ids < experts)
        hist += tl.histogram(tl.where(valid, ids, 0).to(tl.int32), E_BLOCK, mask=valid)
    # My row of every rank's count matrix, then its flag (release: the row is visible first).
    mine = counts_ptr + rank * experts + e
    for i in range(world_size):
        peer = (rank + i) % world_size
        store(mine, hist, rank, peer, heap_bases, mask=in_e)
        signal(flags + rank, epoch, rank, peer, heap_bases)
    ranks = tl.arange(0, call.WORLD_BLOCK)
    wait(flags + ranks, epoch, rank, rank, heap_bases, cmp="ge", mask=ranks < world_size)
    total = tl.zeros([E_BLOCK], dtype=tl.int32)   # rows each expert receives
    before = tl.zeros([E_BLOCK], dtype=tl.int32)  # of those, rows from ranks before me
    for s in range(world_size):
        row = tl.load(counts_ptr + s * experts + e, mask=in_e, other=0)
        total += row
        before += tl.where(s < rank, row, 0)
    excl = tl.cumsum(total, axis=0) - total       # rows of every expert before e, all owners
    owner = e // experts_local
    tl.store(local_ptr + experts + e, excl, mask=in_e)
    tl.debug_barrier()
    # Expert e's first row at its owner: the rows of every expert before e, less those before the owner's first.
    offset = excl - tl.load(local_ptr + experts + owner * experts_local, mask=in_e, other=0)
    tl.store(local_ptr + e, offset + before, mask=in_e)  # the cursors: my first row for e at its owner
    is_mine = in_e & (owner == rank)
    first = tl.minimum(offset, capacity)
    tl.store(offsets_ptr + e - rank * experts_local, first, mask=is_mine)
    tl.store(recv_counts_ptr + e - rank * experts_local, tl.minimum(offset + total, capacity) - first, mask=is_mine)
    zero = tl.sum(total * 0)
    needed, worst, received = zero, zero, zero
    for d in range(world_size):
        rows = tl.sum(tl.where(in_e & (owner == d), total, 0))
        worst = tl.where(rows > needed, d, worst)
        needed = tl.maximum(needed, rows)
        received = tl.where(d == rank, rows, received)
    tl.store(status_ptr + _RECEIVED, received.to(tl.int64))
    tl.store(status_ptr + _NEEDED, needed.to(tl.int64))
    tl.store(status_ptr + _WORST, worst.to(tl.int64))
    if REPORT:  # no host check follows this call: the host raises the fault at ctx.check() / d.check()
        if needed > capacity:
            record_fault(control_block(rank, heap_bases), ERR_CAPACITY, rank, worst, 0, capacity, needed)


@triton.jit
def _claim_slots(ids, valid, cursor_ptr, sizes, team, MASKED: tl.constexpr):
    """``(slots, keep)`` of a step's choices (expert ``ids``, ``valid`` lanes): each lane's row slot at
    its expert's owner, and whether it fits (a row past the capacity is not delivered, and reported).

    Contiguous layout: an atomic add on this rank's own cursor for the expert (the planner set it to
    where this rank's rows for it start). Masked layout: an atomic add on the expert's cursor at its
    owner, a slot inside the expert's fixed region of ``capacity / E_local`` rows; a row lost at
    another rank is recorded here too (this rank's combine would be incomplete; a lower bound: the
    claims it saw), the owner records its experts' exact need at the end of the call."""
    experts_local, capacity = sizes[4], sizes[6]
    rank, heap_bases = team.rank, team.heap_bases
    if MASKED:
        owners = tl.where(valid, ids // experts_local, rank).to(tl.int32)
        expert = tl.where(valid, ids % experts_local, 0)
        region = capacity // experts_local
        claimed = atomic_add(cursor_ptr + expert, 1, rank, owners, heap_bases, mask=valid, sem="relaxed")
        keep = valid & (claimed < region)
        over = tl.where(valid & ~keep & (owners != rank), claimed + 1, 0)
        most = tl.max(over, axis=0)
        if most > 0:
            owner = tl.max(tl.where(over == most, owners, -1), axis=0)
            record_fault(control_block(rank, heap_bases), ERR_CAPACITY, rank, owner, 1, region, most)
        slots = expert * region + claimed
    else:
        slots = tl.atomic_add(cursor_ptr + tl.where(valid, ids, 0), 1, mask=valid, sem="relaxed", scope="gpu")
        keep = valid & (slots < capacity)
    return slots, keep


@triton.jit
def _send_rows(x_ptr, scales_ptr, topk_ptr, me, recv, cursor_ptr, sizes, team,
               PAIRS: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_S: tl.constexpr, OPTIONS: tl.constexpr):
    """Store this program's (token, j) choices into their experts' owners' buffers, ``PAIRS`` choices
    a step (steps ``me, me + programs, ...`` over the ``tokens * k`` choices): every lane of a step
    takes its row's slot at the owner (an atomic add on the expert's cursor), then the step moves its
    rows as one ``PAIRS x BLOCK_R`` block a column chunk at a time, each lane-row to its own owner.
    ``recv = (recv_x_ptr, recv_scales_ptr, recv_src_ptr, recv_j_ptr, sent_ptr)`` (``sent``: local,
    where each choice went); ``sizes`` and ``OPTIONS`` are the kernel's; the slots as :func:`_claim_slots`
    gives them, the rows as :func:`_copy_rows` or :func:`_quantize_rows` moves them."""
    MASKED: tl.constexpr = OPTIONS[1]
    QUANTIZE: tl.constexpr = OPTIONS[2]
    tokens, _, _, k, experts_local, max_tokens, capacity = sizes
    recv_x_ptr, recv_scales_ptr, recv_src_ptr, recv_j_ptr, sent_ptr = recv
    rank, heap_bases = team.rank, team.heap_bases
    experts = experts_local * team.world_size
    lanes = tl.arange(0, PAIRS)
    choices = tokens * k
    for start in range(me * PAIRS, choices, tl.num_programs(0) * PAIRS):
        choice = start + lanes.to(tl.int64)   # = token * k + j
        listed = choice < choices
        ids = tl.load(topk_ptr + choice, mask=listed, other=-1)
        valid = listed & (ids >= 0) & (ids < experts)
        slots, keep = _claim_slots(ids, valid, cursor_ptr, sizes, team, MASKED)
        dests = tl.where(keep, ids // experts_local, rank).to(tl.int32)
        slots = tl.where(keep, slots, 0).to(tl.int64)
        token = choice // k
        # The rows first: their first loads (masked by `valid`, not by the claims) go out while the claims
        # are in flight; the bookkeeping stores after them would hold those loads back.
        to = (recv_x_ptr, recv_scales_ptr, slots, dests, keep)
        if QUANTIZE:
            _quantize_rows(x_ptr, token, valid, to, sizes, team, PAIRS, BLOCK_R)
        else:
            _copy_rows(x_ptr, scales_ptr, token, valid, to, sizes, team, BLOCK_R, BLOCK_S)
        # Where each choice went (for the combine's local reads): owner * capacity + slot, or -1.
        tl.store(sent_ptr + choice, tl.where(keep, dests * capacity + slots, -1).to(tl.int32), mask=listed)
        store(recv_src_ptr + slots, rank * max_tokens + token, rank, dests, heap_bases, mask=keep)
        store(recv_j_ptr + slots, (choice % k).to(tl.int32), rank, dests, heap_bases, mask=keep)


@triton.jit
def _copy_rows(x_ptr, scales_ptr, token, valid, to, sizes, team, BLOCK_R: tl.constexpr, BLOCK_S: tl.constexpr):
    """Rows ``token`` of ``x`` (``row_words`` words each; the ``valid`` lanes read) and their fp8 scales,
    as raw bits, into the owners' buffers: ``to = (recv_x_ptr, recv_scales_ptr, slots, dests, keep)``,
    a lane per row (the ``keep`` lanes stored)."""
    row_words, scale_words = sizes[1], sizes[2]
    recv_x_ptr, recv_scales_ptr, slots, dests, keep = to
    cols = tl.arange(0, BLOCK_R)
    for c in range(0, row_words, BLOCK_R):
        offs = c + cols
        in_row = (offs < row_words)[None, :]
        rows = tl.load(x_ptr + token[:, None] * row_words + offs[None, :], mask=valid[:, None] & in_row)
        store(recv_x_ptr + slots[:, None] * row_words + offs[None, :], rows, team.rank, dests[:, None],
              team.heap_bases, mask=keep[:, None] & in_row)
    if scales_ptr is not None:
        scols = tl.arange(0, BLOCK_S)
        mask = keep[:, None] & (scols < scale_words)[None, :]
        scales = tl.load(scales_ptr + token[:, None] * scale_words + scols[None, :], mask=mask)
        store(recv_scales_ptr + slots[:, None] * scale_words + scols[None, :], scales, team.rank, dests[:, None],
              team.heap_bases, mask=mask)


@triton.jit
def _quantize_rows(x_ptr, token, valid, to, sizes, team, PAIRS: tl.constexpr, BLOCK_R: tl.constexpr):
    """Rows ``token`` of ``x`` (``hidden`` bf16, fp16 or fp32 values each) quantized on the way to fp8
    e4m3 with a float32 scale per 128 columns (``scale = max(amax, 1e-4) / 448``, ``q = x / scale``,
    both rounded to nearest), into the owners' ``recv_x`` and ``recv_scales``: ``valid`` and ``to`` as for
    :func:`_copy_rows`; ``BLOCK_R`` is a multiple of 128 columns."""
    hidden, groups = sizes[1], sizes[2]
    recv_x_ptr, recv_scales_ptr, slots, dests, keep = to
    G: tl.constexpr = BLOCK_R // 128
    cols = tl.arange(0, BLOCK_R)
    for c in range(0, hidden, BLOCK_R):
        offs = c + cols
        in_row = (offs < hidden)[None, :]
        rows = tl.load(x_ptr + token[:, None] * hidden + offs[None, :], mask=valid[:, None] & in_row,
                       other=0.0).to(tl.float32)
        rows = tl.reshape(rows, (PAIRS, G, 128))
        scale = tl.math.div_rn(tl.maximum(tl.max(tl.abs(rows), axis=2), 1e-4), tl.full((PAIRS, G), 448.0, tl.float32))
        q = tl.math.div_rn(rows, tl.broadcast_to(scale[:, :, None], (PAIRS, G, 128))).to(tl.float8e4nv)
        store(recv_x_ptr + slots[:, None] * hidden + offs[None, :], tl.reshape(q, (PAIRS, BLOCK_R)), team.rank,
              dests[:, None], team.heap_bases, mask=keep[:, None] & in_row)
        group = c // 128 + tl.arange(0, G)
        store(recv_scales_ptr + slots[:, None] * groups + group[None, :], scale, team.rank, dests[:, None],
              team.heap_bases, mask=keep[:, None] & (group < groups)[None, :])


@triton.jit
def _close_masked(cursor_ptr, layout_ptr, status_ptr, sizes, rank, heap_bases,
                  E_BLOCK: tl.constexpr, REPORT: tl.constexpr):
    """The masked layout's end, by the call's last program once every peer is done with this rank:
    local expert ``e`` received what the senders claimed at its cursor (clamped to its region), from
    row ``e * region``; the cursors go back to 0 for the next call (whose claims come after this
    rank's next READY); an expert that needed more rows than its region is reported.
    ``layout_ptr``: this rank's ``recv_offsets`` then ``recv_counts``."""
    _, _, _, _, experts_local, _, capacity = sizes
    region = capacity // experts_local
    e = tl.arange(0, E_BLOCK)
    in_e = e < experts_local
    claimed = tl.atomic_xchg(cursor_ptr + e, 0, mask=in_e, sem="relaxed", scope="gpu")  # read at L2, and reset
    claimed = tl.where(in_e, claimed, 0)
    got = tl.minimum(claimed, region)
    tl.store(layout_ptr + e, e * region, mask=in_e)
    tl.store(layout_ptr + experts_local + e, got, mask=in_e)
    needed = tl.max(claimed, axis=0)
    tl.store(status_ptr + _RECEIVED, tl.sum(got, axis=0).to(tl.int64))
    tl.store(status_ptr + _NEEDED, needed.to(tl.int64))
    tl.store(status_ptr + _WORST, (needed * 0 + rank).to(tl.int64))
    if REPORT:  # offset 1: the masked layout's message
        if needed > region:
            record_fault(control_block(rank, heap_bases), ERR_CAPACITY, rank, rank, 1, region, needed)


@triton.jit
def moe_dispatch_kernel(
    x_ptr, scales_ptr, topk_ptr,                                # my tokens (row_words words a row), scales, routing
    recv_x_ptr, recv_scales_ptr, recv_src_ptr, recv_j_ptr,      # the receive buffers on the heap, `capacity` rows each
    counts_ptr, local_ptr, status_ptr,                          # counts [W, E] (masked: cursors [E_local]) on the heap
    sizes,                     # (tokens, row_words, scale_words, k, experts_local, max_tokens, capacity)
    sync_ptr,
    rank, world_size, heap_bases,
    BLOCKS: tl.constexpr,      # (E_BLOCK, PAIRS, CHUNK, BLOCK_R, BLOCK_S)
    OPTIONS: tl.constexpr,     # (REPORT: record a capacity fault, MASKED: the masked layout, QUANTIZE: to fp8)
    WORLD_BLOCK: tl.constexpr,
):
    """Send every (token, j) with a valid expert to the expert's owner (see the module doc).

    ``local_ptr`` holds ``2 * E + 2 * E_local + max_tokens * k`` int32 words: the cursors, the
    planner's scratch, this rank's ``recv_offsets`` and ``recv_counts`` (``E_local`` each), then where
    each of its (token, j) went (``owner * capacity + slot``, -1 for none: the combine's map).
    """
    E_BLOCK: tl.constexpr = BLOCKS[0]
    PAIRS: tl.constexpr = BLOCKS[1]
    CHUNK: tl.constexpr = BLOCKS[2]
    BLOCK_R: tl.constexpr = BLOCKS[3]
    BLOCK_S: tl.constexpr = BLOCKS[4]
    REPORT: tl.constexpr = OPTIONS[0]
    MASKED: tl.constexpr = OPTIONS[1]
    capacity, experts_local = sizes[6], sizes[4]
    layout_ptr = local_ptr + 2 * world_size * experts_local  # recv_offsets, recv_counts, then the map
    recv = (recv_x_ptr, recv_scales_ptr, recv_src_ptr, recv_j_ptr, layout_ptr + 2 * experts_local)
    team = Team(rank, world_size, heap_bases)
    call, me = enter_call(sync_ptr, recv_x_ptr, team, WORLD_BLOCK)
    if MASKED:
        # No planner, no count exchange: a sender claims its slots at the owner's cursors, which the
        # owner reset at the end of its last call, before its READY of this one.
        team = wait_peers_ready(call, team)
        _send_rows(x_ptr, scales_ptr, topk_ptr, me, recv, counts_ptr, sizes, team, PAIRS, BLOCK_R, BLOCK_S, OPTIONS)
        if finish_call(call, team):  # every sender's claims and rows into this rank have landed
            _close_masked(counts_ptr, layout_ptr, status_ptr, sizes, rank, heap_bases, E_BLOCK, REPORT)
    else:
        flags = flag_words(call, team)  # [0, W): the count rows' flags; W: the layout (local)
        # The count exchange is the entry handshake: a peer's count row comes after its READY (the same
        # program releases both), and only the planner touches the count matrix, which every peer has
        # done reading when its last call ended (finish_call). So the planner starts at once, and the
        # READY every program then acquires is already there: no round trip of its own.
        if me == 0:
            _plan(topk_ptr, counts_ptr, local_ptr, status_ptr, sizes, call, team, E_BLOCK, CHUNK, REPORT)
            signal(flags + world_size, call.epoch, rank, rank, heap_bases, scope="gpu")
        else:
            wait(flags + world_size, call.epoch, rank, rank, heap_bases, cmp="ge", scope="gpu")
        team = wait_peers_ready(call, team)  # and the receive buffers lie where this rank's do (symmetry check)
        # Rows no peer fills this call say so: recv_src = -1.
        unused = tl.minimum(tl.load(status_ptr + _RECEIVED), capacity)
        for start in range(unused + me * _FILL, capacity, tl.num_programs(0) * _FILL):
            offs = start + tl.arange(0, _FILL)
            tl.store(recv_src_ptr + offs, tl.full([_FILL], -1, tl.int64), mask=offs < capacity)
        _send_rows(x_ptr, scales_ptr, topk_ptr, me, recv, local_ptr, sizes, team, PAIRS, BLOCK_R, BLOCK_S, OPTIONS)
        finish_call(call, team)


__all__ = ["moe_dispatch_kernel", "STATUS_RECEIVED", "STATUS_NEEDED", "STATUS_WORST", "STATUS_WORDS"]
