"""Making and destroying process groups, and what ends them.

``ctx.new_group(ranks)`` reserves a heap region on every rank of the world (so the world's
allocations stay in step) and returns a :class:`~trident.runtime.groups.Group` on the members,
None elsewhere. Every rank keeps a record of the group among the context's resources, so a
group ends, and refuses every later use, in exactly one of three ways:

* ``ctx.destroy_group(g)`` (collective over the world, like ``new_group``: members pass the group,
  the other ranks None) frees its region at once;
* the ``ctx.heap_scope()`` it was made in ends: the scope frees the region, and the group's
  record, made inside the scope, is dropped with the scope's other resources;
* ``ctx.close()``: every record is dropped.

An ended group lets go of its region and its collectives' workspace at once (the workspace
refers back to the group: left to the garbage collector, that cycle kept a closed heap mapped),
and raises :class:`~trident.errors.ContextClosedError` (context closed) or
:class:`~trident.errors.TridentError` (destroyed, or its heap_scope ended) naming the group.

Example::

    tp = ctx.new_group([0, 1], workspace_bytes=1 << 20)   # every rank; None on ranks 2, 3
    ...
    ctx.destroy_group(tp)                                  # every rank; tp is None on ranks 2, 3
"""

from __future__ import annotations

import operator
import weakref

import torch

from ..errors import HeapExhaustedError, TopologyError
from .groups import DEFAULT_WORKSPACE_BYTES, Group, region_bytes

#: Why a group whose heap_scope ended refuses work (its record was made inside the scope).
SCOPE_ENDED = ("the ctx.heap_scope() it was made in has ended and freed its heap region (a group made inside "
               "a heap_scope lives only as long as the scope)")


#: Groups made so far per context. Not a resource: a heap_scope would reset it, and a later group
#: would reuse an earlier one's name, and with it the store keys of its host-side exchanges.
_COUNTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class _Record:
    """What every rank of the world keeps of one group: its region, and the Group on members.

    A resource of the context under ``groups/<name>``: dropped at the end of the heap_scope it was
    made in, and at close(); :meth:`resource_ended` (called then, see
    :class:`~trident.runtime.resources.Resources`) ends the group.
    """

    def __init__(self, name: str, ranks: tuple[int, ...], region: torch.Tensor, group: Group | None):
        self.name, self.ranks, self.region, self.group = name, ranks, region, group
        self.destroyed = False

    def resource_ended(self) -> None:
        """The heap_scope the group was made in ended, or its context closed."""
        if self.group is not None:
            self.group.release(SCOPE_ENDED)
        self.region = self.group = None  # type: ignore[assignment]  # released: every later use is refused first


def _index(value) -> int:
    if isinstance(value, bool):
        raise TypeError("a bool")
    return operator.index(value)  # an int, or an integer tensor / numpy scalar; never 1.5 or "1"


def _problem(ctx, ranks, workspace_bytes) -> tuple[str | None, tuple, int]:
    """``(what is wrong or None, ranks as ints, workspace_bytes as int)`` for this rank's arguments."""
    try:
        if isinstance(ranks, (str, bytes)):
            raise TypeError("a string")
        ranks = tuple(_index(r) for r in ranks)
    except TypeError:
        return (f"ranks={ranks!r} must be a sequence of int world ranks (a list or tuple of ints, not a string "
                f"nor floats)"), (), 0
    try:
        nbytes = _index(workspace_bytes)
    except TypeError:
        return f"workspace_bytes={workspace_bytes!r} must be an int number of bytes", ranks, 0
    if nbytes < 0:
        return f"workspace_bytes={nbytes} must be >= 0 (bytes of the group's heap region)", ranks, nbytes
    if not ranks or len(set(ranks)) != len(ranks) or not all(0 <= r < ctx.world_size for r in ranks):
        return (f"ranks={list(ranks)} must be distinct ranks of the world (0 .. {ctx.world_size - 1}), at least "
                f"one"), ranks, nbytes
    return None, ranks, nbytes


