"""Per-context state of the collectives: the sync block, the split table, staging buffers.

Everything lives on the symmetric heap and is made lazily by the first collective that needs
it. Allocation is collective, so what is allocated depends only on the call's sizes, never on
this rank's tensors (whether they are on the heap), and every rank stays in step.
"""

from __future__ import annotations

import torch

from ..runtime.resources import GrowingBuffer
from ..runtime.team import Team
from ..runtime.uploads import Uploads
from .kernels import sync_words

#: The key of the workspace among the context's resources (``ctx.resource``).
RESOURCE_KEY = "ccl.workspace"


class Workspace:
    """The collectives' heap memory for one context. Get it with :func:`workspace`.

    Attributes:
        sync: the kernels' sync block (int64; layout in :mod:`trident.ccl.kernels`), zeroed once.
        table: ``3 * world_size`` int64 words: the split table of ``all_to_all_v``.
        uploads: page-locked buffers that fill ``table`` from host split sizes without making the
            host wait for the device (:class:`trident.runtime.uploads.Uploads`).
        table_holds: the values the last upload queued into ``table`` (None: unknown, e.g. made on
            the device): a call with the same split sizes uploads nothing.
    """

    def __init__(self, ctx):
        self.ctx = ctx
        self.sync = ctx.zeros(sync_words(ctx.world_size), dtype=torch.int64)
        self.table = ctx.zeros(3 * ctx.world_size, dtype=torch.int64)
        self.uploads = Uploads(pinned=not ctx.platform.simulator)
        self.table_holds: list[int] | None = None
        self._buffers: dict[str, GrowingBuffer] = {}
        # A faster rank must not signal into our sync slots before we have zeroed them.
        ctx.barrier()

    def buffer(self, name: str, numel: int, dtype: torch.dtype, zeroed: bool = False) -> torch.Tensor:
        """A symmetric scratch tensor of ``numel`` elements, flat (collective: every rank asks for
        the same size). Each name has its own buffer, which grows by powers of two when needed.

        Args:
            name: which buffer (e.g. ``"input"``, ``"scratch"``).
            numel: elements needed (0 is fine).
            dtype: their dtype.
            zeroed: new memory (the first call's, and after each growth) is zeroed; fixed by the
                name's first call.

        Returns:
            A view of the buffer's first ``numel`` elements.

        Example::

            scratch = workspace(ctx).buffer("scratch", n, torch.float32)
        """
        grower = self._buffers.get(name)
        if grower is None:
            grower = self._buffers[name] = GrowingBuffer(self.ctx, zeroed, what=f"its {name!r} staging buffer")
        nbytes = numel * dtype.itemsize
        # A buffer that grows starts a new generation of the context's resources: the recorded
        # calls that launched on the old one are dropped (trident.calls.cache).
        return grower.get(nbytes)[:nbytes].view(dtype)  # [:nbytes]: get() gives at least one byte


def workspace(ctx: Team) -> Workspace:
    """The context's :class:`Workspace`, made on first use (collectively: every rank's first collective).

    It is a resource of the context (``ctx.resource``): dropped at ``ctx.close()``, or at the end
    of the ``ctx.heap_scope()`` it was made in.

    Example::

        table = workspace(ctx).table
    """
    return ctx.resource(RESOURCE_KEY, lambda: Workspace(ctx))

