"""The collectives when the world spans nodes: trident's kernels inside a node, torch.distributed between.

A rank maps the heaps of its own node only (:mod:`trident.runtime.nodes`). With N nodes of L
ranks (contiguous blocks, as torchrun makes them), world rank ``r = n * L + l``, each call runs:

* an intra-node step with trident's kernels over the node's ranks (``ctx.hierarchy.node``, a group);
* an inter-node step with torch.distributed over the N ranks that share local rank ``l``
  (``ctx.hierarchy.cross``: NCCL on GPUs, gloo in the simulator).

Across nodes each GPU sends only its 1/L share (all_reduce, all_gather, reduce_scatter), over
its own NIC, in N - 1 steps instead of a flat ring's W - 1. The steps run one after the other
(no overlap yet); data is laid out so that every step is one call on contiguous memory, with a
local permutation where the world's rank order needs it. Intermediate buffers live in the node's
workspace on the heap, so the intra-node kernels read them without staging. The results equal the
flat collectives' (integers exactly; floats up to the summation order). ``all_to_all_v`` first
exchanges every rank's split sizes on the host. The cost model: docs/multi-node.md.
"""

from __future__ import annotations

import itertools
import math

import torch
import torch.distributed as dist

from ..calls import run_call
from . import collectives as flat
from .checks import op_name
from .workspace import workspace

_TORCH_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}


def _parts(ctx, what: str):
    """(node group, torch group across nodes, nodes, ranks per node), or a TopologyError."""
    h = ctx.hierarchy
    h.require_regular(f"trident.ccl.{what}")
    return h.node, h.cross, len(h.topology.nodes), h.node.world_size


def _buffer(node, name: str, numel: int, dtype: torch.dtype) -> torch.Tensor:
    """A flat heap buffer of the node's workspace (the same size on every rank: collective)."""
    return workspace(node).buffer(f"hierarchical.{name}", numel, dtype)


