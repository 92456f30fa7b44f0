"""What a backend provides: one heap per rank, and a mapping of every peer's heap.

A backend knows nothing of tensors, allocation or ranks' agreement; the context drives it:

1. ``create(heap_size)`` makes this rank's heap and returns a handle (bytes) peers can open;
2. the context all-gathers the handles;
3. ``open_peers(handles)`` maps every peer's heap and returns one host view per rank;
4. ``after_exchange()`` runs once every rank has mapped every heap (the simulator unlinks
   its files there, so nothing is left behind even if a process is killed later);
5. ``close()`` releases the mappings.

For ``ctx.register`` (:mod:`trident.runtime.windows`) a backend also shares one tensor made
elsewhere: ``export_tensor`` gives a handle to the memory holding it, ``open_exported`` maps a
peer's, and ``exported_opened`` runs once every peer has mapped it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch


class HeapBackend(ABC):
    """One rank's view of the symmetric heaps of every rank."""

    name: str
    device: torch.device

    @abstractmethod
    def create(self, heap_size: int) -> bytes:
        """Make this rank's heap of ``heap_size`` bytes; return a handle for peers to open."""

    @abstractmethod
    def open_peers(self, handles: list[bytes | None]) -> list[torch.Tensor | None]:
        """Map every rank's heap; return a uint8 tensor over each (this rank's own included), and None
        for a None handle (a peer in another node, never mapped)."""

    def after_exchange(self) -> None:  # noqa: B027  (optional hook)
        """Called once every rank has opened every heap."""

    @abstractmethod
    def abort_word(self, heap: torch.Tensor) -> tuple[torch.Tensor, int]:
        """A one-word int64 tensor the host sets with a plain CPU store and kernels read, and the
        address kernels use for it. ``heap`` is this rank's heap (a backend may use one of its words)."""

    @abstractmethod
    def close(self) -> None:
        """Release this rank's mappings. Tensors that still view the heap keep its memory alive."""

    @abstractmethod
    def synchronize(self) -> None:
        """Wait for every kernel this rank launched."""

    def export_tensor(self, tensor: torch.Tensor, tag: str) -> tuple[bytes, int, int]:
        """``(handle, offset, nbytes)``: a handle peers open to map the memory holding ``tensor``, where
        the tensor starts inside it (bytes) and how many bytes it maps. ``tag`` names it uniquely in this
        process. A backend may move the tensor's data (the simulator moves it into shared memory)."""
        raise NotImplementedError(f"the {self.name} backend cannot share a tensor made elsewhere")

    def open_exported(self, handle: bytes, nbytes: int) -> tuple[int, object]:
        """Map a peer's exported memory: ``(address, keepalive)``; dropping ``keepalive`` unmaps it."""
        raise NotImplementedError(f"the {self.name} backend cannot map a peer's tensor")

    def exported_opened(self, handle: bytes) -> None:  # noqa: B027  (optional hook)
        """Called once every peer has mapped this rank's export ``handle``."""
