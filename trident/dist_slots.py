"""The heap slots of torch groups with backend "trident": what :mod:`trident.dist_backend` runs in.

A trident group needs a heap region at the same offset on every member, and torch calls a
backend's creator on the member ranks only, so the regions are kept up front, on every rank of the
world: ``trident.init`` keeps ``dist_groups`` slots (:func:`init_slots`) in a region at the top of
the heap (``init(reserve={NAME: ...})``, :meth:`ctx.reserved_region`), and :func:`reserve`
(collective) reserves other sizes instead. A new torch group takes the lowest slot free on all of
its members (:func:`agree_on_slot`).
"""

from __future__ import annotations

import json
import weakref

import torch

from .errors import TridentError
from .layout import ALLOC_ALIGN
from .runtime.groups import open_contexts, region_bytes

NAME = "trident"
#: Slots and bytes per slot :func:`reserve` takes by default (64 MiB of heap in all).
DEFAULT_GROUPS = 4
DEFAULT_GROUP_BYTES = 16 << 20

#: Why a torch group's trident part ended while its context is open.
SLOTS_ENDED = ("the ctx.heap_scope() in which trident.dist_backend.reserve() made its heap slots has ended and "
               "freed them; the torch group runs every call on its fallback group (gloo / NCCL) from now on")
#: The open arena (one per process: a process has one trident context at a time).
_ARENA: weakref.ref | None = None


class Arena:
    """The world's slots for torch groups: one heap region (``region``: None allocates it,
    collectively), cut in equal slots."""

    def __init__(self, ctx, groups: int, group_bytes: int, region: torch.Tensor | None = None):
        self.ctx, self.groups, self.group_bytes = ctx, groups, group_bytes
        self.slot_bytes = region_bytes(group_bytes)
        self.region = ctx.zeros(groups * self.slot_bytes, dtype=torch.uint8) if region is None else region
        self.free = set(range(groups))
        self.live: set = set()  # the trident groups of the torch groups now in the slots
        if region is None:
            ctx.barrier()  # every rank's slots are zeroed before any member signals into them

    def resource_ended(self) -> None:
        """The slots' memory is gone (the heap_scope reserve() ran in ended, or the context closed):
        the torch groups in them stop using it (they run on their fallback from now on)."""
        for group in self.live:
            group.release(SLOTS_ENDED)
        self.live.clear()
        self.region = None

    def slot(self, index: int) -> torch.Tensor:
        return self.region[index * self.slot_bytes:(index + 1) * self.slot_bytes]


#: Slots ``trident.init`` keeps for torch groups unless told otherwise (``dist_groups``).
INIT_SLOTS = 4


def _slot_bytes(heap_size: int) -> int:
    """Each init slot's workspace: ``heap_size / 64`` bytes (aligned)."""
    return heap_size // 64 // ALLOC_ALIGN * ALLOC_ALIGN


def init_slots(heap_size: int, count: int) -> tuple[int, int]:
    """``(slots, bytes per slot's workspace)`` that ``trident.init(dist_groups=count)`` keeps: each
    slot ``heap_size / 64`` bytes, all of them at most 1/8 of the heap (else none).

    Example::

        trident.init(reserve={"trident": init_bytes(1 << 30, 4)})   # what trident.init does
    """
    group_bytes = _slot_bytes(heap_size)
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise ValueError(f"dist_groups={count!r} must be an int >= 0 (slots for torch groups of backend 'trident')")
    fits = count and group_bytes and count * region_bytes(group_bytes) <= heap_size // 8
    return (count if fits else 0), group_bytes


