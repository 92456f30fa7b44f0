"""Host-level collectives with torch.distributed's semantics, run by trident kernels on the heap.

Each call runs through the call pipeline (:func:`trident.calls.run_call`): its arguments are
checked before anything runs, tensors that are not on the heap are staged through a symmetric
buffer inside the collective's own kernel (all_to_all_v's input must lie on the heap), and
one kernel is launched on the current stream. There is no host synchronization inside, so the
calls can be captured in a CUDA graph, as long as split sizes are given as device tensors.

The small-message path: a call whose layout (its tensors' shapes, strides, dtypes, placement
and aliasing, and its options) was seen before replays that call's recorded launch on this
call's tensors, skipping the checks it passed then (:mod:`trident.calls`). The debug mode checks
every call in full. Across nodes every collective runs hierarchically (:mod:`.hierarchical`).
"""

from __future__ import annotations

import dataclasses

import torch

from ..calls import run_call
from ..runtime.groups import team
from . import collectives, hierarchical
from .collectives import ALGORITHMS, ALL_REDUCE_ALGORITHMS, INPUT_STAGE, ONE_SHOT_MAX_BYTES, input_stage

_ACROSS_NODES = {"all_gather": hierarchical.all_gather, "reduce_scatter": hierarchical.reduce_scatter,
                 "all_reduce": hierarchical.all_reduce, "all_to_all": hierarchical.all_to_all,
                 "broadcast": hierarchical.broadcast, "all_to_all_v": hierarchical.all_to_all_v}
#: Every collective as the pipeline runs it (in a node and across nodes), by name.
OPS = {name: dataclasses.replace(op, across_nodes=_ACROSS_NODES[name])
       for name, op in collectives.COLLECTIVES.items()}

__all__ = ["ALGORITHMS", "ALL_REDUCE_ALGORITHMS", "INPUT_STAGE", "ONE_SHOT_MAX_BYTES", "OPS", "all_gather",
           "all_reduce", "all_to_all", "all_to_all_v", "broadcast", "input_stage", "reduce_scatter"]


def all_gather(ctx, out: torch.Tensor, inp: torch.Tensor, group=None) -> torch.Tensor:
    """Gather every rank's ``inp`` into ``out`` along dim 0, like ``all_gather_into_tensor``.

    Args:
        out: ``world_size * inp.numel()`` elements (shape ``(world_size * inp.shape[0], ...)`` or flat).
        inp: this rank's part; staged through the heap when it is not symmetric.
        group: a group of ``ctx.new_group`` (None: the whole world).

    Returns:
        ``out``.

    Example::

        out = torch.empty(ctx.world_size * 1024, device=ctx.device)
        trident.ccl.all_gather(ctx, out, ctx.ones(1024))
    """
    run_call(team(ctx, group), OPS["all_gather"], (out, inp))
    return out


def reduce_scatter(ctx, out: torch.Tensor, inp: torch.Tensor, op="sum", group=None) -> torch.Tensor:
    """Reduce every rank's ``inp`` and keep this rank's chunk (dim 0) in ``out``, like ``reduce_scatter_tensor``.

    Example::

        out = torch.empty(1024, device=ctx.device)
        trident.ccl.reduce_scatter(ctx, out, ctx.ones(ctx.world_size * 1024))   # out == world_size
    """
    run_call(team(ctx, group), OPS["reduce_scatter"], (out, inp), (op,))
    return out


def all_reduce(ctx, tensor: torch.Tensor, op="sum", algorithm: str = "auto", group=None,
               out: torch.Tensor | None = None) -> torch.Tensor:
    """Reduce ``tensor`` across ranks, in place, like ``torch.distributed.all_reduce`` (or into ``out``).

    Args:
        tensor: the same shape and dtype on every rank; staged when not symmetric.
        op: "sum", "max", "min" or a ``torch.distributed.ReduceOp``. fp16/bf16 accumulate in fp32.
        algorithm: "one_shot" (every rank reads every peer), "two_shot" (reduce-scatter, then
            all-gather), or "auto" (one_shot up to ``ONE_SHOT_MAX_BYTES``).
        group: a group of ``ctx.new_group`` (None: the whole world).
        out: where the result goes (a tensor of ``tensor``'s shape and dtype, not overlapping it),
            leaving ``tensor`` as it is; None: in place.

    Returns:
        ``tensor`` (or ``out``).

    Example::

        x = ctx.full((4096,), float(ctx.rank))
        trident.ccl.all_reduce(ctx, x)      # every element: 0 + 1 + ... + world_size-1
    """
    result = tensor if out is None else out
    run_call(team(ctx, group), OPS["all_reduce"], (tensor, result), (op, algorithm))
    return result


def all_to_all_v(ctx, out: torch.Tensor, inp: torch.Tensor, out_splits, in_splits, group=None) -> torch.Tensor:
    """Exchange rows (dim 0) with per-rank sizes, like ``all_to_all_single`` with split sizes (MoE dispatch).

    Args:
        out: receives ``out_splits[p]`` rows from each rank ``p``, in rank order (any tensor).
        inp: sends ``in_splits[p]`` rows to each rank ``p``, in rank order. It must lie on the heap
            (row counts differ between ranks, so no staging buffer could be allocated collectively
            without a host round trip): allocate a buffer of the largest row count once, e.g.
            ``ctx.empty(capacity, hidden)``, and pass ``buf[:rows]`` (also when ``rows`` is 0).
        out_splits, in_splits: lists or int tensors of ``world_size`` row counts; ``out_splits[p]``
            must equal rank p's ``in_splits[this rank]``. Device tensors keep the call graph-capturable.

    Example::

        trident.ccl.all_to_all_v(ctx, out, tokens[:n], out_splits=recv_counts, in_splits=send_counts)
    """
    run_call(team(ctx, group), OPS["all_to_all_v"], (out, inp), (out_splits, in_splits))
    return out


def all_to_all(ctx, out: torch.Tensor, inp: torch.Tensor, group=None) -> torch.Tensor:
    """Send chunk ``p`` (dim 0) of ``inp`` to rank ``p``; receive rank ``p``'s chunk into chunk ``p`` of ``out``.

    Like ``all_to_all_single`` with equal splits.

    Example::

        trident.ccl.all_to_all(ctx, out, inp)   # inp.shape[0] divisible by world_size
    """
    run_call(team(ctx, group), OPS["all_to_all"], (out, inp))
    return out


def broadcast(ctx, tensor: torch.Tensor, src: int, group=None, out: torch.Tensor | None = None) -> torch.Tensor:
    """Overwrite ``tensor`` on every rank with ``src``'s, in place, like ``torch.distributed.broadcast``
    (or put ``src``'s ``tensor`` into ``out`` on every rank, leaving ``tensor`` as it is).

    Args:
        tensor: the same shape and dtype on every rank; ``src``'s is sent (staged inside the
            kernel when not symmetric), the others' is overwritten (or, with ``out``, not read).
        src: the rank whose tensor every rank gets.
        group: a group of ``ctx.new_group`` (None: the whole world); ``src`` is a group rank then.
        out: where the result goes (``tensor``'s shape and dtype, not overlapping it); None: in place.

    Returns:
        ``tensor`` (or ``out``).

    Example::

        trident.ccl.broadcast(ctx, weights, src=0)
    """
    result = tensor if out is None else out
    run_call(team(ctx, group), OPS["broadcast"], (tensor, result), (src,))
    return result
