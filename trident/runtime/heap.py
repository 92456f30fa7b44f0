"""Allocation on the symmetric heap and questions about heap tensors (a mixin of Context)."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from .. import config, layout
from ..errors import DivergenceError, NotSymmetricError, TopologyError, TridentError
from . import windows
from .allocator import SymmetricAllocator
from .creation import TensorFactory
from .resources import Resources

if TYPE_CHECKING:
    from ..backends.base import HeapBackend
    from .control import ControlBlock
    from .nodes import Topology
    from .rendezvous import Rendezvous


def address(t: torch.Tensor) -> int:
    """Where ``t``'s first element is (torch reports ``data_ptr() == 0`` for empty tensors)."""
    return t.untyped_storage().data_ptr() + int(t.storage_offset()) * t.element_size()


class SymmetricHeapMixin(TensorFactory):
    """Places tensors on this rank's heap and answers questions about heap tensors.

    A mixin of :class:`~trident.runtime.context.Context`, which provides (its contract):
    ``rank``, ``world_size``, ``device``, ``heap_size``, ``_heap`` (this rank's heap, uint8),
    ``_heaps`` (every rank's, as mapped here), ``_allocator`` (a
    :class:`~trident.runtime.allocator.SymmetricAllocator`), ``_resources``, ``_closed``,
    ``_rendezvous`` (the world's, where ranks compare allocation digests) and ``_check_open()``.
    """

    rank: int
    world_size: int
    device: torch.device
    heap_size: int
    _heap: torch.Tensor
    _heaps: list[torch.Tensor | None]  # None: a peer in another node (never mapped)
    _allocator: SymmetricAllocator
    _resources: Resources
    _closed: bool
    topology: Topology
    _rendezvous: Rendezvous
    _check_open: Callable[[], None]
    _hierarchy: Any
    backend: str
    _backend: HeapBackend
    _control: ControlBlock

    # The public names other modules read (never the private attributes behind them).
    @property
    def closed(self) -> bool:
        """Whether ``close()`` ran (every call then raises :class:`ContextClosedError`)."""
        return self._closed

    @property
    def resources(self) -> Resources:
        """The context's per-context resources (workspaces, groups' records, reserved regions)."""
        return self._resources

    @property
    def hierarchy(self):
        """Across nodes: the node's group and the torch group across nodes (``trident.runtime.nodes``); else None."""
        return self._hierarchy

    def check_open(self) -> None:
        """Raise :class:`ContextClosedError` if the context is closed."""
        self._check_open()

    def _place(self, meta: torch.Tensor, what: str, out, device) -> torch.Tensor:
        """Reserve heap bytes for a tensor shaped like ``meta`` (or reuse ``out``)."""
        self._check_open()
        if device is not None and not self._same_device(torch.device(device)):
            raise ValueError(f"rank {self.rank}: ctx.{what}: heap tensors live on {self.device}, "
                             f"got device={device!r}")
        if meta.layout != torch.strided:
            raise ValueError(f"ctx.{what}: only strided tensors live on the heap, got layout={meta.layout}")
        if out is not None:
            self._require_symmetric(out, f"ctx.{what}(out=...)")
            if out.shape != meta.shape or out.dtype != meta.dtype:
                raise ValueError(f"ctx.{what}: out has shape {tuple(out.shape)} and dtype {out.dtype}, "
                                 f"expected {tuple(meta.shape)} and {meta.dtype} (heap tensors cannot be resized)")
            return out
        span = layout.span_bytes(meta.shape, meta.stride(), meta.element_size())
        description = f"ctx.{what}(shape={tuple(meta.shape)}, dtype={meta.dtype})"
        block = self._allocator.allocate(span, description)
        self._debug_check_in_step(description)
        flat = self._heap[block.offset:block.offset + span]
        return flat.view(meta.dtype).as_strided(meta.shape, meta.stride())

    def _compare_digests(self, what: str) -> None:
        """Raise :class:`DivergenceError` on every rank unless the ranks' allocation histories agree (collective)."""
        a, pool = self._allocator, self._resources.heap_pool
        layout = pool.layout_digest() if pool is not None else ""  # tensors inside heap_allocations' segments
        mine = f"{a.digest}{layout} after {a.ops} heap operations (last: {a.last_op})"
        states = [v.decode() for v in self._rendezvous.all_gather(what, mine.encode())]
        if len(set(s.split(" ", 1)[0] for s in states)) > 1:
            listing = "; ".join(f"rank {r}: {s}" for r, s in enumerate(states))
            raise DivergenceError(
                f"rank {self.rank}: ranks' heap allocations are out of step at {what} (every rank must "
                f"allocate and free the same tensors in the same order): {listing}"
            )

    def _debug_check_in_step(self, what: str) -> None:
        """Debug mode (``TRIDENT_DEBUG=1``): :meth:`_compare_digests` after every allocation and free."""
        if config.DEBUG:
            self._compare_digests(f"allocation check ({what})")

    def _same_device(self, device: torch.device) -> bool:
        """``device`` names the heap's device (``"cuda"`` without an index matches any GPU index)."""
        if device.index is None or self.device.index is None:
            return torch.device(device.type) == torch.device(self.device.type)
        return device == self.device

    @contextlib.contextmanager
    def heap_scope(self):
        """Free every heap allocation made inside the ``with`` block when it ends (collective), and
        drop the resources made inside it, whose memory that was.

        Frees in offset order on every rank, so ranks stay in step. Tensors made inside must not
        be used after the block: their memory goes back to the heap.

        Example::

            with ctx.heap_scope():
                tmp = ctx.empty(1 << 20)
                trident.ccl.all_reduce(ctx, tmp)   # the collectives' workspace goes too
        """
        self._check_open()
        before = {b.offset for b in self._allocator.live_blocks()}
        mark = self._resources.mark()
        try:
            yield self
        finally:
            if not self._closed:
                self._resources.drop_after(mark)
                # A buffer of an older resource that grew inside the block lives in memory the block
                # frees: it lets go, and grows again on its next use.
                for buffer in list(self._resources.buffers):
                    if buffer.tensor is not None and self.heap_offset(buffer.tensor) not in before:
                        buffer.forget()
                    buffer.kept = [t for t in buffer.kept if self.heap_offset(t) in before]  # the block frees the rest
                pooled = self._pooled_offsets()  # segments torch holds (heap_allocations) stay
                for block in self._allocator.live_blocks():
                    if block.offset not in before and block.offset not in pooled:
                        self._allocator.free(block.offset)

    def heap_allocations(self):
        """A ``with`` block inside which the tensors torch makes live on this rank's symmetric heap:
        zero copy, since collectives, fused ops and ``torch.ops.trident.*`` then use them in place.

        On a GPU every CUDA allocation of this thread inside the block comes from :attr:`mem_pool`
        (``torch.matmul``'s and ``F.silu``'s outputs, a CUDA graph's outputs); freed tensors return
        to that pool, as to torch's own. In the simulator torch's factory functions make heap
        tensors inside the block (:mod:`trident.runtime.heap_pool` says exactly what differs).
        Ranks must allocate in the same order there, as with ``ctx.empty``. Not collective to enter.

        Example::

            with ctx.heap_allocations():
                h = torch.matmul(x, w)          # on the heap (GPU)
            trident.ccl.all_reduce(ctx, h)      # in place, no staging copy
        """
        from .heap_pool import allocating_on_heap

        pool = self._heap_pool()
        return allocating_on_heap(self, pool.segments, pool.mem_pool)

    @property
    def mem_pool(self):
        """The ``torch.cuda.MemPool`` whose segments come from the heap (GPU only), e.g. for
        ``torch.cuda.graph(g, pool=ctx.mem_pool.id)`` so that a graph's outputs lie on the heap."""
        pool = self._heap_pool()
        if pool.mem_pool is None:
            raise TridentError(f"rank {self.rank}: ctx.mem_pool is a CUDA memory pool; the simulator has none "
                               f"(use ctx.heap_allocations(), which works on both backends)")
        return pool.mem_pool

    def _heap_pool(self):
        from .heap_pool import HeapPool

        self._check_open()
        if self._resources.heap_pool is None:
            self._resources.heap_pool = HeapPool(self._heap, self._lease, self.backend)
        return self._resources.heap_pool

    def _lease(self, nbytes: int, what: str):
        """``(offset, release)`` of a new heap block of ``nbytes`` (a heap_allocations segment)."""
        block = self._allocator.allocate(nbytes, what)
        self._debug_check_in_step(what)
        return block.offset, lambda: self._allocator.free(block.offset)

    def _pooled_offsets(self) -> set[int]:
        """Heap offsets of the segments heap_allocations holds now."""
        pool = self._resources.heap_pool
        return set() if pool is None else pool.segments.offsets()

    @property
    def heap_digest(self) -> str:
        """A digest of every allocation and free so far: equal on every rank while they are in step."""
        return self._allocator.digest

    def free(self, *tensors: torch.Tensor) -> None:
        """Give tensors' heap memory back (collective: free the same tensors on every rank).

        Each tensor must be one returned by a creation function (or a view starting where it
        starts). Using a tensor after freeing it reads memory a later allocation may reuse.

        Example::

            tmp = ctx.empty(1 << 20)
            ctx.free(tmp)
        """
        self._check_open()
        pooled = self._pooled_offsets()  # heap_allocations' segments: given back when their tensors die
        for t in tensors:
            self._require_symmetric(t, "ctx.free")
            offset = self.heap_offset(t)
            if offset in pooled:
                raise ValueError(f"rank {self.rank}: ctx.free: this tensor was made inside ctx.heap_allocations(); "
                                 f"its memory goes back to the heap when its last view is dropped (del it)")
            if self._allocator.block_at(offset) is None:
                inside = self._allocator.block_containing(offset)
                where = (f"it starts {offset - inside.offset} bytes into the allocation at {inside.offset:#x}; "
                         f"free the tensor that allocation returned" if inside else "already freed?")
                raise ValueError(f"rank {self.rank}: ctx.free: no allocation starts at heap offset "
                                 f"{offset:#x} ({where})")
            self._allocator.free(offset)
            self._debug_check_in_step(f"ctx.free(offset={offset:#x})")

    def memory_stats(self) -> dict[str, int]:
        """Heap usage of this rank, in bytes (the same on every rank when in step).

        Example::

            print(ctx.memory_stats()["free_bytes"])
        """
        self._check_open()
        a = self._allocator
        return {
            "heap_size": self.heap_size, "reserved_bytes": self.heap_size - (a.end - a.start),  # control + torch groups
            "allocated_bytes": a.allocated_bytes, "free_bytes": a.free_bytes,
            "largest_free_block": a.largest_free_block, "peak_allocated_bytes": a.peak,
            "num_allocations": len(a.live_blocks()),
            # buffers that grew after a CUDA graph captured them keep the old memory for its replays
            "kept_for_graphs_bytes": sum(t.numel() for b in list(self._resources.buffers) for t in b.kept),
        }

    def reserved_region(self, name: str):
        """The :class:`~trident.runtime.groups.ReservedRegion` ``init(reserve=...)`` kept under ``name``, or None."""
        return self._resources.peek(f"reserved:{name}")

    @functools.cached_property
    def heap_range(self) -> tuple[int, int]:
        """``(lo, hi)``: this rank's heap addresses (what the call cache asks, :mod:`trident.calls`)."""
        return self._heap.data_ptr(), self._heap.data_ptr() + self.heap_size

    def is_symmetric(self, tensor) -> bool:
        """True when every byte of ``tensor`` lies in this rank's symmetric heap.

        Example::

            assert ctx.is_symmetric(ctx.zeros(4)) and not ctx.is_symmetric(torch.zeros(4))
        """
        self._check_open()
        if not isinstance(tensor, torch.Tensor) or tensor.device != self._heap.device:
            return False
        start = address(tensor) - self._heap.data_ptr()
        span = layout.span_bytes(tensor.shape, tensor.stride(), tensor.element_size())
        return layout.CONTROL_BYTES <= start and start + span <= self.heap_size

    def heap_offset(self, tensor: torch.Tensor) -> int:
        """Byte offset of a symmetric tensor's first element from the heap base (the same on every rank).

        Example::

            x = ctx.zeros(16)
            assert ctx.heap_offset(x) >= 65536   # after the control block
        """
        self._require_symmetric(tensor, "ctx.heap_offset")
        return address(tensor) - self._heap.data_ptr()

    def _require_symmetric(self, tensor, where: str) -> None:
        if not self.is_symmetric(tensor):
            got = (f"a {type(tensor).__name__}" if not isinstance(tensor, torch.Tensor)
                   else f"a tensor on {tensor.device} outside the heap")
            raise NotSymmetricError(
                f"rank {self.rank}: {where} needs a symmetric tensor (made by ctx.zeros/empty/...), got {got}. "
                f"Results of arithmetic on heap tensors are new tensors off the heap: use in-place ops, "
                f"out=, or ctx.as_symmetric(t)."
            )

    def register(self, tensor: torch.Tensor):
        """Make ``tensor``, made elsewhere, reachable by peers (collective): :func:`windows.register`.

        Returns a :class:`~trident.runtime.windows.Window`; in kernels pass ``win.bases`` where the
        device API takes ``heap_bases``. Prefer ``ctx.heap_allocations()`` where the tensor can be
        made inside it (docs/pytorch.md, "Registering a tensor made elsewhere").

        Example::

            win = ctx.register(kv_cache)
            my_kernel[grid](kv_cache, ctx.rank, ctx.world_size, win.bases)
            ctx.unregister(win)
        """
        self._check_open()
        return windows.register(self, tensor, self._backend, self._control.words)

    def unregister(self, window) -> None:
        """End ``ctx.register``'s registration (collective): :func:`windows.unregister`.

        Example::

            ctx.unregister(win)
        """
        self._check_open()
        windows.unregister(self, window, self._backend, self._control.words)

    def peer_view(self, tensor: torch.Tensor, peer: int) -> torch.Tensor:
        """A host-side view of ``peer``'s copy of a symmetric tensor (for checks and staging).

        Reads see what the peer's kernels wrote once both sides have passed a ``barrier()``.

        Example::

            ctx.barrier()
            left = ctx.peer_view(x, (ctx.rank - 1) % ctx.world_size).clone()
        """
        self._require_symmetric(tensor, "ctx.peer_view")
        if not 0 <= peer < self.world_size:
            raise ValueError(f"peer={peer} is not a rank of this job (world size {self.world_size})")
        heap = self._heaps[peer]
        if heap is None:
            raise TopologyError(f"rank {self.rank}: ctx.peer_view: rank {peer} is in another node "
                                f"({self.topology.describe()}); its heap is not mapped here. Move data "
                                f"between nodes with trident.ccl's collectives")
        offset = self.heap_offset(tensor)
        return heap[offset:].view(tensor.dtype).as_strided(tensor.shape, tensor.stride())
