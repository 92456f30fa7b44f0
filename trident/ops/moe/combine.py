"""MoE combine: every expert output row back to its token's rank, weighted and summed there.

Two steps (:mod:`trident.ops.moe.combine_kernels`; docs/moe.md, "The combine kernels"): rows of other ranks'
tokens are pushed home, then each rank sums its tokens' k rows locally, reading a row of its own
experts where the expert wrote it. When ``expert_out`` is on the heap (``ctx.heap_allocations()``,
``ctx.empty``: the same offset on every rank), one step instead: each rank reads its tokens' rows
at their owners and sums them, with no staging. The result of
:func:`~trident.ops.moe.dispatch.moe_dispatch` says where every row is.

Example::

    d = trident.ops.moe_dispatch(ctx, x, topk_idx, num_experts=64, max_tokens_per_rank=128)
    out = trident.ops.moe_combine(ctx, my_experts(d.recv_x), topk_weights, d)   # [T, H]
"""

from __future__ import annotations

import torch
import triton

from ...calls import Op, run_call
from ...ccl.workspace import workspace
from ...errors import TridentError
from ...runtime.groups import team
from ..fused import multinode
from ..fused.call import check_tensor
from ..fused.sync import sync_block
from .combine_kernels import moe_pull_kernel, moe_push_kernel, moe_reduce_kernel
from .dispatch import TILE_WORDS, fail
from .result import DispatchCount, MoEDispatch, buffer_names

#: Expert output dtypes ``moe_combine`` sums (in fp32) and returns.
OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
#: Most columns a combine step reads of each row at once.
MAX_BLOCK_H = 2048
#: Programs the local sum launches per SM (a program sums its tokens one after another). 8 programs of
#: 8 warps over 2048 columns: 1.07x the memory floor at DeepSeek-V3's 4096 tokens on an H100, against
#: 2.29x with 4 programs over 1024 columns (the sweep of 2026-12-06, docs/moe.md).
REDUCE_PROGRAMS_PER_SM = 8
#: Warps of a combine program (0: 4 for blocks of up to 512 columns, else 8).
WARPS = 0


def moe_combine(ctx, expert_out: torch.Tensor, topk_weights: torch.Tensor, d: MoEDispatch,
                group=None) -> torch.Tensor:
    """Send every expert output row back to its token's rank and sum it there, weighted (collective).

    Args:
        expert_out: ``[capacity, H]`` (bf16, fp16 or fp32): row i is the expert's output for received
            row i of ``d`` (unused rows are ignored). On the heap on every rank (then read in place by
            its tokens' ranks: one kernel, no staging) or on none (pushed home, then summed); a heap
            ``expert_out`` on some ranks only fails the call (DivergenceError at the next check).
        topk_weights: ``[T, k]`` (fp32, bf16 or fp16), this rank's routing weights.
        d: this rank's result of the latest :func:`moe_dispatch` on this context (or group).
        group: the group ``d`` was made in, or None for the whole world.

    Returns:
        ``[T, H]`` in ``expert_out``'s dtype: ``out[t] = sum over j with topk_idx[t, j] >= 0 of
        topk_weights[t, j] * expert_out[row of (t, j)]``, accumulated in fp32.

    Example::

        out = trident.ops.moe_combine(ctx, expert_out, topk_weights, d)
    """
    ctx = team(ctx, group)
    if ctx.spans_nodes:  # several nodes: see trident.ops.fused.multinode
        raise multinode.refuse(ctx, "moe_combine")
    where = f"{ctx.who()}: moe_combine"
    if not isinstance(d, MoEDispatch):
        fail(where, f"d must be the MoEDispatch of trident.ops.moe_dispatch, got {type(d).__name__}", TypeError)
    if d.handle.team is not ctx:
        fail(where, "d was made by moe_dispatch on another context or group: pass the same ctx and group")
    if d.handle.call != ctx.resource(buffer_names(d.buffer_set)[1], DispatchCount).calls:
        fail(where, f"d is not the latest moe_dispatch of buffer_set={d.buffer_set} on this context: a later "
                     "dispatch has reused its receive buffers. Combine each dispatch before the next one of its "
                     "set, or give micro-batches in flight a buffer_set each", TridentError)
    h = d.handle
    return combine_rows(ctx, expert_out, topk_weights, d.topk_idx, d.recv_src, h.recv_j, h.layout, h.sent,
                        d.num_experts, d.max_tokens_per_rank, d.capacity)


