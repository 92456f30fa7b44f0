"""Atomics on a peer's copy of a symmetric tensor.

Each returns the value the memory held before the operation, like ``tl.atomic_*``.

``sem`` orders the atomic against the caller's other memory accesses: ``"relaxed"``,
``"acquire"``, ``"release"`` or ``"acq_rel"`` (the default). ``scope`` says who must
observe that order: ``"cta"`` (threads of one program), ``"gpu"`` (one GPU) or ``"sys"``
(the default: every GPU and the host). A flag another GPU reads needs ``"sys"``: a
``"gpu"``-scoped release is not guaranteed visible to a peer GPU. docs/memory-model.md
explains the choices.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .. import config
from .memory import control_block, heap_mask, peer_offset
from .words import SCRATCH

_DEBUG = tl.constexpr(config.DEBUG)


@triton.jit
def _rmw(OP: tl.constexpr, ptr, val, rank, peer, heap_bases, mask, sem: tl.constexpr, scope: tl.constexpr):
    """One read-modify-write on ``peer``'s copy: translation, the debug-mode bounds mask, the op."""
    remote = ptr + peer_offset(ptr, rank, peer, heap_bases)
    if _DEBUG:
        mask = heap_mask(ptr, rank, peer, heap_bases, mask)
    if OP == "add":
        old = tl.atomic_add(remote, val, mask=mask, sem=sem, scope=scope)
    elif OP == "xchg":
        old = tl.atomic_xchg(remote, val, mask=mask, sem=sem, scope=scope)
    elif OP == "and":
        old = tl.atomic_and(remote, val, mask=mask, sem=sem, scope=scope)
    elif OP == "or":
        old = tl.atomic_or(remote, val, mask=mask, sem=sem, scope=scope)
    elif OP == "xor":
        old = tl.atomic_xor(remote, val, mask=mask, sem=sem, scope=scope)
    elif OP == "min":
        old = tl.atomic_min(remote, val, mask=mask, sem=sem, scope=scope)
    else:
        tl.static_assert(OP == "max", "unknown atomic op")
        old = tl.atomic_max(remote, val, mask=mask, sem=sem, scope=scope)
    return old


@triton.jit
def atomic_add(ptr, val, rank, peer, heap_bases, mask=None, sem: tl.constexpr = tl.constexpr("acq_rel"),
               scope: tl.constexpr = tl.constexpr("sys")):
    """Atomically adds ``val`` at ``peer``'s copy of ``ptr``; returns the old value.

    Example::

        old = trident.atomic_add(counter_ptr, 1, rank, peer, heap_bases, sem="relaxed")
    """
    return _rmw("add", ptr, val, rank, peer, heap_bases, mask, sem, scope)


@triton.jit
def atomic_sub(ptr, val, rank, peer, heap_bases, mask=None, sem: tl.constexpr = tl.constexpr("acq_rel"),
               scope: tl.constexpr = tl.constexpr("sys")):
    """Atomically subtracts ``val`` at ``peer``'s copy of ``ptr``; returns the old value.

    Example::

        old = trident.atomic_sub(counter_ptr, 1, rank, peer, heap_bases, sem="relaxed")
    """
    IS_BF16: tl.constexpr = ptr.dtype.element_ty == tl.bfloat16
    if IS_BF16:
        negated = -tl.cast(val, tl.float32)  # exact; bf16 negation is unsupported by Triton's CPU interpreter
    else:
        negated = -val
    return _rmw("add", ptr, negated, rank, peer, heap_bases, mask, sem, scope)


@triton.jit
def atomic_xchg(ptr, val, rank, peer, heap_bases, mask=None, sem: tl.constexpr = tl.constexpr("acq_rel"),
               scope: tl.constexpr = tl.constexpr("sys")):
    """Atomically swaps in ``val`` at ``peer``'s copy of ``ptr``; returns the old value.

    Example::

        old = trident.atomic_xchg(counter_ptr, 1, rank, peer, heap_bases, sem="relaxed")
    """
    return _rmw("xchg", ptr, val, rank, peer, heap_bases, mask, sem, scope)


