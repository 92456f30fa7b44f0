"""Process groups: a subset of the world's ranks with a heap region and a name of their own.

``g = ctx.new_group(ranks)`` is collective over the whole world (like
``torch.distributed.new_group``): every rank passes the same ``ranks``, in any order, strided or
not. Every rank, member or not, reserves the group's *region* on its heap then, so the world's
heap allocations stay in step; afterwards only the members use it, for the group's collective
workspace (sync words, staging and scratch buffers), which never touches the world's allocator.
A rank outside ``ranks`` gets None.

A :class:`Group` answers what the collectives ask a context (``rank``, ``world_size``,
``heap_bases``, ``resource``, ``empty``/``zeros``/``free`` inside its region, ``barrier``,
``device_barrier``), in group terms: ``g.heap_bases`` holds the members' heap bases in group
order, so a kernel written with ``rank, world_size, heap_bases`` runs unchanged inside a group
when given ``g.rank, g.world_size, g.heap_bases``. Groups never share flags or workspace, so
several can run at once on different streams.

Contexts and groups are also found by name (``ctx.group_name``, ``g.group_name``, the same on
every rank): how ``torch.ops.trident.*`` name their group.

Making and destroying groups (``ctx.new_group``, ``ctx.destroy_group``), and what ends them
(``ctx.close()``, the end of the ``ctx.heap_scope()`` a group was made in), are in
:mod:`trident.runtime.group_life`. An ended group refuses every later use.

Example::

    tp = ctx.new_group([0, 1]) if ctx.rank < 2 else None   # wrong: every rank must call it
    tp = ctx.new_group([0, 1])                              # None on ranks 2 and 3
    if tp is not None:
        trident.ccl.all_reduce(ctx, x, group=tp)
"""

from __future__ import annotations

import pickle
import weakref
from typing import TYPE_CHECKING

import torch

from .. import layout
from ..calls.cache import CallCache
from ..errors import ContextClosedError, DivergenceError, HeapExhaustedError, TopologyError, TridentError
from .allocator import SymmetricAllocator
from .resources import Resources, refuse_in_capture
from .team import Team

if TYPE_CHECKING:
    from .rendezvous import Rendezvous

_BY_NAME: weakref.WeakValueDictionary = weakref.WeakValueDictionary()

#: Bytes of a group's heap region when the caller gives none: its collectives' staging and
#: scratch buffers (a call on N bytes needs about 2N) and its sync words.
DEFAULT_WORKSPACE_BYTES = 16 << 20
#: The group's barrier words at the start of its region: an epoch, then one slot per member.
_BARRIER_WORDS = 1 + layout.MAX_WORLD
#: Bytes before the group's buffers (the barrier words, rounded up to the heap's alignment).
_BARRIER_BYTES = layout.align_up(_BARRIER_WORDS * 8)


def register(obj, name: str) -> str:
    """Register a context or group under ``name``; returns ``name``."""
    _BY_NAME[name] = obj
    return name


def open_contexts() -> list:
    """This process's open trident contexts (whole worlds, not groups)."""
    return [o for o in _BY_NAME.values() if not isinstance(o, Group) and not o.closed]


def resolve(group_name: str):
    """``(ctx, group)`` for a name: ``group`` is None for a context's whole world. A clear error
    if no open context or group in this process has that name.

    Example::

        ctx, group = resolve(ctx.group_name)
    """
    obj = _BY_NAME.get(group_name) if isinstance(group_name, str) else None
    ctx = obj.ctx if isinstance(obj, Group) else obj
    if ctx is None or ctx.closed:
        known = sorted(name for name, o in _BY_NAME.items() if not (o.ctx if isinstance(o, Group) else o).closed)
        raise ValueError(f"no open trident context or group is named {group_name!r} in this process "
                         f"(open: {known}); pass ctx.group_name or g.group_name")
    return ctx, (obj if isinstance(obj, Group) else None)


def named_team(group_name: str):
    """The open context or group named ``group_name`` (``ctx.group_name``, ``g.group_name``): what
    runs a call that names its team by a string (``torch.ops.trident.*``). Every such call asks, so
    an open team is one dictionary lookup; anything else gets :func:`resolve`'s or
    :meth:`Group.check_usable`'s clear error.

    Example::

        trident.ccl.all_reduce(named_team(ctx.group_name), x)
    """
    obj = _BY_NAME.get(group_name) if isinstance(group_name, str) else None
    if obj is None or obj.closed:
        return team(*resolve(group_name))  # raises: no such name, its context closed, or the group ended
    return obj


