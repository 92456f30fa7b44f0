"""Tile-level collective building blocks, for use inside your own kernels.

Each works on one tile (a block of pointers into the caller's heap) and takes
``rank, world_size, heap_bases`` like the rest of the device API. Fusing a collective into a
compute kernel is then a loop over tiles calling these, with ``trident.sync_ranks`` around it
(see examples/05_fused_allreduce_rmsnorm.py).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..device import load, store


@triton.jit
def combine(a, b, OP: tl.constexpr):
    """``a + b``, ``max(a, b)`` or ``min(a, b)`` for OP = "sum", "max", "min" (a constexpr).

    Example::

        acc = combine(acc, theirs.to(tl.float32), "max")
    """
    if OP == "sum":
        out = a + b
    elif OP == "max":
        out = tl.maximum(a, b)
    else:
        tl.static_assert(OP == "min", "OP must be 'sum', 'max' or 'min'")
        out = tl.minimum(a, b)
    return out


@triton.jit
def shifted(ptr, shift, peer):
    """``ptr`` moved by ``shift[peer]`` elements, or ``ptr`` itself when ``shift`` is None.

    ``shift`` (one int64 per rank) describes tensors that lie at different heap offsets on
    different ranks: ``shift[p]`` is how many elements rank p's copy lies after mine.

    Example::

        value = trident.load(shifted(x_ptr, shift, peer) + offs, rank, peer, heap_bases, mask=mask)
    """
    if shift is None:
        moved = ptr
    else:
        moved = ptr + tl.sum(tl.where(tl.arange(0, shift.shape[0]) == peer, shift, 0))
    return moved


@triton.jit
def reduce_tile(ptr,
                rank, world_size, heap_bases,
                mask, OP: tl.constexpr, ACC: tl.constexpr, shift=None):
    """Every rank's copy of the tile at ``ptr``, combined with OP in dtype ACC.

    Ranks start with their own copy and then read their peers in a rotated order, so that at a
    given moment different ranks read different peers. Pass ``shift`` (see :func:`shifted`) when
    the ranks' copies lie at different heap offsets.

    Example::

        total = reduce_tile(x_ptr + offs, rank, world_size, heap_bases, offs < n, "sum", tl.float32)
    """
    acc = tl.load(ptr, mask=mask, other=0).to(ACC)
    for i in range(1, world_size):
        peer = (rank + i) % world_size
        theirs = load(shifted(ptr, shift, peer), rank, peer, heap_bases, mask=mask, other=0)
        acc = combine(acc, theirs.to(ACC), OP)
    return acc


@triton.jit
def broadcast_tile(ptr, value,
                   rank, world_size, heap_bases,
                   mask):
    """Store ``value`` into every rank's copy of the tile at ``ptr`` (this rank's included).

    Example::

        broadcast_tile(out_ptr + offs, result, rank, world_size, heap_bases, offs < n)
    """
    for i in range(world_size):
        store(ptr, value, rank, (rank + i) % world_size, heap_bases, mask=mask)
