"""Per-context state of the collectives: sync slots, call counters, split tables, staging buffers.

Everything lives on the symmetric heap and is allocated lazily by the first collective that
needs it. Allocation is collective, so what is allocated depends only on the call's sizes,
never on this rank's tensors (whether they are on the heap), and every rank stays in step.
"""

from __future__ import annotations

import torch

from .kernels import PHASES

#: Most programs a collective launches; also the number of per-program sync slots.
MAX_PROGRAMS = 256


class Workspace:
    """The collectives' heap memory for one context. Get it with :func:`workspace`."""

    def __init__(self, ctx):
        self.ctx = ctx
        self.flags = ctx.zeros(PHASES * MAX_PROGRAMS * ctx.world_size, dtype=torch.int64)
        self.counts = ctx.zeros(MAX_PROGRAMS, dtype=torch.int64)
        self.table = ctx.zeros(3 * ctx.world_size, dtype=torch.int64)
        self.args = ctx.zeros(MAX_PROGRAMS, dtype=torch.int64)  # per program: where this rank's input lies
        self._buffers: dict[str, torch.Tensor] = {}
        # A faster rank must not signal into our slots before we have zeroed them.
        ctx.barrier()

    def buffer(self, name: str, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """A symmetric scratch tensor of ``numel`` elements; grows (by powers of two) when needed."""
        nbytes = max(numel * dtype.itemsize, 1)
        current = self._buffers.get(name)
        if current is None or current.numel() < nbytes:
            if current is not None:
                self.ctx.device_barrier()  # no rank's earlier kernel still reads the old buffer
                self.ctx.free(current)
            self._buffers[name] = current = self.ctx.empty(1 << (nbytes - 1).bit_length(), dtype=torch.uint8)
        return current[:numel * dtype.itemsize].view(dtype)


def workspace(ctx) -> Workspace:
    """The context's workspace, made on first use (collectively: every rank's first collective)."""
    ws = getattr(ctx, "_ccl_workspace", None)
    if ws is None or ws.ctx is not ctx:
        ws = Workspace(ctx)
        ctx._ccl_workspace = ws
    return ws