class Group:
    """Some of the world's ranks (made by :func:`new_group`); quacks like a context for the collectives.

    Attributes:
        ctx: the world's context.
        ranks: the members' world ranks, in group order.
        rank: this rank's place in ``ranks``; world_size: ``len(ranks)``.
        heap_bases: int64 device tensor: the members' heap bases, in group order.
        group_name: the same on every member.
    """

    spans_nodes = False  # groups live in one node (new_group refuses others); the collectives ask

    def __init__(self, ctx, ranks: tuple[int, ...], region: torch.Tensor, region_offset: int, name: str):
        self.ctx = ctx
        self.ranks, self.rank, self.world_size = ranks, ranks.index(ctx.rank), len(ranks)
        self.heap_bases = ctx.heap_bases[list(ranks)].contiguous()
        self.heap_bases_host = tuple(ctx.heap_bases_host[r] for r in ranks)
        self.device, self.platform = ctx.device, ctx.platform.with_world(len(ranks))
        self.group_name = register(self, name)
        self._region = region
        self._barrier = region[:_BARRIER_WORDS * 8].view(torch.int64)
        start = region_offset + _BARRIER_BYTES
        self._allocator = SymmetricAllocator(start, region_offset + region.numel(), layout.ALLOC_ALIGN)
        self._resources = Resources()
        self.call_cache = CallCache(self._resources)  # the recorded calls of this group (trident.calls)
        self.heap_range = ctx.heap_range
        self.region_offset = region_offset
        self._released: str | None = None  # why the group can no longer be used (see release)
        self._exchange: Rendezvous | None = None  # the members' host-side all-gather (made on first use)

    def who(self, group_rank: int | None = None) -> str:
        """A member named in an error: its world rank, with its group rank beside it."""
        group_rank = self.rank if group_rank is None else group_rank
        return f"rank {self.ranks[group_rank]} (group rank {group_rank} of {list(self.ranks)})"

    def check_usable(self, what: str = "use") -> None:
        """Raise unless the group may run work: its context is open and the group has not ended
        (:meth:`release`). ``what`` names the refused step in the error."""
        if self.ctx.closed:
            raise ContextClosedError(f"rank {self.ctx.rank}: group {self.group_name} ({list(self.ranks)}): cannot "
                                     f"{what}: its trident context is closed; make a new context and group")
        if self._released is not None:
            raise TridentError(f"rank {self.ctx.rank}: group {self.group_name} ({list(self.ranks)}): cannot {what}: "
                               f"{self._released}. Make a new group (ctx.new_group) for further work")

    def release(self, why: str) -> None:
        """End the group: let go of the region and the workspace at once (no cycle left for the
        garbage collector: the workspace refers back to the group) and refuse every later use,
        saying ``why``. Called by what owns the group's region (``ctx.destroy_group``, the end of
        the heap_scope it was made in, the dist backend's slots); users call ``ctx.destroy_group``."""
        if self._released is None:
            self._released = why
        self._resources.clear()
        self._region = self._barrier = self._exchange = None  # type: ignore[assignment]  # released: every later use is refused first

    def __repr__(self) -> str:
        return f"Group({self.group_name!r}, ranks={list(self.ranks)}, rank={self.rank})"

    # What the collectives ask a context, in group terms.
    @property
    def debug(self) -> bool:
        return self.ctx.debug

    @property
    def closed(self) -> bool:
        """Whether the group has ended (its context closed, destroyed, or its heap_scope over)."""
        return self.ctx.closed or self._released is not None

    @property
    def resources(self) -> Resources:
        """The group's own resources (its collective workspace)."""
        return self._resources

    @property
    def region(self) -> torch.Tensor:
        """The group's heap region (uint8, at heap offset ``region_offset``): its barrier words, then
        its buffers. None once the group has ended."""
        return self._region

    def heap_offset(self, tensor) -> int:
        """A heap tensor's offset (the same as the world's)."""
        return self.ctx.heap_offset(tensor)

    def is_symmetric(self, tensor) -> bool:
        """Whether ``tensor`` lies on this rank's heap (the same answer as the world's)."""
        return self.ctx.is_symmetric(tensor)

    def agree_in_debug(self, *what) -> None:
        """The world's debug-mode agreement check is a world collective: not run inside a group."""

    def resource(self, key: str, factory):
        """The group's own per-key state (its collective workspace), made on first use."""
        self.check_usable("run a collective")
        return self._resources.get(key, factory, self)

    def empty(self, numel: int, dtype: torch.dtype = torch.uint8) -> torch.Tensor:
        """``numel`` elements in the group's region (collective over the members)."""
        self.check_usable("allocate")
        nbytes = numel * dtype.itemsize
        try:
            block = self._allocator.allocate(nbytes, f"group {self.group_name} buffer of {nbytes} bytes")
        except HeapExhaustedError:
            raise HeapExhaustedError(
                f"{self.who()}: group {self.group_name}: its heap region of {self._region.numel()} bytes "
                f"cannot hold another {nbytes} bytes; make the group with "
                f"ctx.new_group(ranks, workspace_bytes=...) larger (a collective on N bytes needs about 2N)"
            ) from None
        if self.ctx.debug:
            self._compare_digests(f"allocation check (g.empty of {nbytes} bytes)")
        start = block.offset - self.region_offset  # the allocator counts in heap offsets
        return self._region[start:start + nbytes].view(dtype)

    def zeros(self, numel: int, dtype: torch.dtype = torch.uint8) -> torch.Tensor:
        """``numel`` zeroed elements in the group's region (collective over the members)."""
        return self.empty(numel, dtype).zero_()

    def free(self, *tensors: torch.Tensor) -> None:
        """Return tensors made by :meth:`empty` / :meth:`zeros` to the region."""
        self.check_usable("free")
        for t in tensors:
            offset = self.ctx.heap_offset(t)
            if self._allocator.block_at(offset) is None:
                a = self._allocator
                where = ("it was freed already, or is a view that does not start where its allocation starts"
                         if a.start <= offset < a.end else
                         f"it is not in the group's region (heap offsets {a.start:#x} .. {a.end:#x}): free tensors "
                         f"made by ctx.zeros/empty with ctx.free")
                raise ValueError(f"{self.who()}: g.free: no allocation of group {self.group_name} starts at heap "
                                 f"offset {offset:#x} ({where})")
            self._allocator.free(offset)
            if self.ctx.debug:
                self._compare_digests(f"allocation check (g.free at {offset:#x})")

    def device_barrier(self) -> None:
        """A device barrier of the members only (on the group's own barrier words)."""
        self.check_usable("run a device barrier")
        from ..calls.pipeline import run_call
        from .barrier_ops import GROUP_BARRIER

        run_call(self, GROUP_BARRIER, (self._barrier, self.heap_bases))

    def barrier(self) -> None:
        """Wait for this rank's device work, then for every member (collective over the members).

        Also raises this rank's device faults, and a :class:`DivergenceError` when the members'
        allocations in the group's region (``g.empty``/``g.zeros``/``g.free``) have gone out of step.
        """
        refuse_in_capture(self, "g.barrier()")  # before its device barrier is captured
        self.device_barrier()
        self.ctx.check()
        self._compare_digests("g.barrier()")

    def all_gather_object(self, what: str, value) -> list:
        """Every member's picklable ``value``, in group order (host-side, through the store; members only)."""
        self.check_usable(what)
        if self._exchange is None:
            self._exchange = self.ctx.exchange_among(f"{self.group_name}/", self.rank, self.world_size)
        return [pickle.loads(v) for v in self._exchange.all_gather(f"{what} in group {self.group_name}",
                                                                   pickle.dumps(value))]

    def _compare_digests(self, what: str) -> None:
        a = self._allocator
        states = self.all_gather_object(what, f"{a.digest} after {a.ops} operations (last: {a.last_op})")
        if len(set(s.split(" ", 1)[0] for s in states)) > 1:
            listing = "; ".join(f"{self.who(i)}: {s}" for i, s in enumerate(states))
            raise DivergenceError(
                f"{self.who()}: group {self.group_name}: the members' allocations in the group's region are out of "
                f"step at {what} (every member must make and free the same g.empty/g.zeros tensors in the same "
                f"order): {listing}")


