"""``trident.init``: the runtime's ``init`` with trident's integrations with torch made ready.

Kept apart from ``trident/__init__.py`` so that ``import trident`` loads nothing heavy: the
integrations (and torch) load with the first ``trident.init``, ``trident.ccl``, ... that uses them.
"""

from __future__ import annotations

from . import dist_backend, layout, torch_ops
from .runtime import context as _context
from .runtime.context import Context


def init(heap_size: int = _context.DEFAULT_HEAP_SIZE, backend: str | None = None, *,
         dist_groups: int = dist_backend.INIT_SLOTS, **kwargs) -> Context:
    """``trident.runtime.context.init`` (its arguments: ``timeout``, ``wait_timeout``, ...), with
    trident's integrations with torch: registers ``torch.ops.trident.*`` and the torch.distributed
    backend "trident" (on the first call; importing trident registers nothing), and keeps
    ``dist_groups`` heap slots at the top of the heap for ``dist.new_group(ranks, backend="trident")``,
    each of ``heap_size / 64`` bytes (0 keeps none; :mod:`trident.dist_backend`).

    Example::

        ctx = trident.init(heap_size=1 << 28)
    """
    torch_ops.register()
    dist_backend.register()
    if isinstance(heap_size, int) and not isinstance(heap_size, bool):  # else the runtime says what is wrong
        kept = dist_backend.init_bytes(layout.align_up(heap_size), dist_groups)  # the heap init makes
        kwargs["reserve"] = {dist_backend.NAME: kept, **kwargs.get("reserve", {})}
    return _context.init(heap_size, backend, **kwargs)


init.__doc__ = (init.__doc__ or "") + "\n" + (_context.init.__doc__ or "")
