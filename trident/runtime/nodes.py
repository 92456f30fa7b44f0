"""How the world is laid out in nodes, and what a rank of one node can reach in another.

A *node* is the set of ranks whose heaps map into each other's address space (CUDA IPC on one
host, shared memory in the simulator). Peers in another node are never mapped: their entry in
``ctx.heap_bases`` is 0, and only torch.distributed (NCCL, gloo) reaches them.

A rank's node comes from, in order:

* ``TRIDENT_NODES=N``: *logical* nodes, N contiguous blocks of ranks (``trident run --nodes N``;
  with torchrun, one machine emulating N nodes, to test multi-node code on one host);
* ``TRIDENT_NODE=name``: the node named explicitly, per rank;
* the host name together with torchrun's ``GROUP_RANK`` (the agent's node rank).

Example::

    ctx = trident.init()
    print(ctx.topology)   # Topology(2 nodes x 4 ranks: [0-3] [4-7]; rank 5 = node 1, local rank 1)
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .. import layout
from ..calls.cache import CallCache
from ..errors import TopologyError
from .group_life import new_group
from .groups import Group


def node_key(rank: int, world_size: int) -> tuple:
    """What names this rank's node, from the environment (see the module docstring)."""
    raw = os.environ.get("TRIDENT_NODES")
    if raw:
        try:
            count = int(raw)
        except ValueError:
            raise ValueError(f"TRIDENT_NODES={raw!r} is not a number of nodes") from None
        if count < 1 or world_size % count:
            raise ValueError(f"TRIDENT_NODES={count} must divide the world size {world_size} "
                             f"(logical nodes are equal contiguous blocks of ranks)")
        return ("logical", rank // (world_size // count))
    if os.environ.get("TRIDENT_NODE"):
        return ("named", os.environ["TRIDENT_NODE"])
    return ("host", socket.gethostname(), os.environ.get("GROUP_RANK", ""))


def describe_environment() -> str:
    """How a job started here would be laid out in nodes, from the environment (``trident info``)."""
    raw, named = os.environ.get("TRIDENT_NODES"), os.environ.get("TRIDENT_NODE")
    if raw:
        return (f"{raw} logical nodes (TRIDENT_NODES): the ranks split into {raw} contiguous blocks that "
                f"do not map each other's heaps")
    if named:
        return f"node named explicitly (TRIDENT_NODE={named!r}): ranks with the same name share a node"
    group = os.environ.get("GROUP_RANK")
    where = f"host {socket.gethostname()!r}" + (f", torchrun node {group}" if group else "")
    return (f"one node per host ({where}); ranks on other hosts are reached through torch.distributed; "
            f"TRIDENT_NODES=N splits one machine into N logical nodes")


@dataclass(frozen=True)
class Topology:
    """The world's nodes, as every rank sees them (the same on every rank).

    Attributes:
        rank: this rank.
        nodes: each node's ranks (ascending), nodes ordered by their first rank.
        node: this rank's node (an index into ``nodes``).
        local_rank: this rank's place in its node.
    """

    rank: int
    nodes: tuple[tuple[int, ...], ...]

    @classmethod
    def from_keys(cls, rank: int, keys: list) -> Topology:
        """The layout from every rank's :func:`node_key`, in rank order."""
        order: dict = {}
        for r, key in enumerate(keys):
            order.setdefault(key, []).append(r)
        return cls(rank, tuple(tuple(ranks) for ranks in order.values()))

    @property
    def node(self) -> int:
        return next(i for i, ranks in enumerate(self.nodes) if self.rank in ranks)

    @property
    def local_rank(self) -> int:
        return self.nodes[self.node].index(self.rank)

    @property
    def local_ranks(self) -> tuple[int, ...]:
        """The ranks of this rank's node (the peers it can address)."""
        return self.nodes[self.node]

    @property
    def spans_nodes(self) -> bool:
        return len(self.nodes) > 1

    @property
    def regular(self) -> bool:
        """Equal nodes of contiguous ranks (what torchrun makes): what the hierarchical ops need."""
        size = len(self.nodes[0])
        return all(ranks == tuple(range(i * size, (i + 1) * size)) for i, ranks in enumerate(self.nodes))

    def node_of(self, rank: int) -> int:
        """The node of ``rank``."""
        return next(i for i, ranks in enumerate(self.nodes) if rank in ranks)

    def reachable(self, peer: int) -> bool:
        """Whether this rank maps ``peer``'s heap (same node)."""
        return peer in self.local_ranks

    def describe(self) -> str:
        """One line: the nodes and where this rank is."""
        def span(ranks):
            regular = ranks == tuple(range(ranks[0], ranks[-1] + 1))
            return f"[{ranks[0]}-{ranks[-1]}]" if regular and len(ranks) > 1 else str(list(ranks))
        sizes = {len(r) for r in self.nodes}
        shape = f"{len(self.nodes)} nodes x {sizes.pop()} ranks" if len(sizes) == 1 else f"{len(self.nodes)} nodes"
        return (f"{shape}: {' '.join(span(r) for r in self.nodes)}; rank {self.rank} = node {self.node}, "
                f"local rank {self.local_rank}")

    def __repr__(self) -> str:
        return f"Topology({self.describe()})"


class Hierarchy:
    """What the hierarchical collectives run over (made at init when the world spans nodes, collectively).

    Attributes:
        node: this rank's node as a trident group (:class:`NodeTeam`): the intra-node part runs on it.
        cross: the torch.distributed group of the ranks with this local rank, one per node (inter-node part).
        cross_ranks: its world ranks, in node order.
    """

    def __init__(self, ctx, topology: Topology):
        self.topology = topology
        node = None
        ranks: Sequence[int]
        for ranks in topology.nodes:  # collective over the world: every rank makes every node's group
            g = new_group(ctx, ranks, workspace_bytes=layout.ALLOC_ALIGN)
            if g is not None:
                node = NodeTeam(ctx, g.ranks, g.region, g.region_offset, g.group_name)
        self.node = node
        gpus = _gpu_identities(ctx)

        def shared(ranks) -> bool:  # the simulator's gloo groups take any ranks
            return not ctx.platform.simulator and len({gpus[r] for r in ranks}) < len(ranks)

        # The whole world between nodes (ctx.broadcast, all_to_all_v).
        self.world = CrossNodes(None, shares_gpu=shared(range(ctx.world_size)))
        self.cross = self.cross_ranks = None
        if topology.regular:  # torch's new_group is collective too: every rank makes each, in one order
            for local in range(len(topology.nodes[0])):
                ranks = [ranks[local] for ranks in topology.nodes]
                cross = CrossNodes(ranks, shares_gpu=shared(ranks))
                if local == topology.local_rank:
                    self.cross, self.cross_ranks = cross, ranks

    def require_regular(self, what: str) -> None:
        """Raise unless the nodes are equal blocks of contiguous ranks."""
        if self.cross is None:
            raise TopologyError(f"{what} across nodes needs equal nodes of contiguous ranks (as torchrun makes "
                                f"them); this job has {self.topology.describe()}")

    def device_barrier(self) -> None:
        """Every rank of the world arrived: the node's device barrier, the same local ranks across nodes
        (torch.distributed, stream-ordered on NCCL), then the node again."""
        self.require_regular("ctx.device_barrier")
        assert self.node is not None and self.cross is not None  # every rank is in a node; regular: a cross group
        self.node.device_barrier()
        self.cross.all_reduce(self.node.ctx.heap_bases.new_zeros(1))
        self.node.device_barrier()


def _gpu_identities(ctx) -> list[str]:
    """Every rank's GPU (``ctx.platform.device_identity``), in rank order (collective)."""
    return ctx.all_gather_object("gpu identity", ctx.platform.device_identity)


class CrossNodes:
    """A torch.distributed group between nodes (the inter-node step), with the calls trident makes on it.

    NCCL runs it where each member has a GPU of its own. Where members share a GPU (logical nodes on
    one machine), NCCL refuses ("Duplicate GPU detected"): the group is gloo's, and every call goes
    through host copies (half precision summed in fp32 on the host). Slow, but the same results, so
    multi-node code is tested on one GPU; a real cluster never takes that path.

    Args:
        ranks: the members' world ranks (None: the whole world's default group).
        shares_gpu: whether two members share a GPU.
    """

    def __init__(self, ranks, shares_gpu: bool):
        self.shares_gpu = shares_gpu
        if ranks is None:
            self.group = dist.new_group(backend="gloo") if shares_gpu else None
        else:
            self.group = dist.new_group(ranks, backend="gloo" if shares_gpu else None)

    def _run(self, call, out, inp=None, reduce: bool = False):
        """``call(out, inp)`` on the group (``inp`` None: in place), returning what it returns (an async
        call's Work); through the host where members share a GPU, then synchronously (returns None)."""
        if not self.shares_gpu:
            return call(out, out if inp is None else inp)
        dtype = torch.float32 if reduce and out.dtype in (torch.float16, torch.bfloat16) else out.dtype
        host_out = out.to("cpu", dtype)  # a copy: in-place calls read it
        work = call(host_out, host_out if inp is None else inp.to("cpu", dtype))
        if work is not None:
            work.wait()
        out.copy_(host_out)
        return None

    def all_reduce(self, tensor, op=dist.ReduceOp.SUM):
        """``dist.all_reduce`` of ``tensor``, in place."""
        self._run(lambda o, i: dist.all_reduce(o, op=op, group=self.group), tensor, reduce=True)

    def reduce(self, tensor, dst: int, op=dist.ReduceOp.SUM, async_op: bool = False):
        """``dist.reduce`` of ``tensor`` to world rank ``dst``, in place there; a Work with ``async_op``
        (None when it already finished)."""
        return self._run(lambda o, i: dist.reduce(o, dst, op=op, group=self.group, async_op=async_op), tensor,
                         reduce=True)

    def reduce_scatter(self, out, inp, op=dist.ReduceOp.SUM):
        """``dist.reduce_scatter_tensor(out, inp)``."""
        self._run(lambda o, i: dist.reduce_scatter_tensor(o, i, op=op, group=self.group), out, inp, reduce=True)

    def all_gather(self, out, inp, async_op: bool = False):
        """``dist.all_gather_into_tensor(out, inp)``; a Work with ``async_op`` (None when it already finished)."""
        return self._run(lambda o, i: dist.all_gather_into_tensor(o, i, group=self.group, async_op=async_op),
                         out, inp)

    def all_to_all(self, out, inp, out_splits=None, in_splits=None):
        """``dist.all_to_all_single(out, inp, out_splits, in_splits)``."""
        self._run(lambda o, i: dist.all_to_all_single(o, i, out_splits, in_splits, group=self.group), out, inp)

    def broadcast(self, tensor, src: int):
        """``dist.broadcast`` of ``tensor`` from world rank ``src``, in place."""
        self._run(lambda o, i: dist.broadcast(o, src=src, group=self.group), tensor)


class NodeTeam(Group):
    """A node's ranks as a group whose buffers come from the world's heap and whose state lives among
    the world's resources: the hierarchical calls are world-collective and allocate the same on every
    node, so the world's allocations stay in step, and ``ctx.heap_scope()`` drops both together."""

    def __init__(self, ctx, *args):
        super().__init__(ctx, *args)
        self._resources = ctx.resources  # one generation count for recorded calls (trident.calls)
        self.call_cache = CallCache(ctx.resources)

    def resource(self, key: str, factory):
        """The node's state under ``key``, kept among the world's resources."""
        return self.ctx.resource(f"node:{key}", factory)

    def empty(self, numel: int, dtype=torch.uint8):
        """``numel`` elements on the world's heap."""
        return self.ctx.empty(numel, dtype=dtype)

    def zeros(self, numel: int, dtype=torch.uint8):
        """``numel`` zeroed elements on the world's heap."""
        return self.ctx.zeros(numel, dtype=dtype)

    def free(self, *tensors) -> None:
        """Give tensors made by :meth:`empty` / :meth:`zeros` back to the world's heap."""
        self.ctx.free(*tensors)