def new_group(ctx, ranks, workspace_bytes: int = DEFAULT_WORKSPACE_BYTES) -> Group | None:
    """A group of ``ranks`` (collective over the whole world); None on ranks outside it.

    Args:
        ctx: the world's context.
        ranks: world ranks (ints), any subset in any order (group rank i is ``ranks[i]``); the same on
            every rank.
        workspace_bytes: the group's heap region (its collectives' buffers live there), reserved on
            every rank of the world until :func:`destroy_group`, the end of the ``heap_scope`` it
            was made in, or ``close()``.

    Raises:
        ValueError: on every rank, when any rank's arguments are bad or ranks passed different ones.

    Example::

        pairs = [ctx.new_group([0, 1]), ctx.new_group([2, 3])]   # every rank makes both
        mine = next(g for g in pairs if g is not None)
    """
    ctx.check_open()
    # Checked after the exchange, so that every rank raises the same error (none is left waiting).
    everyone = ctx.all_gather_object("new_group", _problem(ctx, ranks, workspace_bytes))
    bad = [f"rank {r}: {p}" for r, (p, _, _) in enumerate(everyone) if p is not None]
    if bad:
        raise ValueError(f"rank {ctx.rank}: new_group: {'; '.join(bad)}")
    if len({(r, w) for _, r, w in everyone}) > 1:
        listing = "; ".join(f"rank {r}: ({list(v[1])}, {v[2]})" for r, v in enumerate(everyone))
        raise ValueError(f"rank {ctx.rank}: new_group: every rank must pass the same ranks and workspace_bytes "
                         f"(it is collective over the world): {listing}")
    _, ranks, workspace_bytes = everyone[ctx.rank]
    if len({ctx.topology.node_of(r) for r in ranks}) > 1:  # the same on every rank: nobody is left waiting
        raise TopologyError(f"rank {ctx.rank}: new_group: ranks={list(ranks)} span nodes ({ctx.topology.describe()}); "
                            f"a trident group maps its members' heaps, so it lives in one node. Use the world "
                            f"(hierarchical across nodes) or a torch.distributed group (docs/multi-node.md)")
    _COUNTS[ctx] = count = _COUNTS.get(ctx, 0) + 1
    nbytes = region_bytes(workspace_bytes)
    try:
        region = ctx.zeros(nbytes, dtype=torch.uint8)
    except HeapExhaustedError:
        stats = ctx.memory_stats()
        raise HeapExhaustedError(
            f"rank {ctx.rank}: new_group(ranks={list(ranks)}, workspace_bytes={workspace_bytes}) needs a heap region "
            f"of {nbytes} bytes on every rank of the world, but only {stats['free_bytes']} bytes of the heap are free "
            f"(largest free range {stats['largest_free_block']}; heap {ctx.heap_size} bytes). Destroy groups no longer "
            f"needed (ctx.destroy_group), pass a smaller workspace_bytes, or a larger heap_size to trident.init()"
        ) from None
    ctx.barrier()  # every rank zeroed its region before any member signals into it
    name = f"{ctx.group_name}-g{count}"
    group = Group(ctx, ranks, region, ctx.heap_offset(region), name) if ctx.rank in ranks else None
    ctx.resource(f"groups/{name}", lambda: _Record(name, ranks, region, group))
    return group


def destroy_group(ctx, group) -> None:
    """End a group of :func:`new_group` and free its heap region (collective over the whole world).

    Every rank calls it in the same order: the group's members pass the group, the other ranks
    None (what ``new_group`` returned them). Every rank waits for its device work first
    (``ctx.barrier()``), so no member's kernel still uses the region. Afterwards the group refuses
    every use with a :class:`~trident.errors.TridentError`.

    Raises:
        ValueError: on every rank, when the ranks do not name one live group, or a member passed None
            or a non-member a group.

    Example::

        tp = ctx.new_group([0, 1])
        ctx.destroy_group(tp)   # on ranks 0, 1 tp is the group; elsewhere None
    """
    ctx.check_open()
    if group is not None and (not isinstance(group, Group) or group.ctx is not ctx):
        mine: str | None = f"not a group of this context: {group!r}"
    else:
        mine = None if group is None else group.group_name
    everyone = ctx.all_gather_object("destroy_group", mine)
    names = {v for v in everyone if v is not None}
    record = ctx.resources.peek(f"groups/{next(iter(names))}") if len(names) == 1 else None
    listing = "; ".join(f"rank {r}: {v}" for r, v in enumerate(everyone))
    if record is None or record.destroyed or record.region is None:
        raise ValueError(f"rank {ctx.rank}: destroy_group: the ranks must name one live group of ctx.new_group "
                         f"(its members pass the group, the other ranks None; not one destroyed already or "
                         f"ended with its heap_scope): {listing}")
    passed = {r for r, v in enumerate(everyone) if v is not None}
    if passed != set(record.ranks):
        raise ValueError(f"rank {ctx.rank}: destroy_group: group {record.name} has members {list(record.ranks)}; "
                         f"exactly they pass the group, every other rank None: {listing}")
    ctx.barrier()  # no rank's kernel still uses the region
    region = record.region
    if record.group is not None:
        record.group.release("it was destroyed with ctx.destroy_group")
    record.region, record.group, record.destroyed = None, None, True
    ctx.free(region)


def groups_from_mesh(ctx, mesh, dim, workspace_bytes: int = DEFAULT_WORKSPACE_BYTES) -> Group | None:
    """This rank's group along dimension ``dim`` of a ``torch.distributed.device_mesh.DeviceMesh``
    (collective over the whole world: every group of that dimension is made, in mesh order).

    Args:
        ctx: the world's context.
        mesh: the DeviceMesh (its ``mesh`` tensor of world ranks is all that is read).
        dim: the dimension, by index or by name (``mesh.mesh_dim_names``).
        workspace_bytes: each group's heap region (see :func:`new_group`).

    Example::

        mesh = DeviceMesh("cuda", torch.arange(8).view(2, 4), mesh_dim_names=("dp", "tp"))
        tp = ctx.groups_from_mesh(mesh, "tp")     # ranks 0-3 or 4-7
    """
    ctx.check_open()
    if isinstance(dim, str):
        names = tuple(getattr(mesh, "mesh_dim_names", None) or ())
        if dim not in names:
            raise ValueError(f"rank {ctx.rank}: groups_from_mesh: the mesh has no dimension named {dim!r} "
                             f"(its names: {names})")
        dim = names.index(dim)
    ranks = torch.as_tensor(mesh.mesh).cpu()
    if not -ranks.dim() <= dim < ranks.dim():
        raise ValueError(f"rank {ctx.rank}: groups_from_mesh: dim={dim} is not a dimension of a "
                         f"{ranks.dim()}-D mesh")
    rows = ranks.movedim(dim, -1).reshape(-1, ranks.shape[dim]).tolist()
    mine = None
    for row in rows:
        group = new_group(ctx, row, workspace_bytes)
        mine = group if group is not None else mine
    return mine
