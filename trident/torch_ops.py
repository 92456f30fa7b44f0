"""trident's collectives and fused ops as ``torch.library`` custom ops: ``torch.ops.trident.*``.

Each op is functional (it returns a new tensor and changes none of its inputs), names its group
by a string (``ctx.group_name``, the same on every rank) and has a fake implementation, so
``torch.compile(fullgraph=True)`` traces through it without a graph break, as through
``torch.distributed._functional_collectives``. Every rank must call the same ops in the same
order, as with any collective. Results are plain torch tensors (never heap memory, which only
``ctx.free`` returns); inputs may be plain or on the heap.

Example::

    import trident.torch_ops  # registers torch.ops.trident.*

    def mlp(x, w_up_shard, w_down_shard, group: str):
        h = torch.nn.functional.silu(x @ w_up_shard)
        return torch.ops.trident.all_reduce(h @ w_down_shard, "sum", group)

    y = torch.compile(mlp, fullgraph=True)(x, w_up, w_down, ctx.group_name)

The ops (every ``group`` is a group name):

* ``all_reduce(t, op, group)``, ``all_gather(t, group)`` (dim 0), ``reduce_scatter(t, op, group)``
  (dim 0), ``all_to_all(t, group)`` (equal chunks of dim 0), ``all_to_all_v(t, out_splits,
  in_splits, group)`` (row counts per rank), ``broadcast(t, src, group)``;
* ``gemm_all_reduce(A, B, group)``, ``gemm_reduce_scatter(A, B, group)``,
  ``all_gather_gemm(A_local, B, group)``, ``gemm_all_scatter(A, B_local, group)`` (``pattern="auto"``);
* ``all_reduce_rmsnorm(x, weight, eps, residual, group)`` returns ``(out, h)``;
* ``moe_dispatch(x, topk_idx, num_experts, max_tokens_per_rank, x_scales, group)`` returns
  ``(recv_x, recv_offsets, recv_counts, recv_src, recv_scales, handle)``, and
  ``moe_combine(expert_out, topk_weights, topk_idx, recv_src, handle, num_experts,
  max_tokens_per_rank, group)`` the ``[T, H]`` combined rows.
"""

from __future__ import annotations

import torch

from .runtime.groups import resolve, team


def _plain_copy(t: torch.Tensor) -> torch.Tensor:
    """A new contiguous plain tensor with ``t``'s data (the op's result starts from it)."""
    return torch.empty_like(t, memory_format=torch.contiguous_format).copy_(t)


def _world(group: str) -> int:
    ctx, g = resolve(group)
    return (g or ctx).world_size


# -- collectives ------------------------------------------------------------------------------------

@torch.library.custom_op("trident::all_reduce", mutates_args=())
def all_reduce(t: torch.Tensor, op: str, group: str) -> torch.Tensor:
    """``t`` reduced over the group's ranks with ``op`` ("sum", "max", "min"), as a new tensor."""
    from . import ccl

    out = _plain_copy(t)
    ctx, g = resolve(group)
    return ccl.all_reduce(ctx, out, op=op, group=g)


@all_reduce.register_fake
def _(t, op, group):
    return torch.empty_like(t, memory_format=torch.contiguous_format)


@torch.library.custom_op("trident::all_gather", mutates_args=())
def all_gather(t: torch.Tensor, group: str) -> torch.Tensor:
    """Every rank's ``t`` stacked along dim 0, in rank order."""
    from . import ccl

    ctx, g = resolve(group)
    out = t.new_empty(((g or ctx).world_size * t.shape[0], *t.shape[1:]))
    return ccl.all_gather(ctx, out, t.contiguous(), group=g)


@all_gather.register_fake
def _(t, group):
    return t.new_empty((_world(group) * t.shape[0], *t.shape[1:]))


