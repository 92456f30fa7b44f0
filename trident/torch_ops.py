"""trident's collectives and fused ops as ``torch.library`` custom ops: ``torch.ops.trident.*``.

Each op is functional (it returns a new tensor and changes none of its inputs; ``all_reduce_`` and
``broadcast_`` are the in-place variants torch's functional collectives also have, for a tensor
already on the heap, which they use with no copy), names its group
by a string (``ctx.group_name``, the same on every rank) and has a fake implementation, so
``torch.compile(fullgraph=True)`` traces through it without a graph break, as through
``torch.distributed._functional_collectives``. Every rank must call the same ops in the same
order, as with any collective. Results are plain torch tensors (never heap memory, which only
``ctx.free`` returns); inputs may be plain or on the heap.

Example::

    ctx = trident.init()      # registers torch.ops.trident.* (or trident.torch_ops.register())

    def mlp(x, w_up_shard, w_down_shard, group: str):
        h = torch.nn.functional.silu(x @ w_up_shard)
        return torch.ops.trident.all_reduce(h @ w_down_shard, "sum", group)

    y = torch.compile(mlp, fullgraph=True)(x, w_up, w_down, ctx.group_name)

The ops (every ``group`` is a group name):

* ``all_reduce(t, op, group)`` (the reduced copy, no staging copy of t), ``all_reduce_(t, op, group)``
  (in place: returns nothing, t holds the sum), ``all_gather(t, group)`` (dim 0), ``reduce_scatter(t, op, group)``
  (dim 0), ``all_to_all(t, group)`` (equal chunks of dim 0), ``all_to_all_v(t, out_splits,
  in_splits, group)`` (row counts per rank), ``broadcast(t, src, group)``, ``broadcast_(t, src, group)``
  (in place);
* ``gemm_all_reduce(A, B, group)``, ``gemm_reduce_scatter(A, B, group)``,
  ``all_gather_gemm(A_local, B, group)``, ``gemm_all_scatter(A, B_local, group)`` (``pattern="auto"``);
* ``all_reduce_rmsnorm(x, weight, eps, residual, group)`` returns ``(out, h)``;
* ``moe_dispatch(x, topk_idx, num_experts, max_tokens_per_rank, x_scales, group, quantize=None)`` returns
  ``(recv_x, recv_offsets, recv_counts, recv_src, recv_scales, handle)``, and
  ``moe_combine(expert_out, topk_weights, topk_idx, recv_src, handle, num_experts,
  max_tokens_per_rank, group)`` the ``[T, H]`` combined rows.

The ops are registered with ``torch.library.Library`` for the CPU and CUDA dispatch keys (a
call costs a few microseconds of dispatch, against about ten through ``torch.library.custom_op``),
by :func:`register`, which ``trident.init`` calls: importing trident registers nothing with torch.
"""

from __future__ import annotations

import math

import torch

from . import ccl
from .runtime.groups import named_team

#: Every op's schema (torch's operator language), in the order they are registered.
SCHEMAS = {
    "all_reduce": 'all_reduce(Tensor t, str op, str group, str algorithm="auto") -> Tensor',
    "all_reduce_": 'all_reduce_(Tensor(a!) t, str op, str group, str algorithm="auto") -> ()',
    "all_gather": "all_gather(Tensor t, str group) -> Tensor",
    "reduce_scatter": "reduce_scatter(Tensor t, str op, str group) -> Tensor",
    "all_to_all": "all_to_all(Tensor t, str group) -> Tensor",
    "broadcast": "broadcast(Tensor t, int src, str group) -> Tensor",
    "broadcast_": "broadcast_(Tensor(a!) t, int src, str group) -> ()",
    "all_to_all_v": "all_to_all_v(Tensor t, int[] out_splits, int[] in_splits, str group) -> Tensor",
    "gemm_all_reduce": "gemm_all_reduce(Tensor A, Tensor B, str group) -> Tensor",
    "gemm_reduce_scatter": "gemm_reduce_scatter(Tensor A, Tensor B, str group) -> Tensor",
    "all_gather_gemm": "all_gather_gemm(Tensor A_local, Tensor B, str group) -> Tensor",
    "gemm_all_scatter": "gemm_all_scatter(Tensor A, Tensor B_local, str group) -> Tensor",
    "all_reduce_rmsnorm": "all_reduce_rmsnorm(Tensor x, Tensor weight, float eps, Tensor? residual, str group) "
                          "-> (Tensor, Tensor)",
    "moe_dispatch": "moe_dispatch(Tensor x, Tensor topk_idx, int num_experts, int max_tokens_per_rank, "
                    "Tensor? x_scales, str group, str? quantize=None) "
                    "-> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)",
    "moe_combine": "moe_combine(Tensor expert_out, Tensor topk_weights, Tensor topk_idx, Tensor recv_src, "
                   "Tensor handle, int num_experts, int max_tokens_per_rank, str group) -> Tensor",
}
_FAKES: dict = {}
_LIBRARY: list = []  # the registered torch.library.Library, kept alive (registrations end with it)