def team(ctx: Team, group: Team | None) -> Team:
    """Who a collective or fused op runs over: the whole world (``group`` None) or a :class:`Group`
    of ``ctx``, which answers the same questions (rank, world_size, heap_bases, workspace) in group terms.

    Example::

        ctx = team(ctx, group)   # at the top of an op that takes group=None
    """
    if group is None or group is ctx:
        return ctx
    if not isinstance(group, Group) or group.ctx is not getattr(ctx, "ctx", ctx):
        raise ValueError(f"rank {ctx.rank}: group={group!r} is not a group of this context: make it with "
                         f"ctx.new_group(ranks), and pass it on its member ranks only")
    group.check_usable("run a collective")  # closed, destroyed, or freed by the heap_scope it was made in
    return group


def region_bytes(workspace_bytes: int) -> int:
    """Bytes of a group's heap region with ``workspace_bytes`` for its buffers (barrier words included)."""
    return _BARRIER_BYTES + layout.align_up(workspace_bytes)


class ReservedRegion:
    """Heap bytes kept at the top of every rank's heap from ``init`` on, for a named user (an
    integration such as :mod:`trident.dist_backend`; ``trident.init(reserve={name: nbytes})``). The
    runtime knows only the name and the bytes; the user keeps what it made there in ``owner``,
    which is told (``owner.resource_ended()``) when the context closes.

    Attributes:
        name: the user's name for it. offset, nbytes: where on the heap (the same on every rank).
        tensor: the bytes (uint8, on this rank's heap). owner: the user's state, or None.
    """

    def __init__(self, name: str, offset: int, tensor: torch.Tensor):
        self.name, self.offset, self.nbytes, self.tensor = name, offset, tensor.numel(), tensor
        self.owner = None

    def resource_ended(self) -> None:
        """The context closed: the owner lets go of the region at once."""
        ended = getattr(self.owner, "resource_ended", None)
        if ended is not None:
            ended()