def combine_rows(team, expert_out, topk_weights, topk_idx, recv_src, recv_j, layout, sent, num_experts: int,
                 max_tokens: int, capacity: int) -> torch.Tensor:
    """The combine of a dispatch given by its routing tensors (``recv_src``, ``recv_j``: which
    token and which of its k choices each received row is; ``layout``: this rank's ``recv_offsets``
    then ``recv_counts``, int32; ``sent``: where each of this rank's choices went), which may be
    copies: nothing here reads the dispatch's receive buffers. Returns a new ``[T, H]``."""
    hidden = expert_out.shape[1] if isinstance(expert_out, torch.Tensor) and expert_out.dim() == 2 else 0
    tokens = topk_idx.shape[0]
    dtype = expert_out.dtype if isinstance(expert_out, torch.Tensor) else None
    out = torch.empty(tokens, hidden, dtype=dtype, device=team.device)
    run_call(team, MOE_COMBINE, (expert_out, topk_weights, topk_idx, recv_src, recv_j, layout, sent, out),
             (num_experts, max_tokens, capacity))
    return out


def _check_combine(team, tensors, options) -> None:
    expert_out, topk_weights, topk_idx = tensors[:3]
    where, capacity = f"{team.who()}: moe_combine", options[2]
    check_tensor(where, "expert_out", expert_out, team.device, OUT_DTYPES, dims=2)
    check_tensor(where, "topk_weights", topk_weights, team.device, (torch.float32, torch.bfloat16, torch.float16),
                 dims=2)
    if expert_out.shape[0] != capacity:
        fail(where, f"expert_out {tuple(expert_out.shape)} must have d.capacity={capacity} rows "
                     f"(one per row of d.recv_x)")
    if topk_weights.shape != topk_idx.shape:
        fail(where, f"topk_weights {tuple(topk_weights.shape)} must match topk_idx {tuple(topk_idx.shape)}")


def _run_combine(team, rec, tensors, options) -> None:
    expert_out, topk_weights, topk_idx, recv_src, recv_j, layout, sent, out = tensors
    num_experts, max_tokens, capacity = options
    (tokens, k), hidden = topk_idx.shape, expert_out.shape[1]
    # The staging rows of the push path; taken on every rank of a team of several (used or not: a rank
    # that pulls takes it too, so allocations stay in step), never alone (nothing is pushed).
    if team.world_size > 1:
        staging = workspace(team).buffer("moe.combine", max_tokens * k * hidden, expert_out.dtype)
    sync = sync_block(team, team.world_size + 1)  # the dispatch's: the combine raises no flags
    if max_tokens == 0 or hidden == 0:
        rec.discard()
        return
    block_h = min(triton.next_power_of_2(hidden), MAX_BLOCK_H)
    warps = WARPS or (4 if block_h <= 512 else 8)
    world_block = triton.next_power_of_2(team.world_size)
    if team.world_size > 1 and team.is_symmetric(expert_out):  # every row read where its expert wrote it
        rec.launch(moe_pull_kernel, (max(1, min(tokens, team.platform.program_limit)),), (
            expert_out, out, topk_weights, sent,
            (tokens, hidden, k, capacity),
            sync, team.rank, team.world_size, team.heap_bases),
            dict(K_BLOCK=triton.next_power_of_2(k), BLOCK_H=block_h, WORLD_BLOCK=world_block), num_warps=warps)
        return
    if team.world_size > 1:  # rows of other ranks' tokens go home first; at one rank every row is local
        rows = max(1, TILE_WORDS // block_h)
        rec.launch(moe_push_kernel, (max(1, team.platform.program_limit),), (
            expert_out, staging, recv_src, recv_j, layout,
            (hidden, k, max_tokens, num_experts // team.world_size),
            sync, team.rank, team.world_size, team.heap_bases),
            dict(ROWS=rows, BLOCK_H=block_h, WORLD_BLOCK=world_block), num_warps=warps)
    if tokens:
        programs = max(1, min(tokens, REDUCE_PROGRAMS_PER_SM * team.platform.program_limit))
        rec.launch(moe_reduce_kernel, (programs,), (
            expert_out, staging if team.world_size > 1 else expert_out, out, topk_weights, sent,  # (none staged alone)
            (tokens, hidden, k, capacity),
            team.rank),
            dict(K_BLOCK=triton.next_power_of_2(k), BLOCK_H=block_h), num_warps=warps)


#: The combine as the call pipeline runs it (operands: expert_out, topk_weights, topk_idx, recv_src,
#: recv_j, layout, sent, and the new output).
MOE_COMBINE = Op("moe_combine", _check_combine, _run_combine,
                 refusal=lambda team: multinode.refuse(team, "moe_combine"),
                 facts=lambda tensors, options: (tensors[0].shape[1], tensors[2].shape[1], str(tensors[0].dtype),
                                                 options[2]))


__all__ = ["moe_combine", "combine_rows", "MOE_COMBINE", "OUT_DTYPES"]
