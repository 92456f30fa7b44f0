"""The device barriers as ops of the call pipeline: a repeated ``ctx.device_barrier()`` or
``g.device_barrier()`` replays one recorded launch (:mod:`trident.calls`) instead of taking Triton's
launch path every time (16.6 µs of host time against 7.4 for ``x.add_(1)`` on the H100,
2026-12-06). The kernels are in :mod:`trident.kernels.barrier`.

Example::

    run_call(ctx, WORLD_BARRIER, (ctx.heap_bases,))          # ctx.device_barrier()
    run_call(g, GROUP_BARRIER, (g.barrier_words, g.heap_bases))
"""

from __future__ import annotations

import triton

from ..calls.pipeline import Op
from ..kernels.barrier import device_barrier_kernel, group_barrier_kernel


def _nothing_to_check(team, tensors: tuple, options: tuple) -> None:
    """The team's own tensors: nothing a caller passed."""


def _run_world(team, rec, tensors: tuple, options: tuple) -> None:
    (heap_bases,) = tensors
    rec.launch(device_barrier_kernel, (1,), (team.rank, team.world_size, heap_bases),
               {"WORLD_BLOCK": triton.next_power_of_2(team.world_size)})


def _run_group(team, rec, tensors: tuple, options: tuple) -> None:
    words, heap_bases = tensors
    rec.launch(group_barrier_kernel, (1,), (words, team.rank, team.world_size, heap_bases),
               {"WORLD_BLOCK": triton.next_power_of_2(team.world_size)})


#: The whole world's device barrier, on the control blocks (operand: the context's heap bases).
WORLD_BARRIER = Op("device_barrier", _nothing_to_check, _run_world)
#: A group's device barrier, on the group's own words (operands: those words, the group's heap bases).
GROUP_BARRIER = Op("group_barrier", _nothing_to_check, _run_group)
