"""Pointer translation and the load/store/get/put/copy family.

A symmetric tensor sits at the same offset in every rank's heap. A pointer into *my* heap
becomes a pointer to the same element in *peer*'s heap by adding the distance between the
two heap bases, as this process maps them::

    peer_ptr = ptr + (heap_bases[peer] - heap_bases[rank])

That is the only per-access work (two scalar loads of ``heap_bases`` and one add). The
distance is added in elements, to a pointer of the original type, so Triton keeps the
contiguity it knows about ``ptr``; heap bases are aligned (``layout.BASE_ALIGN``), which
is promised to the compiler so 16-byte vector accesses survive translation.

Convention for every function here: ``rank`` is the caller's rank, ``peer`` the rank whose
copy is accessed, then ``heap_bases`` (``ctx.heap_bases``). ``peer`` may be a scalar or a
block of ranks with the shape of ``ptr``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .. import config
from .leaves import on_access_fault
from .words import (
    BASE_ALIGN,
    ERR_BAD_PEER,
    ERR_OUT_OF_HEAP,
    ERR_UNREACHABLE,
    ERROR_COUNT,
    ERROR_EXPECTED,
    ERROR_KIND,
    ERROR_OBSERVED,
    ERROR_OFFSET,
    ERROR_PEER,
    ERROR_RANK,
    HEAP_SIZE,
    WINDOW_COUNT,
    WINDOW_RANGES,
    WORLD_SIZE,
)

_DEBUG = tl.constexpr(config.DEBUG)


@triton.jit
def control_block(rank, heap_bases):
    """Pointer (int64 words) to the control block at the start of ``rank``'s heap."""
    return tl.load(heap_bases + rank).to(tl.pointer_type(tl.int64))


@triton.jit
def translate(ptr, rank, peer, heap_bases):
    """Return the address of ``ptr``'s element in ``peer``'s heap.

    Args:
        ptr: pointer (or block of pointers) into the caller's heap.
        rank: the caller's rank.
        peer: the rank whose copy is wanted (scalar, or a block shaped like ``ptr``).
        heap_bases: ``ctx.heap_bases``.

    Returns:
        A pointer of the same type and shape, valid in this process.

    Example::

        remote = trident.translate(x_ptr + offs, rank, peer, heap_bases)
        tl.store(remote, values, mask=offs < n)
    """
    if _DEBUG:
        _check_in_heap(ptr, rank, peer, heap_bases, None)
    return ptr + peer_offset(ptr, rank, peer, heap_bases)