def keep_reserved(resources, heap: torch.Tensor, heap_size: int, reserve: dict[str, int] | None) -> int:
    """Lay ``reserve``'s regions out downwards from the heap's top (each aligned, in order) and keep
    each among ``resources`` as ``"reserved:<name>"`` (made at init: no heap_scope drops them);
    returns where the allocator's range ends."""
    top = heap_size
    for name, nbytes in (reserve or {}).items():
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
            raise ValueError(f"reserve[{name!r}]={nbytes!r} must be an int number of bytes >= 0")
        nbytes = layout.align_up(nbytes)
        top -= nbytes
        if top < layout.CONTROL_BYTES + layout.ALLOC_ALIGN:
            raise ValueError(f"reserve={reserve} leaves no room in a heap of {heap_size} bytes")
        resources.get(f"reserved:{name}", lambda o=top, n=nbytes, k=name: ReservedRegion(k, o, heap[o:o + n]))
    return top


def group_in_region(ctx, ranks, region: torch.Tensor, name: str) -> Group:
    """A group of ``ranks`` over a heap region reserved earlier (no world collective): for groups
    made on their members only, like torch.distributed's backend creators (:mod:`trident.dist_backend`).

    The caller guarantees that every member passes a region at the same heap offset, of
    :func:`region_bytes` bytes or more, whose barrier words (its first bytes) every member has zeroed
    (:func:`clear_region`) and synchronized on the device before any member uses the group;
    ``name`` must be the same on every member and unique in the process.

    Example::

        clear_region(region); ctx.check(); <store barrier of the members>
        g = group_in_region(ctx, [0, 2], region, f"{ctx.group_name}-pg7")
    """
    ranks = tuple(int(r) for r in ranks)
    topology = getattr(ctx, "topology", None)
    if topology is not None and len({topology.node_of(r) for r in ranks}) > 1:
        raise TopologyError(f"rank {ctx.rank}: group {name}: ranks={list(ranks)} span nodes; a trident group maps "
                            f"its members' heaps, so it lives in one node (use a torch.distributed NCCL group)")
    return Group(ctx, ranks, region, ctx.heap_offset(region), name)


def clear_region(region: torch.Tensor) -> None:
    """Zero a group region's barrier words (before a new group uses a region an earlier one had)."""
    region[:_BARRIER_BYTES].zero_()