@torch.library.custom_op("trident::reduce_scatter", mutates_args=())
def reduce_scatter(t: torch.Tensor, op: str, group: str) -> torch.Tensor:
    """Chunk ``rank`` (dim 0) of ``t`` reduced over the ranks with ``op``."""
    from . import ccl

    ctx, g = resolve(group)
    out = t.new_empty((t.shape[0] // (g or ctx).world_size, *t.shape[1:]))
    return ccl.reduce_scatter(ctx, out, t.contiguous(), op=op, group=g)


@reduce_scatter.register_fake
def _(t, op, group):
    return t.new_empty((t.shape[0] // _world(group), *t.shape[1:]))


@torch.library.custom_op("trident::all_to_all", mutates_args=())
def all_to_all(t: torch.Tensor, group: str) -> torch.Tensor:
    """Chunk p (dim 0) of ``t`` to rank p; chunk p of the result from rank p."""
    from . import ccl

    out = torch.empty_like(t, memory_format=torch.contiguous_format)
    ctx, g = resolve(group)
    return ccl.all_to_all(ctx, out, t.contiguous(), group=g)


@all_to_all.register_fake
def _(t, group):
    return torch.empty_like(t, memory_format=torch.contiguous_format)


@torch.library.custom_op("trident::broadcast", mutates_args=())
def broadcast(t: torch.Tensor, src: int, group: str) -> torch.Tensor:
    """Rank ``src``'s ``t`` on every rank."""
    from . import ccl

    ctx, g = resolve(group)
    return ccl.broadcast(ctx, _plain_copy(t), src, group=g)


@broadcast.register_fake
def _(t, src, group):
    return torch.empty_like(t, memory_format=torch.contiguous_format)


@torch.library.custom_op("trident::all_to_all_v", mutates_args=())
def all_to_all_v(t: torch.Tensor, out_splits: list[int], in_splits: list[int], group: str) -> torch.Tensor:
    """Rows (dim 0) of ``t`` to every rank, ``in_splits[p]`` of them to rank ``p``; the result holds
    ``out_splits[p]`` rows from each rank ``p``, in rank order (``all_to_all_single`` with split sizes).

    A ``t`` on the heap is read in place. A plain one is staged on the heap first, after the ranks
    exchanged their row counts (a small all_gather and one host read: the stage must be the same
    size everywhere), so pass a heap tensor where that sync matters (a CUDA graph).
    """
    from . import ccl
    from .ccl.api import input_stage
    from .runtime.groups import team

    ctx, g = resolve(group)
    me = team(ctx, g)
    src = t.contiguous()
    if not me.is_symmetric(src):
        rows = torch.full((1,), src.shape[0], dtype=torch.int64, device=src.device)
        every = torch.empty(me.world_size, dtype=torch.int64, device=src.device)
        most = int(ccl.all_gather(ctx, every, rows, group=g).max())
        per_row = src[0].numel() if src.dim() > 1 else 1
        stage = input_stage(me, most * per_row, src.dtype)
        src = stage[:src.numel()].view(src.shape).copy_(src)
    out = torch.empty((sum(out_splits), *t.shape[1:]), dtype=t.dtype, device=t.device)
    return ccl.all_to_all_v(ctx, out, src, out_splits, in_splits, group=g)


@all_to_all_v.register_fake
def _(t, out_splits, in_splits, group):
    return t.new_empty((sum(out_splits), *t.shape[1:]))


# -- fused ops --------------------------------------------------------------------------------------

@torch.library.custom_op("trident::gemm_all_reduce", mutates_args=())
def gemm_all_reduce(A: torch.Tensor, B: torch.Tensor, group: str) -> torch.Tensor:
    """The sum over ranks of ``A_r @ B_r`` (row-parallel linear layer), on every rank."""
    from . import ops

    C = A.new_empty((A.shape[0], B.shape[1]))
    ctx, g = resolve(group)
    return ops.gemm_all_reduce(ctx, A.contiguous(), B.contiguous(), C, group=g)


@gemm_all_reduce.register_fake
def _(A, B, group):
    return A.new_empty((A.shape[0], B.shape[1]))


@torch.library.custom_op("trident::gemm_reduce_scatter", mutates_args=())
def gemm_reduce_scatter(A: torch.Tensor, B: torch.Tensor, group: str) -> torch.Tensor:
    """Rows ``rank * M/W ...`` of the sum over ranks of ``A_r @ B_r``."""
    from . import ops

    ctx, g = resolve(group)
    C = A.new_empty((A.shape[0] // (g or ctx).world_size, B.shape[1]))
    return ops.gemm_reduce_scatter(ctx, A.contiguous(), B.contiguous(), C, group=g)


@gemm_reduce_scatter.register_fake
def _(A, B, group):
    return A.new_empty((A.shape[0] // _world(group), B.shape[1]))


@torch.library.custom_op("trident::all_gather_gemm", mutates_args=())
def all_gather_gemm(A_local: torch.Tensor, B: torch.Tensor, group: str) -> torch.Tensor:
    """Every rank's rows of A (stacked in rank order) times ``B``."""
    from . import ops

    ctx, g = resolve(group)
    C = A_local.new_empty(((g or ctx).world_size * A_local.shape[0], B.shape[1]))
    return ops.all_gather_gemm(ctx, A_local.contiguous(), B.contiguous(), C, group=g)  # a plain A_local is staged


@all_gather_gemm.register_fake
def _(A_local, B, group):
    return A_local.new_empty((_world(group) * A_local.shape[0], B.shape[1]))


@torch.library.custom_op("trident::gemm_all_scatter", mutates_args=())
def gemm_all_scatter(A: torch.Tensor, B_local: torch.Tensor, group: str) -> torch.Tensor:
    """``A @ B`` on every rank, where rank r holds B's column block r."""
    from . import ops

    ctx, g = resolve(group)
    owner = g or ctx  # peers store into C: symmetric memory of the group (its region) or of the world
    M, N = A.shape[0], owner.world_size * B_local.shape[1]
    C = owner.empty(M * N, dtype=A.dtype).view(M, N)
    try:
        ops.gemm_all_scatter(ctx, A.contiguous(), B_local.contiguous(), C, group=g)
        return _plain_copy(C)
    finally:
        owner.free(C)


@gemm_all_scatter.register_fake
def _(A, B_local, group):
    return A.new_empty((A.shape[0], _world(group) * B_local.shape[1]))


@torch.library.custom_op("trident::all_reduce_rmsnorm", mutates_args=())
def all_reduce_rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None,
                       group: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``h = all_reduce(x) (+ residual)``, ``out = rmsnorm(h) * weight``: returns ``(out, h)``."""
    from . import ops

    ctx, g = resolve(group)
    return ops.all_reduce_rmsnorm(ctx, x.contiguous(), weight.contiguous(), eps=eps, group=g,
                                  residual=None if residual is None else residual.contiguous())


@all_reduce_rmsnorm.register_fake
def _(x, weight, eps, residual, group):
    return torch.empty_like(x), torch.empty_like(x)


# -- expert parallelism -----------------------------------------------------------------------------

@torch.library.custom_op("trident::moe_dispatch", mutates_args=())
def moe_dispatch(x: torch.Tensor, topk_idx: torch.Tensor, num_experts: int, max_tokens_per_rank: int,
                 x_scales: torch.Tensor | None, group: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                                    torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every token to the ranks of its top-k experts (``trident.ops.moe_dispatch`` with the default
    capacity). Returns ``(recv_x, recv_offsets, recv_counts, recv_src, recv_scales, handle)``, copies
    of the dispatch's buffers; ``recv_scales`` is ``[capacity, 0]`` without ``x_scales``; ``handle``
    is the routing ``moe_combine`` needs (int64), to pass on unchanged."""
    from .ops import moe

    ctx, g = resolve(group)
    d = moe.moe_dispatch(ctx, x.contiguous(), topk_idx.contiguous(), num_experts, max_tokens_per_rank,
                         x_scales=x_scales, group=g)
    scales = d.recv_scales if d.recv_scales is not None else d.recv_x.new_empty((d.capacity, 0), dtype=torch.float32)
    handle = torch.cat([d._recv_j.to(torch.int64), d._status])
    return (_plain_copy(d.recv_x), d.recv_offsets.clone(), d.recv_counts.clone(), d.recv_src.clone(),
            _plain_copy(scales), handle)


@moe_dispatch.register_fake
def _(x, topk_idx, num_experts, max_tokens_per_rank, x_scales, group):
    from .ops.moe import SCALE_BLOCK
    from .ops.moe_kernels import STATUS_WORDS
    from .ops.moe_sizing import default_capacity

    world = _world(group)
    experts_local = num_experts // world
    rows = default_capacity(world, max_tokens_per_rank, topk_idx.shape[1])
    scale_cols = x.shape[1] // SCALE_BLOCK if x_scales is not None else 0
    return (x.new_empty((rows, x.shape[1])), topk_idx.new_empty(experts_local, dtype=torch.int32),
            topk_idx.new_empty(experts_local, dtype=torch.int32), topk_idx.new_empty(rows),
            x.new_empty((rows, scale_cols), dtype=torch.float32), topk_idx.new_empty(rows + STATUS_WORDS))


@torch.library.custom_op("trident::moe_combine", mutates_args=())
def moe_combine(expert_out: torch.Tensor, topk_weights: torch.Tensor, topk_idx: torch.Tensor,
                recv_src: torch.Tensor, handle: torch.Tensor, num_experts: int, max_tokens_per_rank: int,
                group: str) -> torch.Tensor:
    """The expert outputs back to their tokens' ranks, weighted and summed (``trident.ops.moe_combine``):
    ``[T, H]``. ``topk_idx``, ``recv_src`` and ``handle`` are the dispatch's (any later dispatch may
    have run in between: nothing here reads its receive buffers)."""
    from .ops import moe

    ctx, g = resolve(group)
    me = team(ctx, g)
    capacity = recv_src.shape[0]
    if handle.shape != (capacity + moe.STATUS_WORDS,) or handle.dtype != torch.int64:
        raise ValueError(f"rank {me.rank}: moe_combine: handle must be the int64 [{capacity} + "
                         f"{moe.STATUS_WORDS}] tensor torch.ops.trident.moe_dispatch returned with recv_src, "
                         f"got {handle.dtype} {tuple(handle.shape)}")
    recv_j, status = handle[:capacity].to(torch.int32), handle[capacity:].contiguous()
    return moe.combine_rows(me, f"rank {me.rank}: moe_combine", expert_out.contiguous(), topk_weights.contiguous(),
                            topk_idx.contiguous(), recv_src.contiguous(), recv_j, status, num_experts,
                            max_tokens_per_rank, capacity)


@moe_combine.register_fake
def _(expert_out, topk_weights, topk_idx, recv_src, handle, num_experts, max_tokens_per_rank, group):
    return expert_out.new_empty((topk_idx.shape[0], expert_out.shape[1]))