@triton.jit
def atomic_and(ptr, val, rank, peer, heap_bases, mask=None, sem: tl.constexpr = tl.constexpr("acq_rel"),
               scope: tl.constexpr = tl.constexpr("sys")):
    """Atomically bitwise-ands ``val`` at ``peer``'s copy of ``ptr``; returns the old value.

    Example::

        old = trident.atomic_and(counter_ptr, 1, rank, peer, heap_bases, sem="relaxed")
    """
    return _rmw("and", ptr, val, rank, peer, heap_bases, mask, sem, scope)


@triton.jit
def atomic_or(ptr, val, rank, peer, heap_bases, mask=None, sem: tl.constexpr = tl.constexpr("acq_rel"),
               scope: tl.constexpr = tl.constexpr("sys")):
    """Atomically bitwise-ors ``val`` at ``peer``'s copy of ``ptr``; returns the old value.

    Example::

        old = trident.atomic_or(counter_ptr, 1, rank, peer, heap_bases, sem="relaxed")
    """
    return _rmw("or", ptr, val, rank, peer, heap_bases, mask, sem, scope)


@triton.jit
def atomic_xor(ptr, val, rank, peer, heap_bases, mask=None, sem: tl.constexpr = tl.constexpr("acq_rel"),
               scope: tl.constexpr = tl.constexpr("sys")):
    """Atomically bitwise-xors ``val`` at ``peer``'s copy of ``ptr``; returns the old value.

    Example::

        old = trident.atomic_xor(counter_ptr, 1, rank, peer, heap_bases, sem="relaxed")
    """
    return _rmw("xor", ptr, val, rank, peer, heap_bases, mask, sem, scope)


@triton.jit
def atomic_min(ptr, val, rank, peer, heap_bases, mask=None, sem: tl.constexpr = tl.constexpr("acq_rel"),
               scope: tl.constexpr = tl.constexpr("sys")):
    """Atomically keeps the minimum with ``val`` at ``peer``'s copy of ``ptr``; returns the old value.

    Example::

        old = trident.atomic_min(counter_ptr, 1, rank, peer, heap_bases, sem="relaxed")
    """
    return _rmw("min", ptr, val, rank, peer, heap_bases, mask, sem, scope)


@triton.jit
def atomic_max(ptr, val, rank, peer, heap_bases, mask=None, sem: tl.constexpr = tl.constexpr("acq_rel"),
               scope: tl.constexpr = tl.constexpr("sys")):
    """Atomically keeps the maximum with ``val`` at ``peer``'s copy of ``ptr``; returns the old value.

    Example::

        old = trident.atomic_max(counter_ptr, 1, rank, peer, heap_bases, sem="relaxed")
    """
    return _rmw("max", ptr, val, rank, peer, heap_bases, mask, sem, scope)


@triton.jit
def atomic_cas(ptr, cmp, val, rank, peer, heap_bases, sem: tl.constexpr = tl.constexpr("acq_rel"),
               scope: tl.constexpr = tl.constexpr("sys")):
    """Atomically store ``val`` at ``peer``'s copy of ``ptr`` if it holds ``cmp``; returns the old value.

    Example::

        old = trident.atomic_cas(lock_ptr, 0, 1, rank, peer, heap_bases, sem="acquire")
        got_lock = old == 0
    """
    remote = ptr + peer_offset(ptr, rank, peer, heap_bases)
    if _DEBUG:
        # tl.atomic_cas takes no mask: send lanes outside the heap to a scratch word instead.
        inside = heap_mask(ptr, rank, peer, heap_bases, None)
        scratch = (control_block(rank, heap_bases) + SCRATCH).to(remote.dtype, bitcast=True)
        remote = tl.where(inside, remote, scratch)
    # Unlike the other atomics, tl.atomic_cas does not convert its operands: match the pointer's type.
    elem = ptr.dtype.element_ty
    return tl.atomic_cas(remote, tl.cast(cmp, elem), tl.cast(val, elem), sem=sem, scope=scope)
