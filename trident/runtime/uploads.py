"""Small host-to-device copies that never make the host wait for the device.

A copy from ordinary (pageable) host memory into a CUDA tensor returns only once the stream has
reached it: after every kernel queued before it. A collective that uploads a few words per call
(``all_to_all_v``'s split table, made from host lists) would then stall the host for the whole
queue, about a millisecond behind a busy GPU instead of a few microseconds. :class:`Uploads` goes
through page-locked buffers instead, so the copy is queued like a kernel. A buffer is used again
only once the copy that last read it has run (its CUDA event): the host waits only when
``slots`` uploads are still queued at once.

Example::

    uploads = Uploads(pinned=not ctx.platform.simulator)
    uploads.copy(table[:3 * w], torch.tensor(sizes, dtype=torch.int64))   # queued; returns at once
"""

from __future__ import annotations

import torch

#: Uploads that may be queued at once before the host waits for the oldest.
SLOTS = 16


class Uploads:
    """A ring of ``slots`` page-locked buffers for small uploads to the current CUDA device
    (``pinned``; without, as in the simulator, whose tensors live on the CPU, :meth:`copy` is a
    plain copy)."""

    def __init__(self, pinned: bool, slots: int = SLOTS):
        self.pinned = pinned
        self._buffers: list[torch.Tensor | None] = [None] * slots
        self._events: list[torch.cuda.Event | None] = [None] * slots
        self._next = 0

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
        """``dst.copy_(src)`` for a contiguous host ``src`` of ``dst``'s dtype and size, queued on the
        current stream without waiting for the device; returns ``dst``. Not inside CUDA-graph
        capture (the graph would read a buffer later calls refill): callers refuse that first."""
        if not self.pinned:
            return dst.copy_(src)
        nbytes = src.numel() * src.element_size()
        i = self._next
        self._next = (i + 1) % len(self._buffers)
        event, buffer = self._events[i], self._buffers[i]
        if event is not None:
            event.synchronize()  # the copy that last read this buffer has run (waits only with every slot queued)
        if buffer is None or buffer.numel() < nbytes:
            buffer = self._buffers[i] = torch.empty(max(nbytes, 256), dtype=torch.uint8, pin_memory=True)
        staged = buffer[:nbytes].view(src.dtype).view(src.shape)
        staged.copy_(src)
        dst.copy_(staged, non_blocking=True)
        if event is None:
            event = self._events[i] = torch.cuda.Event()
        event.record()
        return dst
