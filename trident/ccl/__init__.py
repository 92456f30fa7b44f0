"""Collectives on the symmetric heap, with torch.distributed's semantics.

Host level: ``all_gather``, ``all_reduce``, ``reduce_scatter``, ``all_to_all``, ``all_to_all_v``,
``broadcast`` (each takes the context first). Tile level, for fusing into your own kernels:
``trident.ccl.device`` (``reduce_tile``, ``broadcast_tile``, ``combine``, ``shifted``) with ``trident.sync_ranks``.
"""

from . import device
from .api import (
           ALGORITHMS,
           ALL_REDUCE_ALGORITHMS,
           ONE_SHOT_MAX_BYTES,
           OPS,
           all_gather,
           all_reduce,
           all_to_all,
           all_to_all_v,
           broadcast,
           reduce_scatter,
)

__all__ = ["all_gather", "all_reduce", "reduce_scatter", "all_to_all", "all_to_all_v", "broadcast", "device",
           "ALGORITHMS", "ALL_REDUCE_ALGORITHMS", "ONE_SHOT_MAX_BYTES", "OPS"]