@triton.jit
def peer_offset(ptr, rank, peer, heap_bases):
    """Elements between my heap base and ``peer``'s, with its alignment promised to the compiler."""
    ELEM_BYTES: tl.constexpr = (ptr.dtype.element_ty.primitive_bitwidth + 7) // 8
    if _DEBUG:  # a peer that is no rank must not index heap_bases: translate to myself (the lane is masked)
        peer = tl.where(_peer_exists(peer, rank, heap_bases), peer, rank)
    distance = (tl.load(heap_bases + peer) - tl.load(heap_bases + rank)) // ELEM_BYTES
    IS_SCALAR: tl.constexpr = len(distance.shape) == 0
    if IS_SCALAR:
        distance = tl.multiple_of(distance, BASE_ALIGN // ELEM_BYTES)
    return distance


@triton.jit
def _peer_exists(peer, rank, heap_bases):
    """Debug mode: whether ``peer`` is a rank of this job (0 <= peer < world size)."""
    world_size = tl.load(control_block(rank, heap_bases) + WORLD_SIZE)
    return (peer >= 0) & (peer < world_size)


@triton.jit
def _check_in_heap(ptr, rank, peer, heap_bases, mask):
    """Debug mode: which lanes name an existing peer and stay inside the heap; records the first fault
    (a peer that is no rank before an address outside the heap)."""
    ELEM_BYTES: tl.constexpr = (ptr.dtype.element_ty.primitive_bitwidth + 7) // 8
    base = tl.load(heap_bases + rank)
    ctrl = base.to(tl.pointer_type(tl.int64))
    heap_size = tl.load(ctrl + HEAP_SIZE)
    world_size = tl.load(ctrl + WORLD_SIZE)
    exists = (peer >= 0) & (peer < world_size)
    # A peer in another node is not mapped here: its heap base is 0.
    far = exists & (tl.load(heap_bases + tl.where(exists, peer, rank)) == 0)
    offset = ptr.to(tl.int64) - base
    in_memory = (offset >= 0) & (offset <= heap_size - ELEM_BYTES)
    for w in range(tl.load(ctrl + WINDOW_COUNT)):  # tensors registered with ctx.register
        start = tl.load(ctrl + WINDOW_RANGES + 2 * w)
        end = tl.load(ctrl + WINDOW_RANGES + 2 * w + 1)
        in_memory = in_memory | ((offset >= start) & (offset <= end - ELEM_BYTES))
    inside = in_memory & exists & (far == 0)
    no_peer = exists == 0
    bad = inside == 0
    if mask is not None:
        no_peer = no_peer & mask
        far = far & mask
        bad = bad & mask
    IS_BLOCK: tl.constexpr = len(ptr.shape) > 0
    if IS_BLOCK:
        no_peer = tl.broadcast_to(no_peer, ptr.shape)  # the lanes' shape, when peer is one scalar
        far = tl.broadcast_to(far, ptr.shape)
        any_bad = tl.max(bad.to(tl.int32), axis=None) > 0
        any_no_peer = tl.max(no_peer.to(tl.int32), axis=None) > 0
        any_far = tl.max(far.to(tl.int32), axis=None) > 0
        bad_offset = tl.max(tl.where(bad, offset, -(2**62)), axis=None)
        bad_peer = tl.max(tl.where(no_peer, peer, tl.where(far, peer, tl.where(bad, peer, -(2**31)))), axis=None)
    else:
        any_bad = bad
        any_no_peer = no_peer
        any_far = far
        bad_offset = offset
        bad_peer = peer
    if any_bad:
        kind = tl.where(any_no_peer, ERR_BAD_PEER, tl.where(any_far, ERR_UNREACHABLE, ERR_OUT_OF_HEAP))
        where = tl.where(any_no_peer, 0, bad_offset)
        limit = tl.where(any_no_peer, world_size, heap_size)  # what the peer or offset had to stay below
        on_access_fault(kind, rank, bad_peer, where, limit)
        record_fault(ctrl, kind, rank, bad_peer, where, limit, 0)
    return inside


@triton.jit
def record_fault(ctrl, kind, rank, peer, offset, expected, observed):
    """Write a fault into the control block; only the first fault since the host last looked is kept."""
    first = tl.atomic_add(ctrl + ERROR_COUNT, 1, sem="relaxed", scope="gpu") == 0
    if first:
        tl.store(ctrl + ERROR_KIND, kind)
        tl.store(ctrl + ERROR_RANK, rank)
        tl.store(ctrl + ERROR_PEER, peer)
        tl.store(ctrl + ERROR_OFFSET, offset)
        tl.store(ctrl + ERROR_EXPECTED, expected)
        tl.store(ctrl + ERROR_OBSERVED, observed)


@triton.jit
def heap_mask(ptr, rank, peer, heap_bases, mask):
    """Debug mode: ``mask`` narrowed to the lanes whose address stays inside the heap.

    A lane outside it is reported (first fault wins) and skipped, so a bad index cannot
    corrupt a peer's memory. Call only under ``if DEBUG:`` (it returns a tensor).
    """
    inside = _check_in_heap(ptr, rank, peer, heap_bases, mask)
    if mask is not None:
        inside = inside & mask
    return inside


@triton.jit
def load(ptr, rank, peer, heap_bases, mask=None, other=None):
    """Load ``peer``'s copy of the elements at ``ptr`` (like ``tl.load``).

    Args:
        ptr: pointer (or block of pointers) into the caller's heap.
        rank, peer, heap_bases: see the module docstring.
        mask, other: as in ``tl.load``.

    Returns:
        The loaded block.

    Example::

        x = trident.load(x_ptr + offs, rank, (rank + 1) % world, heap_bases, mask=offs < n)
    """
    remote = ptr + peer_offset(ptr, rank, peer, heap_bases)
    if _DEBUG:
        mask = heap_mask(ptr, rank, peer, heap_bases, mask)
    return tl.load(remote, mask=mask, other=other)


@triton.jit
def store(ptr, value, rank, peer, heap_bases, mask=None):
    """Store ``value`` into ``peer``'s copy of the elements at ``ptr`` (like ``tl.store``).

    Example::

        trident.store(y_ptr + offs, x, rank, peer, heap_bases, mask=offs < n)
    """
    remote = ptr + peer_offset(ptr, rank, peer, heap_bases)
    if _DEBUG:
        mask = heap_mask(ptr, rank, peer, heap_bases, mask)
    tl.store(remote, value, mask=mask)


@triton.jit
def get(src_ptr, dst_ptr, rank, peer, heap_bases, mask=None):
    """Copy ``peer``'s copy of ``src_ptr`` into my ``dst_ptr`` (a pull).

    Example::

        trident.get(x_ptr + offs, y_ptr + offs, rank, peer, heap_bases, mask=offs < n)
    """
    remote = src_ptr + peer_offset(src_ptr, rank, peer, heap_bases)
    if _DEBUG:
        mask = heap_mask(src_ptr, rank, peer, heap_bases, mask)
    tl.store(dst_ptr, tl.load(remote, mask=mask), mask=mask)


@triton.jit
def put(src_ptr, dst_ptr, rank, peer, heap_bases, mask=None):
    """Copy my ``src_ptr`` into ``peer``'s copy of ``dst_ptr`` (a push).

    Example::

        trident.put(x_ptr + offs, y_ptr + offs, rank, peer, heap_bases, mask=offs < n)
    """
    remote = dst_ptr + peer_offset(dst_ptr, rank, peer, heap_bases)
    if _DEBUG:
        mask = heap_mask(dst_ptr, rank, peer, heap_bases, mask)
    tl.store(remote, tl.load(src_ptr, mask=mask), mask=mask)


@triton.jit
def copy(src_ptr, dst_ptr, src_rank, dst_rank, rank, heap_bases, mask=None):
    """Copy ``src_rank``'s copy of ``src_ptr`` into ``dst_rank``'s copy of ``dst_ptr``.

    Both pointers are into the caller's heap; either rank may be the caller's own or a peer.

    Example::

        # rank 0 moves a block from rank 1 to rank 2
        trident.copy(x_ptr + offs, y_ptr + offs, 1, 2, rank, heap_bases, mask=offs < n)
    """
    src = src_ptr + peer_offset(src_ptr, rank, src_rank, heap_bases)
    dst = dst_ptr + peer_offset(dst_ptr, rank, dst_rank, heap_bases)
    if _DEBUG:  # a lane runs only if both of its ends are inside the heap
        mask = heap_mask(dst_ptr, rank, dst_rank, heap_bases, heap_mask(src_ptr, rank, src_rank, heap_bases, mask))
    tl.store(dst, tl.load(src, mask=mask), mask=mask)