def _fake(name: str):
    """Keep ``fn`` as op ``name``'s fake implementation (shapes only, for tracing)."""
    def keep(fn):
        _FAKES[name] = fn
        return fn
    return keep


def register() -> None:
    """Register every op of :data:`SCHEMAS` as ``torch.ops.trident.<name>`` (idempotent; ``trident.init``
    calls it). The implementations serve the CPU (simulator) and CUDA dispatch keys.

    Example::

        trident.torch_ops.register()
        y = torch.ops.trident.all_reduce(x, "sum", ctx.group_name)
    """
    if _LIBRARY:
        return
    library = torch.library.Library("trident", "DEF")
    for name, schema in SCHEMAS.items():
        library.define(schema)
        for key in ("CPU", "CUDA"):
            library.impl(name, globals()[name], key)
        if name in _FAKES:
            torch.library.register_fake(f"trident::{name}", _FAKES[name], lib=library)
    _LIBRARY.append(library)


def _plain_copy(t: torch.Tensor) -> torch.Tensor:
    """A new contiguous plain tensor with ``t``'s data (the op's result starts from it)."""
    return torch.empty_like(t, memory_format=torch.contiguous_format).copy_(t)


def _world(group: str) -> int:
    return named_team(group).world_size


# -- collectives ------------------------------------------------------------------------------------

def all_reduce(t: torch.Tensor, op: str, group: str, algorithm: str = "auto") -> torch.Tensor:
    """``t`` reduced over the group's ranks with ``op`` ("sum", "max", "min"), as a new tensor (the
    kernel reads ``t`` and writes the result: no staging copy); ``algorithm`` is a row of
    ``trident.ccl.ALL_REDUCE_ALGORITHMS`` or "auto"."""
    t = t.contiguous()
    return ccl.all_reduce(named_team(group), t, op=op, algorithm=algorithm, out=torch.empty_like(t))


def all_reduce_(t: torch.Tensor, op: str, group: str, algorithm: str = "auto") -> None:
    """``t`` reduced over the group's ranks in place (``t`` contiguous; on the heap it is not staged)."""
    ccl.all_reduce(named_team(group), t, op=op, algorithm=algorithm)


@_fake("all_reduce_")
def _(t, op, group, algorithm="auto"):
    return None


@_fake("all_reduce")
def _(t, op, group, algorithm="auto"):
    return torch.empty_like(t, memory_format=torch.contiguous_format)


def all_gather(t: torch.Tensor, group: str) -> torch.Tensor:
    """Every rank's ``t`` stacked along dim 0, in rank order."""
    me = named_team(group)
    return ccl.all_gather(me, t.new_empty((me.world_size * t.shape[0], *t.shape[1:])), t.contiguous())


@_fake("all_gather")
def _(t, group):
    return t.new_empty((_world(group) * t.shape[0], *t.shape[1:]))


