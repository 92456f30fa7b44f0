"""The device barrier: every rank announces an epoch to every peer, then waits for theirs."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..device import control_block, sync_ranks
from ..device.words import BARRIER_EPOCH, BARRIER_SLOTS


@triton.jit
def device_barrier_kernel(
    rank, world_size, heap_bases,
    WORLD_BLOCK: tl.constexpr,
):
    """One program. Slot ``r`` of a rank's control block holds the last epoch rank ``r`` announced."""
    ctrl = control_block(rank, heap_bases)
    epoch = tl.load(ctrl + BARRIER_EPOCH) + 1  # on the device, so graph replays count on
    tl.store(ctrl + BARRIER_EPOCH, epoch)
    sync_ranks(ctrl + BARRIER_SLOTS, epoch, rank, world_size, heap_bases, WORLD_BLOCK)


def launch_device_barrier(heap_bases: torch.Tensor, rank: int, world_size: int) -> None:
    """Launch the barrier kernel on the current stream (``ctx.device_barrier()`` calls it).

    Args:
        heap_bases: every rank's heap base (``ctx.heap_bases``).
        rank, world_size: this rank and the job's size.

    Example::

        launch_device_barrier(ctx.heap_bases, ctx.rank, ctx.world_size)
    """
    device_barrier_kernel[(1,)](rank, world_size, heap_bases, WORLD_BLOCK=triton.next_power_of_2(world_size))


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


def launch_group_barrier(words: torch.Tensor, heap_bases: torch.Tensor, rank: int, world_size: int) -> None:
    """Launch a group's device barrier on the current stream (``Group.device_barrier()`` calls it).

    Args:
        words: the group's barrier words (int64, symmetric: the same offset on every member).
        heap_bases, rank, world_size: the group's.

    Example::

        launch_group_barrier(g._barrier, g.heap_bases, g.rank, g.world_size)
    """
    group_barrier_kernel[(1,)](words, rank, world_size, heap_bases, WORLD_BLOCK=triton.next_power_of_2(world_size))
