"""Per-context state with an owner: lazily made resources and heap buffers that grow.

Collectives and fused ops keep state on the symmetric heap between calls (sync slots, staging
buffers, tile flags). :class:`Resources` is where a context keeps it: ``ctx.resource(key, factory)``
makes it on first use (collectively: every rank makes it in the same call), ``ctx.heap_scope()``
drops what was made inside the scope, and ``ctx.close()`` drops everything; a dropped resource
with a ``resource_ended()`` method is told (a group then refuses further use).

:class:`GrowingBuffer` is the one way such state grows: it never leaves a reference to freed
memory behind, even when the heap runs out while it grows.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import TypeVar, cast

import torch

from ..errors import HeapExhaustedError, TridentError
from .device_loss import raise_explained

T = TypeVar("T")


def _capturing(ctx) -> bool:
    """Whether this rank's current stream is being captured into a CUDA graph (never in the simulator).

    The first CUDA call of every trident call: after a peer died mid-kernel under MPS it is the one that
    meets CUDA's sticky error, so that error is raised naming the lost peer (:mod:`.device_loss`)."""
    if ctx.platform.simulator:
        return False
    try:
        return torch.cuda.is_current_stream_capturing()
    except RuntimeError as error:
        raise_explained(ctx, error)


def refuse_in_capture(team, what: str) -> None:
    """Raise a :class:`TridentError` if ``team``'s stream is being captured into a CUDA graph.

    Called *before* anything touches the stream: a host synchronization or an allocation inside
    capture makes CUDA invalidate the capture ("operation not permitted when stream is
    capturing") and leaves torch's CUDA random generator unusable for the rest of the process.
    """
    if _capturing(team):
        raise TridentError(
            f"rank {team.rank}: {what} cannot run inside CUDA-graph capture (it synchronizes with the host or "
            f"allocates, which capture forbids). Make the same trident call (same sizes) once before capturing, "
            f"so that its buffers exist; inside a graph use ctx.device_barrier() instead of ctx.barrier()")


def note_call(team, name: str) -> None:
    """Every trident call tells its team's resources it runs (:func:`trident.calls.run_call`).

    Inside CUDA-graph capture every :class:`GrowingBuffer` of the team that holds memory now is
    marked *captured*: the graph may replay on that memory, so it is never freed while the team
    lives (see :meth:`GrowingBuffer.get`). ``name`` (the op) is what a heap-exhaustion error names.
    """
    resources = team.resources
    resources.calling = name
    if _capturing(team):
        for buffer in list(resources.buffers):
            if buffer.tensor is not None:
                buffer.captured = True


class Resources:
    """The resources of one context, in the order they were made.

    ``generation`` counts the times heap memory behind them may have moved (a
    :class:`GrowingBuffer` reallocated, resources dropped): a recorded call that launches on
    their addresses (:mod:`trident.calls`) is replayed only in the generation it was
    recorded in.
    """

    def __init__(self):
        self._items: dict[str, object] = {}
        self.generation = 0
        self.caches: weakref.WeakSet = weakref.WeakSet()  # the call caches whose recordings use this memory
        self.buffers: weakref.WeakSet[GrowingBuffer] = weakref.WeakSet()  # every GrowingBuffer of the context
        self.calling = ""  # the trident op called last (note_call): named when a buffer cannot grow
        #: ``ctx.heap_allocations()``'s pool (:class:`trident.runtime.heap_pool.HeapPool`): made on first
        #: use and kept until ``close()``, whatever heap_scope it was first used in (torch holds its segments).
        self.heap_pool = None
        #: The tensors registered with ``ctx.register`` (:class:`trident.runtime.windows.Window`), in order;
        #: kept until ``ctx.unregister`` or ``close()``, whatever heap_scope they were registered in.
        self.windows: list = []

    def moved(self) -> None:
        """Heap memory behind the resources may have moved: a new generation, and every call cache
        that recorded launches on them forgets them now (a recording holds no freed memory)."""
        self.generation += 1
        for cache in list(self.caches):
            cache.clear()

    def get(self, key: str, factory: Callable[[], T], team=None) -> T:
        """The resource under ``key``, made by ``factory()`` on first use.

        With ``team`` (a context or group), making it inside CUDA-graph capture is refused with a
        :class:`TridentError` before ``factory`` runs: factories allocate and take barriers.
        """
        if key not in self._items:
            if team is not None:
                refuse_in_capture(team, f"the first trident call that needs {key!r}")
            self._items[key] = factory()
        return cast(T, self._items[key])  # what a factory made for this key (one kind per key)

    def peek(self, key: str) -> object | None:
        """The resource under ``key`` if it exists now (never makes one)."""
        return self._items.get(key)

    def mark(self) -> int:
        """How many resources exist now (see :meth:`drop_after`)."""
        return len(self._items)

    def drop_after(self, mark: int) -> None:
        """Forget the resources made after :meth:`mark` returned ``mark``."""
        dropped = []
        for key in list(self._items)[mark:]:
            dropped.append(self._items.pop(key))
            self.moved()
        _ended(dropped)

    def clear(self) -> None:
        """Forget every resource (at ``ctx.close()``)."""
        dropped = [*self._items.values(), *([self.heap_pool] if self.heap_pool is not None else []), *self.windows]
        self._items.clear()
        self.heap_pool, self.windows = None, []
        self.moved()
        _ended(dropped)


