"""The device barrier: every rank announces an epoch to every peer, then waits for theirs (launched
through the call pipeline by :mod:`trident.runtime.barrier_ops`)."""

from __future__ import annotations

import triton
import triton.language as tl

from ..device import control_block, sync_ranks
from ..device.words import BARRIER_EPOCH, BARRIER_SLOTS


@triton.jit
def device_barrier_kernel(
    rank, world_size, heap_bases,
    WORLD_BLOCK: tl.constexpr,
):
    """One program. Slot ``r`` of a rank's control block holds the last epoch rank ``r`` announced
    (another rank ``r``: its own slot is not written, :func:`~trident.device.sync_ranks`)."""
    ctrl = control_block(rank, heap_bases)
    epoch = tl.load(ctrl + BARRIER_EPOCH) + 1  # on the device, so graph replays count on
    tl.store(ctrl + BARRIER_EPOCH, epoch)
    sync_ranks(ctrl + BARRIER_SLOTS, epoch, rank, world_size, heap_bases, WORLD_BLOCK)


@triton.jit
def group_barrier_kernel(
    words_ptr,                          # the group's barrier words: an epoch, then one slot per member
    rank, world_size, heap_bases,       # the group's: rank in the group, members, their heap bases
    WORLD_BLOCK: tl.constexpr,
):
    """One program: the device barrier of a group, on the group's own words (never the world's)."""
    epoch = tl.load(words_ptr) + 1
    tl.store(words_ptr, epoch)
    sync_ranks(words_ptr + 1, epoch, rank, world_size, heap_bases, WORLD_BLOCK)
