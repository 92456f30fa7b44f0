"""The torch + NCCL side of the ``baseline`` patterns: torch.distributed's collectives, called safely.

Example::

    gathered = torch.empty(world_size * m, K, dtype=A_local.dtype, device=A_local.device)
    gather_into(gathered, A_local)
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def gather_into(out: torch.Tensor, inp: torch.Tensor) -> None:
    """torch.distributed's all-gather along dim 0 (``all_gather_into_tensor``, renamed in torch 2.13).

    Example::

        gather_into(torch.empty(world_size * 4, 8, device="cuda"), torch.randn(4, 8, device="cuda"))
    """
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(out, inp)


def reduce_scatter_into(out: torch.Tensor, inp: torch.Tensor) -> None:
    """torch.distributed's sum reduce-scatter along dim 0 (``reduce_scatter_tensor``).

    Example::

        reduce_scatter_into(torch.empty(4, 8, device="cuda"), torch.randn(world_size * 4, 8, device="cuda"))
    """
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    scatter(out, inp)