def _ended(resources: list) -> None:
    """Tell dropped resources that have a ``resource_ended()`` method (a group's record, the torch
    groups' slots) that their heap memory is gone, so that what uses it refuses further work (and
    lets go of it now, not when the garbage collector gets to a cycle)."""
    for resource in resources:
        ended = getattr(resource, "resource_ended", None)
        if callable(ended):
            ended()


class GrowingBuffer:
    """A symmetric byte buffer that grows, by powers of two, when a call needs more (collective).

    Growing waits on the device until no rank's earlier kernel still uses the old buffer
    (``ctx.device_barrier()``), frees it, then allocates the new one. If the heap is exhausted
    the buffer is *gone* (the next call allocates afresh), never a pointer to freed memory, and
    the :class:`HeapExhaustedError` names the buffer and the op that asked.

    A buffer that a call used inside CUDA-graph capture is *captured* (:func:`note_call`): a graph
    may replay on it at any time, so when an eager call later makes it grow, the old memory is
    *kept* (in :attr:`kept`, never freed while the team lives; ``ctx.memory_stats()["kept_for_graphs_bytes"]``)
    instead of being freed, and a replay never writes into memory a later allocation owns.
    With ``zeroed`` the new memory is zeroed. A barrier (``ctx.barrier()``) after every growth makes
    sure every rank has its new copy (zeroed) before any peer writes into it, and that the ranks'
    allocations agree, so the copies lie at the same offset (else :class:`DivergenceError`).

    Example::

        flags = GrowingBuffer(ctx, zeroed=True)
        words = flags.get(tiles * 8).view(torch.int64)
    """

    def __init__(self, ctx, zeroed: bool = False, what: str = "a trident buffer"):
        self.ctx = ctx
        self.zeroed = zeroed
        self.what = what
        self.tensor: torch.Tensor | None = None
        self.captured = False  # a call used self.tensor inside CUDA-graph capture
        self.kept: list[torch.Tensor] = []  # earlier captured memory, kept for graphs' replays
        ctx.resources.buffers.add(self)

    def get(self, nbytes: int) -> torch.Tensor:
        """At least ``nbytes`` bytes (uint8, symmetric); the same size on every rank.

        Raises:
            TridentError: the buffer would have to grow while the current stream is being captured
                into a CUDA graph (growing frees the memory earlier captured work uses, and the
                barriers it takes cannot be captured): make the same call once before capturing.
        """
        nbytes = max(int(nbytes), 1)
        if self.tensor is None or self.tensor.numel() < nbytes:
            if _capturing(self.ctx):
                have = 0 if self.tensor is None else self.tensor.numel()
                raise TridentError(
                    f"rank {self.ctx.rank}: a call inside CUDA-graph capture needs {nbytes} bytes of a trident "
                    f"buffer that holds {have}: growing it would free memory that captured work uses. Make the "
                    f"same call (same sizes) once before capturing, so that its buffers exist already")
            calling = self.ctx.resources.calling  # the op that asked (the barriers below are calls too)
            if self.tensor is not None:
                self.ctx.device_barrier()  # no rank's earlier kernel still uses the old buffer
                old, self.tensor = self.tensor, None  # gone before freed: nothing points at freed memory
                self.ctx.resources.moved()  # nor a recorded call (trident.calls)
                if self.captured:  # a graph may replay on it: never free it (docs/pytorch.md, CUDA graphs)
                    self.kept.append(old)
                    self.captured = False
                else:
                    self.ctx.free(old)
            size = 1 << (nbytes - 1).bit_length()
            fresh = self._allocate(size, calling)
            # Every rank zeroed its copy before any peer writes into it, and (the allocation digests
            # compared) every rank's copy lies at the same offset: peers reach it at their own offset,
            # so a buffer made after ranks' allocations diverged would misdirect every write into it.
            # Growing is rare, and never happens inside capture (refused above).
            self.ctx.barrier()
            self.tensor = fresh
        elif _capturing(self.ctx):
            self.captured = True
        return self.tensor[:nbytes]

    def _allocate(self, size: int, op: str) -> torch.Tensor:
        """``size`` fresh bytes; heap exhaustion names this buffer and ``op``, the op that asked for it."""
        try:
            return self.ctx.zeros(size, dtype=torch.uint8) if self.zeroed else self.ctx.empty(size, dtype=torch.uint8)
        except HeapExhaustedError as exc:
            raise HeapExhaustedError(
                f"rank {self.ctx.rank}: {f'trident {op}' if op else 'a trident call'} needs {self.what} to grow "
                f"to {size} bytes (a power of two at least the call's size), and the symmetric heap cannot hold it: "
                f"{exc}") from None

    def forget(self) -> None:
        """Let go of the memory without freeing it (its owner frees it, e.g. ``heap_scope``): the
        next call allocates afresh."""
        if self.tensor is not None:
            self.tensor = None
            self.captured = False
            self.ctx.resources.moved()

    def view(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """Exactly ``numel`` elements of ``dtype`` (flat) at the start of the buffer."""
        return self.get(numel * dtype.itemsize)[:numel * dtype.itemsize].view(dtype)
