"""Zero copy from torch: tensors torch makes inside ``ctx.heap_allocations()`` live on the heap.

A collective or fused op stages a plain tensor (one torch's caching allocator made) through the
heap first; a tensor already on the heap is used in place. Inside ``with ctx.heap_allocations():``
what torch allocates comes from this rank's symmetric heap instead, so activations, GEMM outputs
and a CUDA graph's outputs need no staging.

* **On a GPU** a ``torch.cuda.MemPool`` whose allocator takes its segments from the heap
  (``ctx.mem_pool``; :mod:`trident.backends.cuda_pool`): every CUDA allocation of the thread inside
  the block, ``torch.matmul``'s and ``F.silu``'s outputs included, is a heap tensor. Freed tensors
  go back to the pool (torch's caching, as always); its segments go back to the heap when the
  context closes, or when the last tensor in them is dropped after that.
* **In the simulator** torch's CPU allocator cannot be swapped, so the closest honest equivalent:
  torch's factory functions (``torch.empty``, ``zeros``, ``ones``, ``full``, ``rand``, ``randn``,
  ``randint``, ``arange``, ``linspace`` and their ``*_like``) called inside the block make heap
  tensors, freed back to the heap when their last view is dropped. Results of other ops
  (``torch.matmul``, ``x + 1``) stay plain there: write them into a heap tensor with ``out=``.

Ranks that allocate the same sizes in the same order get the same heap offsets, as with
``ctx.empty``; the allocation digest every ``ctx.barrier()`` compares covers these allocations too
(on a GPU also where the pool's live tensors lie inside its segments: :meth:`HeapPool.layout_digest`),
so ranks that diverge are told at the next barrier (or at the allocation in debug mode, in the
simulator). trident's collectives never assume a peer's offset (each call exchanges where every
rank's operand lies), so a divergence cannot make them write to a wrong place.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import threading
from collections.abc import Callable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from ..errors import HeapExhaustedError, TridentError

#: torch's factory functions the simulator's block puts on the heap (their values as torch makes
#: them, random ones drawn from the same generator).
FACTORIES = frozenset({torch.empty, torch.zeros, torch.ones, torch.full, torch.rand, torch.randn, torch.randint,
                       torch.arange, torch.linspace, torch.empty_like, torch.zeros_like, torch.ones_like,
                       torch.full_like, torch.rand_like, torch.randn_like})


class HeapSegments:
    """The heap blocks a context's allocations-on-the-heap hold, by address (thread-safe: torch may
    ask from any thread that allocates inside a block).

    Args:
        allocate: ``allocate(nbytes, what) -> (offset, release)`` on the context's heap allocator.
        heap: this rank's heap tensor (kept alive while any segment is: torch's tensors in a segment
            do not hold the heap themselves).
    """

    def __init__(self, allocate, heap: torch.Tensor):
        self._allocate, self.heap, self.base = allocate, heap, heap.data_ptr()
        self._lock = threading.Lock()
        self.live: dict[int, tuple[int, Callable[[], None]]] = {}  # address -> (nbytes, release)
        self.failure: BaseException | None = None  # the last allocation that did not fit
        self.ended = False
        self.on_empty: Callable[[], None] | None = None  # after close, once the last segment is back

    def take(self, nbytes: int, what: str) -> int:
        """An address of ``nbytes`` on the heap (raises :class:`HeapExhaustedError` when none is free)."""
        with self._lock:
            if self.ended:
                raise TridentError(f"{what}: the trident context is closed; heap allocations end with it")
            offset, release = self._allocate(nbytes, what)
            address = self.base + offset
            self.live[address] = (nbytes, release)
            return address

    def give_back(self, address: int) -> None:
        """Return the segment at ``address`` to the heap (a no-op once the context has closed)."""
        with self._lock:
            entry = self.live.pop(address, None)
            if entry is not None and not self.ended:
                entry[1]()
            if self.ended and not self.live and self.heap is not None:
                self.heap = None  # type: ignore[assignment]  # the last segment is gone: the heap may go
                if self.on_empty is not None:
                    self.on_empty()

    def offsets(self) -> set[int]:
        """Heap offsets of the segments held now."""
        with self._lock:
            return {address - self.base for address in self.live}

    def live_bytes(self) -> int:
        """Bytes the segments hold now."""
        with self._lock:
            return sum(n for n, _ in self.live.values())


#: Pools of closed contexts whose segments torch still holds (tensors made inside a block, alive
#: after ``close()``): their callbacks must outlive those tensors, as the heap's memory does.
_ENDED_WITH_LIVE_SEGMENTS: set = set()


class HeapPool:
    """A context's ``heap_allocations`` state (a per-context resource): the heap segments it holds
    and, on a GPU, the ``torch.cuda.MemPool`` they back (:mod:`trident.backends.cuda_pool`).

    Args:
        heap: this rank's heap tensor.
        lease: ``lease(nbytes, what) -> (offset, release)`` on the context's heap allocator.
        backend: "cuda" or "sim".
    """

    def __init__(self, heap: torch.Tensor, lease, backend: str):
        self.segments = HeapSegments(lease, heap)
        self.mem_pool: torch.cuda.MemPool | None = None
        self._gpu = None
        if backend == "cuda":
            from ..backends.cuda_pool import HeapMemPool

            self._gpu = HeapMemPool(
                lambda n: self.segments.take(n, f"ctx.heap_allocations(): a pool segment of {n} bytes"),
                self.segments.give_back, self._failed)
            self.mem_pool = self._gpu.pool

    def layout_digest(self) -> str:
        """What ``ctx.barrier()`` compares besides the heap allocator's digest: on a GPU, where the pool's
        live tensors lie (torch splits a segment into blocks, so ranks out of step by one small tensor
        take the same segments and differ only inside them); "" in the simulator (each tensor made in
        the block is a heap allocation of its own, in the allocator's digest) and while the pool holds
        nothing."""
        if self._gpu is None or self.mem_pool is None or not self.segments.live:
            return ""
        from ..backends.cuda_pool import live_blocks

        blocks = live_blocks(self.mem_pool, self.segments.base)
        return "+pool:" + hashlib.sha256(repr(blocks).encode()).hexdigest()[:12]

    def _failed(self, exc: BaseException) -> None:
        self.segments.failure = exc

    def resource_ended(self) -> None:
        """The context closes: torch gives back the segments it holds no tensor in; segments with live
        tensors keep the heap's memory (and these callbacks) until their last tensor is dropped."""
        if self._gpu is not None:
            torch.cuda.synchronize()
            self.mem_pool = self._gpu.pool = None  # torch empties the pool's free blocks: give_back
        self.segments.ended = True
        if self.segments.live:
            _ENDED_WITH_LIVE_SEGMENTS.add(self)
            self.segments.on_empty = lambda: _ENDED_WITH_LIVE_SEGMENTS.discard(self)
        else:
            self.segments.heap = None  # type: ignore[assignment]


def _leased_tensor(segments: HeapSegments, nbytes: int, what: str) -> torch.Tensor:
    """A uint8 tensor of ``nbytes`` heap bytes, given back to the heap when its last view is dropped
    (torch keeps the buffer it was made from alive as long as any view of it)."""
    address = segments.take(max(nbytes, 1), what)
    # A subclass of the ctypes array type: its instances take attributes (the array's do not).
    lease: Any = type("HeapLease", (ctypes.c_uint8 * max(nbytes, 1),), {})
    lease = lease.from_address(address)
    lease.give_back = _GiveBack(segments, address)
    return torch.frombuffer(lease, dtype=torch.uint8)[:nbytes]


class _GiveBack:
    """Gives a segment back when the tensor over it (and every view) is gone."""

    def __init__(self, segments: HeapSegments, address: int):
        self.segments, self.address = segments, address

    def __del__(self):
        self.segments.give_back(self.address)


class SimulatorHeapFactories(TorchFunctionMode):
    """The simulator's block: torch's factory functions (:data:`FACTORIES`) make heap tensors."""

    def __init__(self, segments: HeapSegments):
        super().__init__()
        self.segments = segments

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        device = kwargs.get("device")
        if func not in FACTORIES or kwargs.get("out") is not None or (
                device is not None and torch.device(device).type != "cpu"):
            return func(*args, **kwargs)
        values = func(*args, **kwargs)  # the plain tensor torch makes (this mode is off inside the handler)
        flat = _leased_tensor(self.segments, values.numel() * values.element_size(),
                              f"torch.{func.__name__}(shape={tuple(values.shape)}, dtype={values.dtype}) inside "
                              f"ctx.heap_allocations()")
        out = flat.view(values.dtype).view(values.shape).copy_(values)
        return out.requires_grad_(values.requires_grad)


@contextlib.contextmanager
def allocating_on_heap(ctx, segments: HeapSegments, mem_pool):
    """The body of ``ctx.heap_allocations()``: torch's allocations of this thread go to the heap.

    ``mem_pool``: the context's ``torch.cuda.MemPool`` on a GPU (None in the simulator).
    """
    if mem_pool is None:
        with SimulatorHeapFactories(segments):
            yield
        return
    try:
        with torch.cuda.use_mem_pool(mem_pool):
            yield
    except torch.OutOfMemoryError as exc:
        failure, segments.failure = segments.failure, None
        if failure is None:
            raise
        raise HeapExhaustedError(
            f"{ctx.who()}: an allocation inside ctx.heap_allocations() does not fit in the symmetric heap "
            f"({failure}); {segments.live_bytes()} bytes of the heap are held by tensors made inside "
            f"heap_allocations. Give trident.init a larger heap_size, or make fewer or smaller tensors "
            f"inside the block") from exc