def all_reduce(ctx, tensors, options) -> None:
    """Reduce-scatter in the node, all-reduce each shard across nodes, all-gather in the node."""
    inp, tensor = tensors
    if tensor.data_ptr() != inp.data_ptr():
        tensor.copy_(inp)  # out of place: reduce a copy in place
    name = op_name(ctx, options[0])
    node, cross, _, size = _parts(ctx, "all_reduce")
    n = tensor.numel()
    chunk = -(-n // size)
    whole = _buffer(node, "whole", chunk * size, tensor.dtype)  # padded to a multiple of the node's size
    whole[:n].copy_(tensor.view(-1))
    shard = _buffer(node, "shard", chunk, tensor.dtype)
    run_call(node, flat.REDUCE_SCATTER, (shard, whole), (name,))
    cross.all_reduce(shard, _TORCH_OPS[name])
    run_call(node, flat.ALL_GATHER, (whole, shard))
    tensor.view(-1).copy_(whole[:n])


def reduce_scatter(ctx, tensors, options) -> None:
    """Reduce in the node the chunks bound for the same local rank anywhere, then reduce-scatter across nodes."""
    out, inp = tensors
    name = op_name(ctx, options[0])
    node, cross, nodes, size = _parts(ctx, "reduce_scatter")
    m = out.numel()
    # Chunk (n, l) of the world goes to local rank l of node n: group the chunks by local rank.
    arranged = flat.input_stage(node, inp.numel(), inp.dtype).view(size, nodes, m)
    arranged.copy_(inp.view(nodes, size, m).transpose(0, 1))
    mine = _buffer(node, "shard", nodes * m, inp.dtype)
    run_call(node, flat.REDUCE_SCATTER, (mine, arranged.view(-1)), (name,))
    cross.reduce_scatter(out.view(-1), mine, _TORCH_OPS[name])


def all_gather(ctx, tensors, options) -> None:
    """All-gather across nodes (each rank's part crosses once), all-gather in the node, reorder."""
    out, inp = tensors
    node, cross, nodes, size = _parts(ctx, "all_gather")
    m = inp.numel()
    across = _buffer(node, "shard", nodes * m, inp.dtype)  # from local rank l of every node
    cross.all_gather(across, inp.reshape(-1))
    gathered = _buffer(node, "whole", size * nodes * m, inp.dtype)  # [local rank, node, m]
    run_call(node, flat.ALL_GATHER, (gathered, across))
    out.view(nodes, size, m).copy_(gathered.view(size, nodes, m).transpose(0, 1))


def all_to_all(ctx, tensors, options) -> None:
    """All-to-all in the node (to the local rank that shares the destination's local rank), then across nodes."""
    out, inp = tensors
    w = ctx.world_size
    node, cross, nodes, size = _parts(ctx, "all_to_all")
    e = inp.shape[0] // w * math.prod(inp.shape[1:])  # elements per destination rank
    # Chunk for world rank (n, l) goes first to local rank l of this node: group chunks by local rank.
    arranged = flat.input_stage(node, inp.numel(), inp.dtype).view(size, nodes, e)
    arranged.copy_(inp.view(nodes, size, e).transpose(0, 1))
    got = _buffer(node, "whole", inp.numel(), inp.dtype).view(size, nodes, e)  # [source local rank, dest node]
    run_call(node, flat.ALL_TO_ALL, (got.view(size * nodes, e), arranged.view(size * nodes, e)))
    send = got.transpose(0, 1).contiguous()  # [dest node, source local rank]
    cross.all_to_all(out.view(-1), send.view(-1))  # out: [source node, source local rank]


def broadcast(ctx, tensors, options) -> None:
    """Broadcast across nodes among the ranks with ``src``'s local rank, then in each node."""
    (tensor, out), (src,) = tensors, options
    if out.data_ptr() != tensor.data_ptr():
        out.copy_(tensor)  # out of place: broadcast a copy in place
    node, cross, _, size = _parts(ctx, "broadcast")
    if node.rank == src % size:
        cross.broadcast(out, src)
    run_call(node, flat.BROADCAST, (out, out), (src % size,))


def all_to_all_v(ctx, tensors, options) -> None:
    """Rows to the local rank that shares the destination's local rank (trident, in the node), then
    across nodes (torch.distributed). Every rank's split sizes are exchanged on the host first (the
    intermediate row counts follow from them; device tensors of splits are copied to the host: a sync)."""
    (out, inp), (out_splits, in_splits) = tensors, options
    inner = math.prod(inp.shape[1:])
    sizes = [torch.as_tensor(s).reshape(-1).tolist() for s in (out_splits, in_splits)]
    for name, split, rows in (("out_splits", sizes[0], out.shape[0]), ("in_splits", sizes[1], inp.shape[0])):
        if len(split) != ctx.world_size or sum(split) != rows or min(split) < 0:
            raise ValueError(f"{ctx.who()}: all_to_all_v: {name} {split} must hold world_size = "
                             f"{ctx.world_size} non-negative row counts summing to the {rows} rows along dim 0")
    node, cross, nodes, size = _parts(ctx, "all_to_all_v")
    sent = ctx.all_gather_object("all_to_all_v split sizes", sizes[1])  # sent[p][q]: rows p sends q
    me, mine = ctx.hierarchy.topology.node, node.rank
    home = [me * size + s for s in range(size)]  # my node's ranks, by local rank

    def rank(n, local):
        return n * size + local

    # Step 1, in the node: to local rank l go my rows for (n, l), every node n in order.
    starts = [0, *itertools.accumulate(sizes[1])]
    order = [rank(n, local) for local in range(size) for n in range(nodes)]
    send = _buffer(node, "a2av", max(sum(row) for row in sent) * inner, inp.dtype)  # same size on every rank
    send = send[:inp.shape[0] * inner].view(inp.shape)
    if order:
        torch.cat([inp[starts[p]:starts[p] + sizes[1][p]] for p in order], out=send)
    from_home = [sum(sent[s][rank(n, mine)] for n in range(nodes)) for s in home]  # [source local rank][node]
    got = torch.empty(sum(from_home), *inp.shape[1:], dtype=inp.dtype, device=inp.device)
    run_call(node, flat.ALL_TO_ALL_V, (got, send),
             (from_home, [sum(sizes[1][rank(n, local)] for n in range(nodes)) for local in range(size)]))
    # Step 2, across nodes: to node n go the rows of every source in my node for (n, mine), by source.
    at, pieces = 0, {}
    for s in home:
        for n in range(nodes):
            pieces[s, n] = got[at:at + sent[s][rank(n, mine)]]
            at += sent[s][rank(n, mine)]
    across = torch.cat([pieces[s, n] for n in range(nodes) for s in home]) if pieces else got
    to_node = [sum(sent[s][rank(n, mine)] for s in home) for n in range(nodes)]
    from_node = [sum(sent[rank(n, s)][ctx.rank] for s in range(size)) for n in range(nodes)]
    cross.all_to_all(out.view(-1), across.reshape(-1), [r * inner for r in from_node], [r * inner for r in to_node])