def slots_in(heap_size: int, region) -> tuple[int, int]:
    """``(slots, bytes per slot's workspace)`` in the region ``trident.init`` kept (its size says how many)."""
    group_bytes = _slot_bytes(heap_size)
    return (region.nbytes // region_bytes(group_bytes) if group_bytes else 0), group_bytes


def init_bytes(heap_size: int, count: int) -> int:
    """Heap bytes ``trident.init`` keeps for ``count`` torch-group slots (see :func:`init_slots`)."""
    slots, group_bytes = init_slots(heap_size, count)
    return slots * region_bytes(group_bytes)


def reserve(ctx, groups: int = DEFAULT_GROUPS, group_bytes: int = DEFAULT_GROUP_BYTES) -> None:
    """Reserve heap for ``groups`` torch.distributed groups with backend "trident" (collective over the world).

    Call it on every rank after :func:`trident.init` and before ``dist.new_group(...,
    backend="trident")``. A rank may be in at most ``groups`` live trident torch groups at once;
    each group's collectives run on trident for messages up to ``group_bytes / 4`` bytes (larger
    ones go to the fallback). The reservation lasts until the context closes (or the
    ``ctx.heap_scope()`` it was made in ends); calling it again with the same sizes does nothing.

    Args:
        ctx: the world's context.
        groups: slots (live groups per rank).
        group_bytes: each slot's workspace bytes.

    Example::

        trident.dist_backend.reserve(ctx, groups=2, group_bytes=64 << 20)
    """
    global _ARENA
    groups, group_bytes = int(groups), int(group_bytes)
    if groups < 1 or group_bytes < 1:
        raise ValueError(f"rank {ctx.rank}: reserve: groups={groups} and group_bytes={group_bytes} must be positive")
    arena = ctx.resource("dist_backend.arena", lambda: Arena(ctx, groups, group_bytes))
    if (arena.groups, arena.group_bytes) != (groups, group_bytes):
        raise TridentError(f"rank {ctx.rank}: reserve: already reserved {arena.groups} groups of "
                           f"{arena.group_bytes} bytes for this context; it cannot change while it is open")
    _ARENA = weakref.ref(arena)


def current_arena() -> Arena:
    """The slots of :func:`reserve` if it ran (and its context and heap_scope are still open), else
    the ones ``trident.init`` kept."""
    arena = _ARENA() if _ARENA is not None else None
    # Gone with its context, or with the heap_scope() it was made in (its heap is freed then).
    if arena is not None and not arena.ctx.closed and arena.ctx.resources.peek("dist_backend.arena") is arena:
        return arena
    for ctx in open_contexts():
        region = ctx.reserved_region(NAME)  # what trident.init kept for us (init_slots)
        if region is not None and region.nbytes:
            if region.owner is None:
                count, group_bytes = slots_in(ctx.heap_size, region)
                region.owner = Arena(ctx, count, group_bytes, region.tensor[:count * region_bytes(group_bytes)])
            return region.owner
    raise TridentError("dist.new_group(backend='trident') needs heap slots for torch groups, and this "
                       "process's trident context keeps none (trident.init(dist_groups=0), or a heap too small): "
                       "pass trident.init(dist_groups=N), or call trident.dist_backend.reserve(ctx, groups=N) on "
                       "every rank before creating the group")


def agree_on_slot(arena: Arena, store, rank: int, size: int, group_id: str, timeout) -> int:
    """The lowest slot free on every member (they post their free slots to the group's store)."""
    store.set(f"trident/free/{rank}", json.dumps(sorted(arena.free)))
    keys = [f"trident/free/{r}" for r in range(size)]
    store.wait(keys, timeout)
    common = set.intersection(*(set(json.loads(store.get(k))) for k in keys))
    if not common:
        raise TridentError(
            f"rank {arena.ctx.rank}: dist.new_group(backend='trident') (group {group_id!r}): no heap slot is free "
            f"on every member: each rank has {arena.groups} (in use here: {arena.groups - len(arena.free)}); "
            f"destroy groups no longer needed, or keep more: trident.init(dist_groups=N), or groups= in "
            f"trident.dist_backend.reserve(ctx, groups=N)")
    return min(common)
