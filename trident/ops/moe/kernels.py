"""The kernel of ``trident.ops.moe_dispatch`` (docs/moe.md); the combine's are in :mod:`.combine_kernels`.

One launch, built on the fused ops' call protocol (:mod:`trident.ops.fused.sync`): ``enter_call``
gives the call's epoch and each program's arrival ticket, ``wait_peers_ready`` comes before a
program's first store into a peer, ``finish_call`` ends the call (when a kernel ends, every peer's
stores into this rank have landed). Flags are the sync block's tile flags, holding the epoch of the
call that set them, so nothing is ever reset.

Contiguous layout (``moe_dispatch_kernel``):

* programs claim chunks of this rank's routing and count them per expert (a histogram each, added
  into a tally); the one that counts the last chunk, the *planner*, puts the whole count into row
  ``rank`` of every rank's count matrix (``[W, E]``, on the heap) and raises its flag there, waits
  for every rank's row, then lays out every rank's
  receive buffer from the whole matrix: expert by expert, and inside an expert source rank by
  source rank. It writes this rank's ``recv_offsets``/``recv_counts``, the status words, and a
  *cursor* per expert: where this rank's rows for that expert start at its owner. Then it raises
  the local *layout* flag.
* every program (the planner too, afterwards) waits for the layout flag (the last chunk belongs
  to a program that runs, so the wait ends), then sends its tokens, ``TOKENS`` at a time: per
  (token, j) choice an atomic add on the expert's cursor gives the row's slot at the owner, and
  the step's rows (with their
  scales, origins and j) are read once and stored straight into the owners' receive buffers, one
  copy per choice, each to its own owner. No flag per row: the call's exit handshake makes every
  peer's rows land before the kernel ends.

Masked layout: no planner; every program claims its rows' slots at the owners' cursors (a region
per local expert) and sends them; the call's last program turns its cursors into counts.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ...device import atomic_add, signal, store, sync_ranks, wait
from ...device.bundles import Team
from ...device.memory import control_block, record_fault
from ...device.words import ERR_CAPACITY
from ..fused.sync import claim_work, count_done, enter_call, finish_call, flag_words, wait_peers_ready

#: Status words (int64, local) a dispatch writes: the rows this rank receives (before clamping to
#: the capacity), the most rows any rank receives, and that rank.
STATUS_RECEIVED, STATUS_NEEDED, STATUS_WORST = 0, 1, 2
STATUS_WORDS = 4
_RECEIVED, _NEEDED, _WORST = tl.constexpr(STATUS_RECEIVED), tl.constexpr(STATUS_NEEDED), tl.constexpr(STATUS_WORST)

#: Most experts a dispatch routes to: the planner holds one count per expert in registers, and the
#: count buffer starts with a tally of this many words (zero between calls) before the count matrix.
MAX_EXPERTS = 1024
_TALLY = tl.constexpr(MAX_EXPERTS)
_FILL = tl.constexpr(1024)


@triton.jit
def _count_routing(topk_ptr, tally_ptr, sizes, call, team, E_BLOCK: tl.constexpr, CHUNK: tl.constexpr):
    """``(plans, hist)``: programs claim the rank's routing entries ``CHUNK`` at a time and count them per
    expert; the program that counts the last chunk gets ``plans`` true and the whole histogram.

    With several chunks each one's counts are added into the tally (``E`` int32 words, zero between
    calls: the planner reads and resets them) and counted done (acq_rel), so the last one sees them
    all. A claimed chunk belongs to a running program and counting waits on nothing, so the count
    ends however few programs run. A single chunk is planned by whoever claims it, with no tally."""
    tokens, k, experts = sizes[0], sizes[3], sizes[4] * team.world_size
    entries = tokens * k
    chunks = tl.maximum(tl.cdiv(entries, CHUNK), 1)
    e = tl.arange(0, E_BLOCK)
    plans = 0
    hist = tl.zeros([E_BLOCK], dtype=tl.int32)
    chunk = claim_work(call, 0)
    while chunk < chunks:
        offs = chunk.to(tl.int64) * CHUNK + tl.arange(0, CHUNK)
        ids = tl.load(topk_ptr + offs, mask=offs < entries, other=-1)
        valid = (ids >= 0) & (ids < experts)
        counted = tl.histogram(tl.where(valid, ids, 0).to(tl.int32), E_BLOCK, mask=valid)
        if chunks == 1:
            plans = 1
            hist = counted
        else:
            tl.atomic_add(tally_ptr + e, counted, mask=counted > 0, sem="relaxed", scope="gpu")
            if count_done(call, 1) == chunks - 1:  # every other chunk's counts are in the tally
                plans = 1
                # The whole count, and the tally back to zero for the next call.
                hist = tl.atomic_xchg(tally_ptr + e, 0, mask=e < experts, sem="relaxed", scope="gpu")
        chunk = claim_work(call, 0)
    return plans, hist


@triton.jit
def _plan(hist, counts_ptr, local_ptr, status_ptr, sizes, call, team, E_BLOCK: tl.constexpr, REPORT: tl.constexpr):
    """The planner's part (the program that counted the last routing chunk): exchange the counts
    (``hist``, this rank's rows per expert), lay out every receive buffer.

    ``sizes`` is the kernel's; ``local_ptr`` holds the cursors, the scratch, then this rank's
    ``recv_offsets`` and ``recv_counts``."""
    capacity = sizes[6]
    experts_local = sizes[4]
    rank, world_size, heap_bases, epoch = team.rank, team.world_size, team.heap_bases, call.epoch
    flags = flag_words(call, team)
    experts = experts_local * world_size
    offsets_ptr = local_ptr + 2 * experts
    recv_counts_ptr = offsets_ptr + experts_local
    e = tl.arange(0, E_BLOCK)
    in_e = e < experts
    # My row of every rank's count matrix, then its flag at every peer (release: the row is visible
    # first). All rows first, then one release to every peer at once: a release per peer in the loop
    # waited for each peer's row to land before writing the next (world_size round trips in a row, not
    # one). My own row needs no flag: this program wrote it, and the release's CTA barrier orders it.
    mine = counts_ptr + rank * experts + e
    for i in range(world_size):
        peer = (rank + i) % world_size
        store(mine, hist, rank, peer, heap_bases, mask=in_e)
    sync_ranks(flags, epoch, rank, world_size, heap_bases, call.WORLD_BLOCK)
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
    """``(slots, keep)`` of a step's choices (a ``[tokens, k]`` block of expert ``ids``, ``valid`` lanes):
    each lane's row slot at its expert's owner, and whether it fits (a row past the capacity is not
    delivered, and reported).

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
        most = tl.max(tl.max(over, axis=1), axis=0)
        if most > 0:
            owner = tl.max(tl.max(tl.where(over == most, owners, -1), axis=1), axis=0)
            record_fault(control_block(rank, heap_bases), ERR_CAPACITY, rank, owner, 1, region, most)
        slots = expert * region + claimed
    else:
        slots = tl.atomic_add(cursor_ptr + tl.where(valid, ids, 0), 1, mask=valid, sem="relaxed", scope="gpu")
        keep = valid & (slots < capacity)
    return slots, keep


@triton.jit
def _step_choices(start, sizes, BLOCKS: tl.constexpr):
    """``(token, choice, listed)`` of the step that starts at token ``start``: its ``TOKENS`` token
    indices, each ``(token, j)``'s index into ``topk_idx`` (a ``[TOKENS, K_BLOCK]`` block) and which
    of those exist (inside the tokens and ``k``)."""
    TOKENS: tl.constexpr = BLOCKS[1]
    K_BLOCK: tl.constexpr = BLOCKS[2]
    tokens, k = sizes[0], sizes[3]
    token = start + tl.arange(0, TOKENS).to(tl.int64)
    j = tl.arange(0, K_BLOCK)
    return token, token[:, None] * k + j[None, :], (token < tokens)[:, None] & (j < k)[None, :]


@triton.jit
def _step_ids(topk_ptr, start, sizes, BLOCKS: tl.constexpr):
    """The expert ids of the step that starts at token ``start``: a ``[TOKENS, K_BLOCK]`` block, -1
    past the tokens or past ``k``."""
    _, choice, listed = _step_choices(start, sizes, BLOCKS)
    return tl.load(topk_ptr + choice, mask=listed, other=-1)


@triton.jit
def _send_rows(x_ptr, scales_ptr, topk_ptr, ids, recv, cursor_ptr, sizes, team, BLOCKS: tl.constexpr,
               OPTIONS: tl.constexpr):
    """Store this program's tokens' rows into their experts' owners' buffers, ``TOKENS`` tokens a step
    (steps ``pid, pid + programs, ...``; ``ids``: the first step's, loaded before the call's
    handshake, and each step loads the next one's while it moves its own rows). A step claims the
    slots of all its ``(token, j)`` choices at once (an atomic add per choice on the expert's
    cursor), then moves its rows a column chunk at a time, each chunk read from ``x`` once and
    stored once per choice, each copy to its own owner (a token's k copies cost one read of it, not
    k). ``recv = (recv_x_ptr, recv_scales_ptr, recv_src_ptr, recv_j_ptr, sent_ptr)`` (``sent``:
    local, where each choice went); ``sizes``, ``BLOCKS`` and ``OPTIONS`` are the kernel's; the
    slots as :func:`_claim_slots` gives them, the rows as :func:`_copy_rows` or
    :func:`_quantize_rows` moves them."""
    TOKENS: tl.constexpr = BLOCKS[1]
    K_BLOCK: tl.constexpr = BLOCKS[2]
    MASKED: tl.constexpr = OPTIONS[1]
    QUANTIZE: tl.constexpr = OPTIONS[2]
    tokens, _, _, _, experts_local, max_tokens, capacity = sizes
    recv_x_ptr, recv_scales_ptr, recv_src_ptr, recv_j_ptr, sent_ptr = recv
    rank, heap_bases = team.rank, team.heap_bases
    experts = experts_local * team.world_size
    j = tl.arange(0, K_BLOCK)
    stride = tl.num_programs(0) * TOKENS
    for start in range(tl.program_id(0) * TOKENS, tokens, stride):
        token, choice, listed = _step_choices(start, sizes, BLOCKS)
        has = token < tokens
        valid = listed & (ids >= 0) & (ids < experts)
        upcoming = _step_ids(topk_ptr, start + stride, sizes, BLOCKS)  # in flight while this step moves rows
        slots, keep = _claim_slots(ids, valid, cursor_ptr, sizes, team, MASKED)
        dests = tl.where(keep, ids // experts_local, rank).to(tl.int32)
        slots = tl.where(keep, slots, 0).to(tl.int64)
        # The rows first: their first loads (masked by `has`, not by the claims) go out while the claims
        # are in flight; the bookkeeping stores after them would hold those loads back.
        to = (recv_x_ptr, recv_scales_ptr, slots, dests, keep)
        if QUANTIZE:
            _quantize_rows(x_ptr, token, has, to, sizes, team, BLOCKS)
        else:
            _copy_rows(x_ptr, scales_ptr, token, has, to, sizes, team, BLOCKS)
        # Where each choice went (for the combine's local reads): owner * capacity + slot, or -1.
        tl.store(sent_ptr + choice, tl.where(keep, dests * capacity + slots, -1).to(tl.int32), mask=listed)
        store(recv_src_ptr + slots, rank * max_tokens + token[:, None] + slots * 0, rank, dests, heap_bases, mask=keep)
        store(recv_j_ptr + slots, j[None, :] + (slots * 0).to(tl.int32), rank, dests, heap_bases, mask=keep)
        ids = upcoming


@triton.jit
def _choice(block, jj, K_BLOCK: tl.constexpr):
    """Column ``jj`` of a step's ``[TOKENS, K_BLOCK]`` block (one value per token)."""
    return tl.sum(tl.where(tl.arange(0, K_BLOCK)[None, :] == jj, block, 0), axis=1)


@triton.jit
def _store_copies(ptr, width, cols, value, to, team, K_BLOCK: tl.constexpr):
    """Store ``value`` (``[TOKENS, C]``: columns ``cols`` of each token's row) once per choice:
    ``ptr[slot, cols]`` (rows of ``width`` elements) at each choice's owner, for its ``keep`` lanes.
    ``to`` as :func:`_copy_rows` takes it (its ``recv_*`` pointers unused here)."""
    _, _, slots, dests, keep = to
    in_row = (cols < width)[None, :]
    for jj in tl.static_range(K_BLOCK):
        slot = _choice(slots, jj, K_BLOCK)
        dest = _choice(dests, jj, K_BLOCK)
        kept = _choice(keep.to(tl.int32), jj, K_BLOCK) != 0
        store(ptr + slot[:, None] * width + cols[None, :], value, team.rank, dest[:, None], team.heap_bases,
              mask=kept[:, None] & in_row)


@triton.jit
def _copy_rows(x_ptr, scales_ptr, token, has, to, sizes, team, BLOCKS: tl.constexpr):
    """Rows ``token`` of ``x`` (``row_words`` words each; the ``has`` lanes read) and their fp8 scales, as
    raw bits, into the owners' buffers, one copy per choice: ``to = (recv_x_ptr, recv_scales_ptr,
    slots, dests, keep)``, ``[TOKENS, K_BLOCK]`` blocks (the ``keep`` lanes stored)."""
    K_BLOCK: tl.constexpr = BLOCKS[2]
    BLOCK_R: tl.constexpr = BLOCKS[4]
    BLOCK_S: tl.constexpr = BLOCKS[5]
    row_words, scale_words = sizes[1], sizes[2]
    recv_x_ptr, recv_scales_ptr = to[0], to[1]
    for c in range(0, row_words, BLOCK_R):
        offs = c + tl.arange(0, BLOCK_R)
        in_row = (offs < row_words)[None, :]
        rows = tl.load(x_ptr + token[:, None] * row_words + offs[None, :], mask=has[:, None] & in_row)
        _store_copies(recv_x_ptr, row_words, offs, rows, to, team, K_BLOCK)
    if scales_ptr is not None:
        scols = tl.arange(0, BLOCK_S)
        scales = tl.load(scales_ptr + token[:, None] * scale_words + scols[None, :],
                         mask=has[:, None] & (scols < scale_words)[None, :])
        _store_copies(recv_scales_ptr, scale_words, scols, scales, to, team, K_BLOCK)


@triton.jit
def _quantize_rows(x_ptr, token, has, to, sizes, team, BLOCKS: tl.constexpr):
    """Rows ``token`` of ``x`` (``hidden`` bf16, fp16 or fp32 values each) quantized on the way to fp8
    e4m3 with a float32 scale per 128 columns (``scale = max(amax, 1e-4) / 448``, ``q = x / scale``,
    both rounded to nearest), once per token, into the owners' ``recv_x`` and ``recv_scales``, one
    copy per choice: ``has`` and ``to`` as for :func:`_copy_rows`; ``BLOCK_R`` is a multiple of 128 columns."""
    TOKENS: tl.constexpr = BLOCKS[1]
    K_BLOCK: tl.constexpr = BLOCKS[2]
    BLOCK_R: tl.constexpr = BLOCKS[4]
    G: tl.constexpr = BLOCK_R // 128
    hidden, groups = sizes[1], sizes[2]
    recv_x_ptr, recv_scales_ptr = to[0], to[1]
    for c in range(0, hidden, BLOCK_R):
        offs = c + tl.arange(0, BLOCK_R)
        rows = tl.load(x_ptr + token[:, None] * hidden + offs[None, :], mask=has[:, None] & (offs < hidden)[None, :],
                       other=0.0).to(tl.float32)
        rows = tl.reshape(rows, (TOKENS, G, 128))
        scale = tl.math.div_rn(tl.maximum(tl.max(tl.abs(rows), axis=2), 1e-4), tl.full((TOKENS, G), 448.0, tl.float32))
        q = tl.math.div_rn(rows, tl.broadcast_to(scale[:, :, None], (TOKENS, G, 128))).to(tl.float8e4nv)
        _store_copies(recv_x_ptr, hidden, offs, tl.reshape(q, (TOKENS, BLOCK_R)), to, team, K_BLOCK)
        _store_copies(recv_scales_ptr, groups, c // 128 + tl.arange(0, G), scale, to, team, K_BLOCK)


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
    counts_ptr, local_ptr, status_ptr,                          # tally, counts [W, E] (masked: cursors [E_local])
    sizes,                     # (tokens, row_words, scale_words, k, experts_local, max_tokens, capacity)
    sync_ptr,
    rank, world_size, heap_bases,
    BLOCKS: tl.constexpr,      # (E_BLOCK, TOKENS, K_BLOCK, CHUNK, BLOCK_R, BLOCK_S)
    OPTIONS: tl.constexpr,     # (REPORT: record a capacity fault, MASKED: the masked layout, QUANTIZE: to fp8)
    WORLD_BLOCK: tl.constexpr,
):
    """Send every (token, j) with a valid expert to the expert's owner (see the module doc).

    ``counts_ptr`` (heap, int32): the tally (:data:`MAX_EXPERTS` words, zero between calls) then the
    count matrix ``[W, E]``; in the masked layout the cursors ``[E_local]`` (zero between calls).

    ``local_ptr`` holds ``2 * E + 2 * E_local + max_tokens * k`` int32 words: the cursors, the
    planner's scratch, this rank's ``recv_offsets`` and ``recv_counts`` (``E_local`` each), then where
    each of its (token, j) went (``owner * capacity + slot``, -1 for none: the combine's map).
    """
    E_BLOCK: tl.constexpr = BLOCKS[0]
    CHUNK: tl.constexpr = BLOCKS[3]
    REPORT: tl.constexpr = OPTIONS[0]
    MASKED: tl.constexpr = OPTIONS[1]
    capacity, experts_local = sizes[6], sizes[4]
    layout_ptr = local_ptr + 2 * world_size * experts_local  # recv_offsets, recv_counts, then the map
    recv = (recv_x_ptr, recv_scales_ptr, recv_src_ptr, recv_j_ptr, layout_ptr + 2 * experts_local)
    team = Team(rank, world_size, heap_bases)
    # A program's first routing ids are local inputs: their load goes out before the handshake. Sending
    # waits on no other program of the launch, so the steps follow the program id, not the arrival.
    ids = _step_ids(topk_ptr, tl.program_id(0) * BLOCKS[1], sizes, BLOCKS)
    call, me = enter_call(sync_ptr, recv_x_ptr, team, WORLD_BLOCK)
    if MASKED:
        # No planner, no count exchange: a sender claims its slots at the owner's cursors, which the
        # owner reset at the end of its last call, before its READY of this one.
        team = wait_peers_ready(call, team)
        _send_rows(x_ptr, scales_ptr, topk_ptr, ids, recv, counts_ptr, sizes, team, BLOCKS, OPTIONS)
        if finish_call(call, team):  # every sender's claims and rows into this rank have landed
            _close_masked(counts_ptr, layout_ptr, status_ptr, sizes, rank, heap_bases, E_BLOCK, REPORT)
    else:
        flags = flag_words(call, team)  # [0, W): the count rows' flags; W: the layout (local)
        # The count exchange needs no handshake of its own: only planners touch the count matrix, and
        # every peer's planner has done reading it when its last call ended (finish_call). So the
        # planner starts at once, and by the time the layout is out the peers' READY has usually come.
        plans, hist = _count_routing(topk_ptr, counts_ptr, sizes, call, team, E_BLOCK, CHUNK)
        if plans:
            _plan(hist, counts_ptr + _TALLY, local_ptr, status_ptr, sizes, call, team, E_BLOCK, REPORT)
            signal(flags + world_size, call.epoch, rank, rank, heap_bases, scope="gpu")
        else:
            wait(flags + world_size, call.epoch, rank, rank, heap_bases, cmp="ge", scope="gpu")
        team = wait_peers_ready(call, team)  # and the receive buffers lie where this rank's do (symmetry check)
        # Rows no peer fills this call say so: recv_src = -1.
        unused = tl.minimum(tl.load(status_ptr + _RECEIVED), capacity)
        for start in range(unused + me * _FILL, capacity, tl.num_programs(0) * _FILL):
            offs = start + tl.arange(0, _FILL)
            tl.store(recv_src_ptr + offs, tl.full([_FILL], -1, tl.int64), mask=offs < capacity)
        _send_rows(x_ptr, scales_ptr, topk_ptr, ids, recv, local_ptr, sizes, team, BLOCKS, OPTIONS)
        finish_call(call, team)


__all__ = ["moe_dispatch_kernel", "MAX_EXPERTS", "STATUS_RECEIVED", "STATUS_NEEDED", "STATUS_WORST", "STATUS_WORDS"]
