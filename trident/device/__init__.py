"""The device API: ``@triton.jit`` functions to call inside your kernels.

Every function takes the caller's ``rank``, then the ``peer`` whose copy of a symmetric
tensor it touches, then ``heap_bases`` (``ctx.heap_bases``). They are re-exported as
``trident.load``, ``trident.store``, ... .
"""

from .atomics import (
    atomic_add,
    atomic_and,
    atomic_cas,
    atomic_max,
    atomic_min,
    atomic_or,
    atomic_sub,
    atomic_xchg,
    atomic_xor,
)
from .memory import control_block, copy, get, load, put, store, translate
from .sync import arrival_ticket, signal, signal_peers, sync_ranks, wait

__all__ = [
    "arrival_ticket",
    "translate", "load", "store", "get", "put", "copy",
    "atomic_add", "atomic_sub", "atomic_xchg", "atomic_and", "atomic_or", "atomic_xor",
    "atomic_min", "atomic_max", "atomic_cas",
    "signal", "signal_peers", "wait", "sync_ranks", "control_block",
]
