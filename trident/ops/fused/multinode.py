"""The fused ops when the world spans nodes: the fused part inside the node, torch.distributed between.

With N nodes of L ranks (world rank ``r = n * L + l``, see :mod:`trident.runtime.nodes`):

* ``gemm_reduce_scatter``: for each node n, the fused op over the node on the rows bound for node
  n's ranks leaves local rank ``l`` the node's sum of block ``(n, l)``; a reduce across nodes
  (torch.distributed, the ranks with the same local rank) to rank ``(n, l)`` adds the nodes' sums.
* ``all_gather_gemm``: an all-gather across nodes brings the rows of local rank ``l`` of every
  node; for each node, the fused op gathers that node's rows over the node while multiplying,
  straight into C's rows of that node.
* ``gemm_all_reduce``: the fused op over the node, an all-reduce across nodes of this local
  rank's 1/L of the rows, an all-gather in the node.

The inter-node step overlaps the fused step where the data allows: all_gather_gemm multiplies
its own node's rows while the rows of the other nodes travel, and gemm_reduce_scatter computes the
blocks bound for one node at a time, reducing each across nodes (``dist.reduce`` to its owner, on
NCCL's stream) while the next is computed. gemm_all_reduce runs its steps one after the other.
``gemm_all_scatter``, ``all_reduce_rmsnorm``, ``moe_dispatch`` and ``moe_combine`` refuse with
:func:`refuse`: run them in a node's group. See docs/multi-node.md.
"""

from __future__ import annotations

import torch

from ...calls import run_call
from ...ccl import all_gather
from ...errors import TopologyError

#: What runs when the world spans nodes (the rest of trident.ops refuses, naming these).
ACROSS_NODES = ("gemm_reduce_scatter", "all_gather_gemm", "gemm_all_reduce")


def refuse(ctx, name: str):
    """The error of an op that does not run across nodes, saying what does."""
    return TopologyError(
        f"{ctx.who()}: trident.ops.{name} does not run across nodes (this job: {ctx.topology.describe()}): "
        f"it reads and writes peers' heaps, which are mapped inside a node only. Run it inside a node, with "
        f"group=ctx.new_group(ranks) for the ranks of one node (ctx.nodes), and move data between nodes with "
        f"trident.ccl or torch.distributed. Across nodes trident runs the collectives of trident.ccl and "
        f"{', '.join(ACROSS_NODES)} (hierarchically; docs/multi-node.md)")


def _begin(ctx, name: str, tensors: tuple, names: tuple[str, ...]) -> tuple[tuple, tuple]:
    """What every op here starts with: ``(tensors, (node, cross, nodes, ranks per node))``, once each
    tensor is 2-D (``names`` name them in the message) and the nodes have as many ranks each."""
    for key, t in zip(names, tensors, strict=True):
        if not isinstance(t, torch.Tensor) or t.dim() != 2:
            raise ValueError(f"{ctx.who()}: {name}: {key} must be a 2-D tensor")
    h = ctx.hierarchy
    h.require_regular(f"trident.ops.{name}")
    return tensors, (h.node, h.cross, len(h.topology.nodes), h.node.world_size)


def gemm_reduce_scatter(ctx, tensors, options, fused) -> None:
    """``C = (sum over the world's ranks of A @ B)[my rows]``, hierarchically (see the module docstring);
    ``fused`` is the op's pipeline record, run over the node."""
    (A, B, C), (node, cross, nodes, size) = _begin(ctx, "gemm_reduce_scatter", tensors, ("A", "B", "C"))
    (M, K), cols = A.shape, B.shape[1]
    if M % ctx.world_size or C.shape != (M // ctx.world_size, cols):
        raise ValueError(f"{ctx.who()}: gemm_reduce_scatter: A has {M} rows and C shape {tuple(C.shape)}; "
                         f"expected rows divisible by world_size = {ctx.world_size} and C of "
                         f"({M // ctx.world_size}, {cols})")
    m, me, dsts = M // ctx.world_size, ctx.hierarchy.topology.node, ctx.hierarchy.cross_ranks
    # Node n's row blocks, one after another: the fused op leaves local rank l the node's sum of block
    # (n, l), whose reduction to rank (n, l) across nodes runs while the next node's blocks are computed.
    per_node, pending = A.contiguous().view(nodes, size * m, K), []
    for n in range(nodes):
        mine = torch.empty(m, cols, dtype=C.dtype, device=C.device)
        run_call(node, fused, (per_node[n], B, mine), options)
        pending.append((mine, cross.reduce(mine, dsts[n], async_op=True)))
    for _, work in pending:
        if work is not None:
            work.wait()
    C.copy_(pending[me][0])


def all_gather_gemm(ctx, tensors, options, fused) -> None:
    """``C = all_gather(A_local) @ B`` over the world's ranks, hierarchically (see the module docstring);
    ``fused`` is the op's pipeline record, run over the node."""
    (A_local, B, C), (node, cross, nodes, size) = _begin(ctx, "all_gather_gemm", tensors, ("A_local", "B", "C"))
    (m, K), cols = A_local.shape, B.shape[1]
    if C.shape != (ctx.world_size * m, cols):
        raise ValueError(f"{ctx.who()}: all_gather_gemm: C has shape {tuple(C.shape)}, expected "
                         f"({ctx.world_size * m}, {cols})")
    me, A_local = ctx.hierarchy.topology.node, A_local.contiguous()
    across = torch.empty(nodes * m, K, dtype=A_local.dtype, device=A_local.device)
    work = cross.all_gather(across, A_local, async_op=True)  # local rank l of every node, meanwhile:
    out = C if C.is_contiguous() else torch.empty_like(C, memory_format=torch.contiguous_format)
    rows = out.view(nodes, size * m, cols)  # node n's rows of C, gathered over the node from its local ranks
    run_call(node, fused, (A_local, B, rows[me]), options)  # my node's rows need nothing from other nodes
    if work is not None:
        work.wait()
    for n in range(nodes):
        if n != me:
            run_call(node, fused, (across[n * m:(n + 1) * m], B, rows[n]), options)
    if out is not C:
        C.copy_(out)


def gemm_all_reduce(ctx, tensors, options, fused) -> None:
    """``C = sum over the world's ranks of A @ B``, hierarchically (see the module docstring);
    ``fused`` is the op's pipeline record, run over the node."""
    (A, B, C), (node, cross, _, size) = _begin(ctx, "gemm_all_reduce", tensors, ("A", "B", "C"))
    run_call(node, fused, (A, B, C), options)  # the node's sum, on every rank of the node
    M, cols = C.shape
    if M % size or not C.is_contiguous():  # each local rank reduces all of C across nodes
        flat = C.contiguous()
        cross.all_reduce(flat)
        if flat is not C:
            C.copy_(flat)
        return
    rows = C.view(size, M // size, cols)[node.rank].clone()  # my 1/L of the rows crosses nodes
    cross.all_reduce(rows)
    all_gather(ctx, C.view(-1), rows.view(-1), group=node)
