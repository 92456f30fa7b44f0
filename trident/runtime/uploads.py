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
    uploads.write(table[:3 * w], [4, 4, 0, 4, 4, 0])   # queued; returns at once
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

#: Uploads that may be queued at once before the host waits for the oldest.
SLOTS = 64


class Uploads:
    """A ring of ``slots`` page-locked buffers for small int64 uploads to the current CUDA device
    (``pinned``; without, as in the simulator, whose tensors live on the CPU, :meth:`write` is a
    plain copy)."""

    def __init__(self, pinned: bool, slots: int = SLOTS):
        self.pinned = pinned
        self._buffers: list[tuple[torch.Tensor, np.ndarray] | None] = [None] * slots
        self._events: list[torch.cuda.Event | None] = [None] * slots
        self._next = 0

    def write(self, dst: torch.Tensor, values: Sequence[int]) -> torch.Tensor:
        """Fill the contiguous int64 tensor ``dst`` with ``values`` (Python ints, ``dst.numel()`` of
        them), queued on the current stream without waiting for the device; returns ``dst``. Not
        inside CUDA-graph capture (the graph would read a buffer later calls refill): callers
        refuse that first."""
        if not self.pinned:
            return dst.copy_(torch.tensor(values, dtype=torch.int64))
        n = len(values)
        i = self._next
        self._next = (i + 1) % len(self._buffers)
        event, buffer = self._events[i], self._buffers[i]
        if event is not None:
            event.synchronize()  # the copy that last read this buffer has run (waits only with every slot queued)
        if buffer is None or buffer[0].numel() < n:
            # device="cpu": a caller inside "with torch.device(cuda)" would make it on the GPU
            pinned = torch.empty(max(n, 64), dtype=torch.int64, device="cpu", pin_memory=True)
            buffer = self._buffers[i] = (pinned, pinned.numpy())  # the numpy view: no torch op per write
        pinned, words = buffer
        words[:n] = values
        dst.copy_(pinned[:n], non_blocking=True)
        if event is None:
            event = self._events[i] = torch.cuda.Event()
        event.record()
        return dst
