"""A ``torch.cuda.MemPool`` whose segments come from the symmetric heap (``ctx.mem_pool``).

torch's caching allocator asks a pool's allocator for a *segment* when it has no free block to
split (a few MiB at a time, rounded), and gives segments back when the pool is emptied. Here the
allocator is a pair of C callbacks (ctypes) into trident's heap allocator: ``take(nbytes)`` returns
a heap address, ``give_back(address)`` returns it. Python runs inside torch's allocation, holding
the GIL the calling thread already holds (``use_mem_pool`` routes only the current thread's
allocations to the pool).

An allocation that does not fit returns NULL: torch then raises ``torch.OutOfMemoryError``, which
``ctx.heap_allocations()`` turns into a :class:`~trident.errors.HeapExhaustedError` naming the heap.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import torch

from ..torch_private import custom_cuda_allocator

#: ``void* alloc(size_t size, int device, cudaStream_t stream)``
ALLOC = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)
#: ``void free(void* ptr, size_t size, int device, cudaStream_t stream)``
FREE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)


class HeapMemPool:
    """A MemPool on the heap (``pool``), with the callbacks it calls, kept alive as long as it is.

    Args:
        take: ``take(nbytes) -> address`` on the heap; raises when nothing fits.
        give_back: ``give_back(address)``.
        failed: called with the exception of an allocation that did not fit (torch sees NULL).

    Example::

        pool = HeapMemPool(take, give_back, failed).pool
        with torch.cuda.use_mem_pool(pool):
            y = x @ w          # y lies on the heap
    """

    def __init__(self, take: Callable[[int], int], give_back: Callable[[int], None],
                 failed: Callable[[BaseException], None]):
        def alloc(size, device, stream):
            try:
                return take(int(size))
            except Exception as exc:  # noqa: BLE001 (no exception may cross into C: NULL, and say why)
                failed(exc)
                return None

        def free(ptr, size, device, stream):
            try:
                give_back(int(ptr))
            except Exception as exc:  # noqa: BLE001
                failed(exc)

        self._alloc, self._free = ALLOC(alloc), FREE(free)  # the C side holds only their addresses
        self.allocator = custom_cuda_allocator(_address(self._alloc), _address(self._free))
        self.pool: torch.cuda.MemPool | None = torch.cuda.MemPool(self.allocator)  # None once the context closed


def live_blocks(pool: torch.cuda.MemPool, base: int) -> list[tuple[int, int]]:
    """``(offset from base, bytes)`` of every block of ``pool`` a tensor holds now, in address order: where
    torch has put the pool's live tensors inside the segments it took (the heap sees only segments).

    Example::

        live_blocks(ctx.mem_pool, heap_base)   # [(0, 512), (512, 1024), ...]
    """
    try:
        segments = torch.cuda.memory_snapshot(pool.id, include_traces=False)
    except TypeError:  # torch < 2.12 takes no include_traces (its snapshot has no traces unless recording)
        segments = torch.cuda.memory_snapshot(pool.id)
    return sorted((block["address"] - base, block["size"]) for segment in segments for block in segment["blocks"]
                  if block["state"] == "active_allocated")


def _address(callback) -> int:
    """The C address of a ctypes callback."""
    address = ctypes.cast(callback, ctypes.c_void_p).value
    assert address is not None, "a ctypes callback has an address"
    return address
