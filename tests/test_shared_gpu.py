"""Ranks sharing a GPU (issue 34, finding 5): where NCCL cannot run (``ctx.platform.nccl_usable``
is False), the default torch.distributed group trident makes serves cuda tensors through gloo,
instead of failing with NCCL's "Duplicate GPU detected". The GPU suite runs 2-4 ranks on one GPU;
in the simulator the group is gloo and the tensors are CPU tensors.
"""

import torch
import torch.distributed as dist

from tests.conftest import get_pool


def _default_group_collectives(ctx):
    t = torch.full((4,), float(ctx.rank + 1), device=ctx.device)
    dist.all_reduce(t)  # the default group, on this rank's device
    gathered = [torch.empty(2, device=ctx.device) for _ in range(ctx.world_size)]
    dist.all_gather(gathered, torch.full((2,), float(ctx.rank), device=ctx.device))
    return ctx.platform.nccl_usable, str(dist.get_backend_config()), t.tolist(), [g.tolist() for g in gathered]


def test_the_default_group_runs_device_tensors_where_nccl_cannot_run():
    for usable, config, summed, gathered in get_pool(2).run(_default_group_collectives):
        assert ("nccl" in config) == usable, f"default group {config!r} with nccl_usable={usable}"
        assert summed == [3.0] * 4
        assert gathered == [[0.0, 0.0], [1.0, 1.0]]