def reduce_scatter(t: torch.Tensor, op: str, group: str) -> torch.Tensor:
    """Chunk ``rank`` (dim 0) of ``t`` reduced over the ranks with ``op``."""
    me = named_team(group)
    return ccl.reduce_scatter(me, t.new_empty((t.shape[0] // me.world_size, *t.shape[1:])), t.contiguous(), op=op)


@_fake("reduce_scatter")
def _(t, op, group):
    return t.new_empty((t.shape[0] // _world(group), *t.shape[1:]))


def all_to_all(t: torch.Tensor, group: str) -> torch.Tensor:
    """Chunk p (dim 0) of ``t`` to rank p; chunk p of the result from rank p."""
    t = t.contiguous()
    return ccl.all_to_all(named_team(group), torch.empty_like(t), t)


@_fake("all_to_all")
def _(t, group):
    return torch.empty_like(t, memory_format=torch.contiguous_format)


def broadcast(t: torch.Tensor, src: int, group: str) -> torch.Tensor:
    """Rank ``src``'s ``t`` on every rank."""
    t = t.contiguous()
    return ccl.broadcast(named_team(group), t, src, out=torch.empty_like(t))


@_fake("broadcast")
def _(t, src, group):
    return torch.empty_like(t, memory_format=torch.contiguous_format)


def broadcast_(t: torch.Tensor, src: int, group: str) -> None:
    """Rank ``src``'s ``t`` into every rank's ``t``, in place (``t`` contiguous; on the heap it is not staged)."""
    ccl.broadcast(named_team(group), t, src)


@_fake("broadcast_")
def _(t, src, group):
    return None


def all_to_all_v(t: torch.Tensor, out_splits: list[int], in_splits: list[int], group: str) -> torch.Tensor:
    """Rows (dim 0) of ``t`` to every rank, ``in_splits[p]`` of them to rank ``p``; the result holds
    ``out_splits[p]`` rows from each rank ``p``, in rank order (``all_to_all_single`` with split sizes).

    The ranks first exchange their row counts (a small all_gather and one host read, on every rank
    whatever its placement, so that all run the same collectives): a plain ``t`` is staged in a heap
    buffer of the largest count, a ``t`` on the heap is read in place. The host read makes this op
    unfit for CUDA-graph capture: there, call ``trident.ccl.all_to_all_v`` on a heap tensor with
    device split sizes.
    """
    from .ccl.api import input_stage

    me = named_team(group)
    src = t.contiguous()
    # Every rank exchanges its row count, whatever its placement: a plain input is staged in a heap
    # buffer of the largest count (the same size everywhere), and all ranks must run one collective.
    rows = torch.full((1,), src.shape[0], dtype=torch.int64, device=src.device)
    every = torch.empty(me.world_size, dtype=torch.int64, device=src.device)
    most = int(ccl.all_gather(me, every, rows).max())
    per_row = math.prod(src.shape[1:])
    stage = input_stage(me, most * per_row, src.dtype)
    if not me.is_symmetric(src):
        src = stage[:src.numel()].view(src.shape).copy_(src)
    out = torch.empty((sum(out_splits), *t.shape[1:]), dtype=t.dtype, device=t.device)
    return ccl.all_to_all_v(me, out, src, out_splits, in_splits)


@_fake("all_to_all_v")
def _(t, out_splits, in_splits, group):
    return t.new_empty((sum(out_splits), *t.shape[1:]))


# -- fused ops --------------------------------------------------------------------------------------

def gemm_all_reduce(A: torch.Tensor, B: torch.Tensor, group: str) -> torch.Tensor:
    """The sum over ranks of ``A_r @ B_r`` (row-parallel linear layer), on every rank."""
    from . import ops

    C = A.new_empty((A.shape[0], B.shape[1]))
    return ops.gemm_all_reduce(named_team(group), A.contiguous(), B.contiguous(), C)


@_fake("gemm_all_reduce")
def _(A, B, group):
    return A.new_empty((A.shape[0], B.shape[1]))


def gemm_reduce_scatter(A: torch.Tensor, B: torch.Tensor, group: str) -> torch.Tensor:
    """Rows ``rank * M/W ...`` of the sum over ranks of ``A_r @ B_r``."""
    from . import ops

    me = named_team(group)
    C = A.new_empty((A.shape[0] // me.world_size, B.shape[1]))
    return ops.gemm_reduce_scatter(me, A.contiguous(), B.contiguous(), C)


@_fake("gemm_reduce_scatter")
def _(A, B, group):
    return A.new_empty((A.shape[0] // _world(group), B.shape[1]))


def all_gather_gemm(A_local: torch.Tensor, B: torch.Tensor, group: str) -> torch.Tensor:
    """Every rank's rows of A (stacked in rank order) times ``B``."""
    from . import ops

    me = named_team(group)
    C = A_local.new_empty((me.world_size * A_local.shape[0], B.shape[1]))
    return ops.all_gather_gemm(me, A_local.contiguous(), B.contiguous(), C)  # a plain A_local is staged


@_fake("all_gather_gemm")
def _(A_local, B, group):
    return A_local.new_empty((_world(group) * A_local.shape[0], B.shape[1]))


def gemm_all_scatter(A: torch.Tensor, B_local: torch.Tensor, group: str) -> torch.Tensor:
    """``A @ B`` on every rank, where rank r holds B's column block r."""
    from . import ops

    owner = named_team(group)  # peers store into C: symmetric memory of the group (its region) or of the world
    M, N = A.shape[0], owner.world_size * B_local.shape[1]
    C = owner.empty(M * N, dtype=A.dtype).view(M, N)
    try:
        ops.gemm_all_scatter(owner, A.contiguous(), B_local.contiguous(), C)
        return _plain_copy(C)
    finally:
        owner.free(C)


@_fake("gemm_all_scatter")
def _(A, B_local, group):
    return A.new_empty((A.shape[0], _world(group) * B_local.shape[1]))


def all_reduce_rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None,
                       group: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``h = all_reduce(x) (+ residual)``, ``out = rmsnorm(h) * weight``: returns ``(out, h)``."""
    from . import ops

    return ops.all_reduce_rmsnorm(named_team(group), x.contiguous(), weight.contiguous(), eps=eps,
                                  residual=None if residual is None else residual.contiguous())


@_fake("all_reduce_rmsnorm")
def _(x, weight, eps, residual, group):
    return torch.empty_like(x), torch.empty_like(x)


# -- expert parallelism -----------------------------------------------------------------------------

def moe_dispatch(x: torch.Tensor, topk_idx: torch.Tensor, num_experts: int, max_tokens_per_rank: int,
                 x_scales: torch.Tensor | None, group: str, quantize: str | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every token to the ranks of its top-k experts (``trident.ops.moe_dispatch`` with the default
    capacity). Returns ``(recv_x, recv_offsets, recv_counts, recv_src, recv_scales, handle)``, copies
    of the dispatch's buffers; ``recv_scales`` is ``[capacity, 0]`` without ``x_scales`` or ``quantize``;
    ``handle`` is the routing ``moe_combine`` needs (int64), to pass on unchanged. ``quantize="fp8"``:
    bf16 ``x`` arrives as fp8 rows with their scales (``trident.ops.moe_dispatch``'s ``quantize``)."""
    from .ops.moe import dispatch as moe

    d = moe.moe_dispatch(named_team(group), x.contiguous(), topk_idx.contiguous(), num_experts, max_tokens_per_rank,
                         x_scales=x_scales, quantize=quantize)
    scales = d.recv_scales if d.recv_scales is not None else d.recv_x.new_empty((d.capacity, 0), dtype=torch.float32)
    handle = torch.cat([d.handle.recv_j, d.handle.layout, d.handle.sent]).to(torch.int64)
    return (_plain_copy(d.recv_x), d.recv_offsets.clone(), d.recv_counts.clone(), d.recv_src.clone(),
            _plain_copy(scales), handle)


@_fake("moe_dispatch")
def _(x, topk_idx, num_experts, max_tokens_per_rank, x_scales, group, quantize=None):
    from .ops.moe.dispatch import SCALE_BLOCK
    from .ops.moe.sizing import default_capacity

    world = _world(group)
    experts_local = num_experts // world
    rows = default_capacity(world, max_tokens_per_rank, topk_idx.shape[1])
    scale_cols = x.shape[1] // SCALE_BLOCK if x_scales is not None or quantize else 0
    rows_dtype = torch.float8_e4m3fn if quantize else x.dtype
    return (x.new_empty((rows, x.shape[1]), dtype=rows_dtype), topk_idx.new_empty(experts_local, dtype=torch.int32),
            topk_idx.new_empty(experts_local, dtype=torch.int32), topk_idx.new_empty(rows),
            x.new_empty((rows, scale_cols), dtype=torch.float32),
            topk_idx.new_empty(rows + 2 * experts_local + topk_idx.shape[0] * topk_idx.shape[1]))


def moe_combine(expert_out: torch.Tensor, topk_weights: torch.Tensor, topk_idx: torch.Tensor,
                recv_src: torch.Tensor, handle: torch.Tensor, num_experts: int, max_tokens_per_rank: int,
                group: str) -> torch.Tensor:
    """The expert outputs back to their tokens' ranks, weighted and summed (``trident.ops.moe_combine``):
    ``[T, H]``. ``topk_idx``, ``recv_src`` and ``handle`` are the dispatch's (any later dispatch may
    have run in between: nothing here reads its receive buffers)."""
    from .ops.moe import combine as moe

    me = named_team(group)
    capacity, choices, layout_words = recv_src.shape[0], topk_idx.numel(), 2 * (num_experts // me.world_size)
    if handle.shape != (capacity + layout_words + choices,) or handle.dtype != torch.int64:
        raise ValueError(f"{me.who()}: moe_combine: handle must be the int64 [{capacity} + {layout_words} + "
                         f"{choices}] tensor torch.ops.trident.moe_dispatch returned with recv_src and this "
                         f"topk_idx, got {handle.dtype} {tuple(handle.shape)}")
    recv_j = handle[:capacity].to(torch.int32)
    layout = handle[capacity:capacity + layout_words].to(torch.int32)
    sent = handle[capacity + layout_words:].to(torch.int32)
    return moe.combine_rows(me, expert_out.contiguous(), topk_weights.contiguous(),
                            topk_idx.contiguous(), recv_src.contiguous(), recv_j, layout, sent, num_experts,
                            max_tokens_per_rank, capacity)


@_fake("moe_combine")
def _(expert_out, topk_weights, topk_idx, recv_src, handle, num_experts, max_tokens_per_rank, group):
    return expert_out.new_empty((topk_idx.shape[0], expert_out.shape[1]))
