"""The torch + NCCL side of the ``baseline`` patterns: torch.distributed's collectives, called safely.

Example::

    gathered = torch.empty(world_size * m, K, dtype=A_local.dtype, device=A_local.device)
    gather_into(gathered, A_local)
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist


def no_multicast() -> None:
    """Never NVLink multicast (NVLS) in the baselines: it can take a shared host's GPUs out of service.
    NCCL reads this when it creates its communicator, at the first NCCL collective.

    Example::

        no_multicast()
        dist.all_reduce(x)
    """
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")


def gather_into(out: torch.Tensor, inp: torch.Tensor) -> None:
    """torch.distributed's all-gather along dim 0 (``all_gather_into_tensor``, renamed in torch 2.13).

    Example::

        gather_into(torch.empty(world_size * 4, 8, device="cuda"), torch.randn(4, 8, device="cuda"))
    """
    no_multicast()
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(out, inp)


def reduce_scatter_into(out: torch.Tensor, inp: torch.Tensor) -> None:
    """torch.distributed's sum reduce-scatter along dim 0 (``reduce_scatter_tensor``).

    Example::

        reduce_scatter_into(torch.empty(4, 8, device="cuda"), torch.randn(world_size * 4, 8, device="cuda"))
    """
    no_multicast()
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    scatter(out, inp)
