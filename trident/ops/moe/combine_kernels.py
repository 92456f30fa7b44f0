"""The kernels of ``trident.ops.moe_combine`` (docs/moe.md, "The combine kernels"); the dispatch's are in
:mod:`.kernels`.

No flag per row: with the expert rows on the heap, one step (``moe_pull_kernel``: each token's rows
read at their owners and summed); otherwise two (one at one rank):

* ``moe_push_kernel`` (between ranks): every received row whose token lives on another rank is
  stored, ``ROWS`` rows at a time, into row ``t * k + j`` of that rank's staging ``[M * k, H]``; the
  call's exit handshake (``finish_call``) makes every peer's rows land before the kernel ends.
* ``moe_reduce_kernel`` (local): each token sums its k rows, weighted, in fp32, reading a row of a
  local expert where the expert wrote it (the dispatch recorded its slot) and any other in the
  staging: one pass over the rows. At one rank nothing is pushed and only this kernel runs.

Both kernels' programs wait only at the call's entry and exit, on the peers' programs, so the
launch finishes however few of its programs are resident (docs/reliability.md, forward progress).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ...device import load, store
from ...device.bundles import Team
from ..fused.sync import enter_call, finish_call, wait_peers_ready


@triton.jit
def moe_push_kernel(
    expert_ptr, staging_ptr, recv_src_ptr, recv_j_ptr, layout_ptr,  # my expert rows; every home's staging
    sizes,                                                          # (hidden, k, max_tokens, experts_local)
    sync_ptr,
    rank, world_size, heap_bases,
    ROWS: tl.constexpr, BLOCK_H: tl.constexpr, WORLD_BLOCK: tl.constexpr,
):
    """The combine's first step, between ranks: every received row whose token lives on another rank
    goes into row ``t * k + j`` of that rank's staging (``[M * k, H]``), ``ROWS`` rows a step. The
    rows are local expert ``e``'s ``recv_offsets[e] ..`` ``+ recv_counts[e]`` (``layout_ptr``: the
    offsets, then the counts), in either layout; block ``b`` of expert ``e`` is program ``(e + b) %
    programs``'s, so that small experts spread over the programs. No flag per row: when this kernel
    ends on a rank, every peer's rows into it have landed (``finish_call``)."""
    hidden, k, max_tokens, experts_local = sizes
    team = Team(rank, world_size, heap_bases)
    call, me = enter_call(sync_ptr, staging_ptr, team, WORLD_BLOCK)
    team = wait_peers_ready(call, team)  # every home has finished reading its staging of the last call
    lanes, cols = tl.arange(0, ROWS), tl.arange(0, BLOCK_H)
    programs = tl.num_programs(0)
    for e in range(experts_local):
        first = tl.load(layout_ptr + e)
        count = tl.load(layout_ptr + experts_local + e)
        for b in range((me + programs - e % programs) % programs, tl.cdiv(count, ROWS), programs):
            in_expert = b * ROWS + lanes
            slot = first + in_expert
            src = tl.load(recv_src_ptr + slot, mask=in_expert < count, other=-1)
            home = (src // max_tokens).to(tl.int32)
            remote = (src >= 0) & (home != rank)  # a row of my own tokens stays where its expert wrote it
            home = tl.where(remote, home, rank)
            row = tl.where(remote, (src % max_tokens) * k + tl.load(recv_j_ptr + slot, mask=remote, other=0), 0)
            for c in range(0, hidden, BLOCK_H):
                offs = c + cols
                mask = remote[:, None] & (offs < hidden)[None, :]
                values = tl.load(expert_ptr + tl.cast(slot, tl.int64)[:, None] * hidden + offs[None, :], mask=mask)
                store(staging_ptr + row[:, None] * hidden + offs[None, :], values, rank, home[:, None],
                      team.heap_bases, mask=mask)
    finish_call(call, team)


@triton.jit
def moe_pull_kernel(
    expert_ptr, out_ptr, weights_ptr, sent_ptr,   # every rank's expert rows (symmetric), out [T, H], where
    sizes,                                        # (tokens, hidden, k, capacity)
    sync_ptr,
    rank, world_size, heap_bases,
    K_BLOCK: tl.constexpr, BLOCK_H: tl.constexpr, WORLD_BLOCK: tl.constexpr,
):
    """The combine in one step when the expert rows are on the heap (the same offset on every rank):
    each token's k rows are read where their experts wrote them, at their owners (``sent`` says
    which owner and slot), and summed, weighted, in fp32. No staging, no second kernel. The entry
    handshake makes every owner's rows written before they are read; the exit one keeps an owner
    from reusing them before every home has read its rows."""
    tokens, hidden, k, capacity = sizes
    team = Team(rank, world_size, heap_bases)
    call, me = enter_call(sync_ptr, expert_ptr, team, WORLD_BLOCK)
    team = wait_peers_ready(call, team)  # every owner's expert rows are written (and lie where mine do)
    jj, cols = tl.arange(0, K_BLOCK), tl.arange(0, BLOCK_H)
    for t in range(me, tokens, tl.num_programs(0)):
        choice = tl.cast(t, tl.int64) * k + jj
        sent = tl.load(sent_ptr + choice, mask=jj < k, other=-1)
        valid = sent >= 0  # a choice past the dispatch's capacity was not delivered (and was reported)
        owner = tl.where(valid, sent // capacity, rank).to(tl.int32)
        slot = tl.cast(tl.where(valid, sent % capacity, 0), tl.int64)
        weight = tl.load(weights_ptr + choice, mask=valid, other=0.0).to(tl.float32)
        for c in range(0, hidden, BLOCK_H):
            offs = c + cols
            mask = valid[:, None] & (offs < hidden)[None, :]
            rows = load(expert_ptr + slot[:, None] * hidden + offs[None, :], team.rank, owner[:, None],
                        team.heap_bases, mask=mask, other=0.0).to(tl.float32)
            total = tl.sum(rows * weight[:, None], axis=0)
            tl.store(out_ptr + tl.cast(t, tl.int64) * hidden + offs, total.to(out_ptr.dtype.element_ty),
                     mask=offs < hidden)
    finish_call(call, team)


@triton.jit
def moe_reduce_kernel(
    expert_ptr, staging_ptr, out_ptr, weights_ptr, sent_ptr,  # my expert rows, my staging, out [T, H], where
    sizes,                                                    # (tokens, hidden, k, capacity)
    rank,
    K_BLOCK: tl.constexpr, BLOCK_H: tl.constexpr,
):
    """The combine's second step, local: ``out[t] = sum over valid j of weights[t, j] * row (t, j)``, in
    fp32, reading each row where it is: in my expert rows when its expert is mine (``sent`` says which
    slot), else in my staging, where the push step put it. One pass over the rows, none over a copy."""
    tokens, hidden, k, capacity = sizes
    jj, cols = tl.arange(0, K_BLOCK), tl.arange(0, BLOCK_H)
    for t in range(tl.program_id(0), tokens, tl.num_programs(0)):
        choice = tl.cast(t, tl.int64) * k + jj
        sent = tl.load(sent_ptr + choice, mask=jj < k, other=-1)
        valid = sent >= 0  # a choice past the dispatch's capacity was not delivered (and was reported)
        local = valid & (sent // capacity == rank)
        staged = valid & (sent // capacity != rank)
        slot = tl.cast(tl.where(local, sent % capacity, 0), tl.int64)
        weight = tl.load(weights_ptr + choice, mask=valid, other=0.0).to(tl.float32)
        for c in range(0, hidden, BLOCK_H):
            offs = c + cols
            in_row = (offs < hidden)[None, :]
            mine = tl.load(expert_ptr + slot[:, None] * hidden + offs[None, :], mask=local[:, None] & in_row,
                           other=0.0).to(tl.float32)
            pushed = tl.load(staging_ptr + choice[:, None] * hidden + offs[None, :], mask=staged[:, None] & in_row,
                             other=0.0).to(tl.float32)
            total = tl.sum((mine + pushed) * weight[:, None], axis=0)
            tl.store(out_ptr + tl.cast(t, tl.int64) * hidden + offs, total.to(out_ptr.dtype.element_ty),
                     mask=offs < hidden)


__all__ = ["moe_push_kernel", "moe_pull_kernel", "moe_reduce_kernel"]
