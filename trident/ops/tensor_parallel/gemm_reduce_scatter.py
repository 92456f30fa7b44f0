"""GEMM + reduce-scatter: ``C = reduce_scatter(A @ B)``, the second half of a tensor-parallel MLP.

Each rank holds A (M x K_local: the activations' columns of its shard) and B (K_local x N: its
row shard of the weight); ``A @ B`` is a partial sum of the whole M x N result. Summed across
ranks, rank r keeps rows ``r*m .. r*m + m - 1`` (m = M / world_size) in C (m x N), as
``torch.distributed.reduce_scatter_tensor`` of the partial products would give.

==========================  ========================================================================
``bulk_synchronous``        the matmul into a heap buffer, then ``trident.ccl.reduce_scatter``
``fused_sequential``        one persistent kernel stores each partial tile straight into its owner;
                            a small local kernel then sums the W partials
``workgroup_specialized``   one kernel: GEMM programs push tiles and flag them at the owner, the
                            owner's reducer programs sum each tile once all ranks have flagged it
``baseline``                torch.matmul + torch.distributed.reduce_scatter_tensor
``auto``                    a pattern from :data:`AUTO_TABLE`, else ``baseline``
==========================  ========================================================================

fp16 and bf16 partials travel in their dtype and are summed in fp32 (NCCL sums in the dtype).
"""

from __future__ import annotations

import torch

from ...calls import Op, run_call
from ...ccl import reduce_scatter
from ...runtime.groups import team
from ..fused import multinode
from ..fused.baselines import reduce_scatter_into
from ..fused.call import FusedCall, comm_span, fused_op
from ..gemm.matmul import MatmulConfig
from .gemm_reduce import GPU_COMM_PROGRAMS as GPU_COMM_PROGRAMS  # the op's default, documented here too
from .gemm_reduce import check_partial_product_args, partial_product, partial_product_spec

#: ``auto``'s measured choices, as :data:`trident.ops.AUTO_TABLE` (docs/tensor-parallel-ops.md), from
#: ``python -m trident.bench.auto_table``. One H200, one rank: ``baseline`` was the fastest at both
#: default shapes (``trident bench gemm-reduce-scatter -n 1``, docs/results/h200-2026-12-03b, before the
#: fused patterns stopped writing their own partial to a slot on 2026-12-05: to be measured again).
#: One H100, one rank, after that change: ``fused_sequential``, 5-11% ahead of ``baseline``
#: (docs/results/h100-2026-12-05/gemm_reduce_scatter_1). No several-GPU run yet: there ``baseline``.
AUTO_TABLE: dict[tuple[str, int], list[tuple[int, str]]] = {("H200", 1): [(0, "baseline")],
                                                            ("H100", 1): [(0, "fused_sequential")]}


def _bulk_synchronous(call: FusedCall) -> None:
    """The matmul into the collectives' input buffer, then ``trident.ccl.reduce_scatter``."""
    partial = partial_product(call)
    with comm_span(call.trace):
        reduce_scatter(call.ctx, call.C, partial)


def _baseline(call: FusedCall) -> None:
    """torch.matmul, then torch.distributed's reduce-scatter."""
    reduce_scatter_into(call.C, torch.matmul(call.A, call.B))


def _collective_elements(M: int, N: int, world_size: int) -> int:
    """What ``bulk_synchronous``'s reduce-scatter reads and writes after the matmul: every rank's
    partial of my rows (all M x N of the partials, over the W ranks), then my M/W rows of C."""
    return M * N + M // world_size * N


#: The op: its patterns (the fused ones push each partial tile to the rank that keeps its rows),
#: ``auto`` table and communication programs.
GEMM_REDUCE_SCATTER = partial_product_spec("gemm_reduce_scatter", _bulk_synchronous, _baseline, AUTO_TABLE,
                                           to_every_rank=False, collective_elements=_collective_elements)
#: Every value of ``pattern``.
PATTERNS = GEMM_REDUCE_SCATTER.pattern_names


def _check(team, A, B, C, pattern, config, comm_programs) -> None:
    check_partial_product_args(team, GEMM_REDUCE_SCATTER, A, B, C, pattern, config, comm_programs,
                               rows_per_rank=True)


def _shape(team, A, B, C):
    (M, K), N = A.shape, B.shape[1]
    return (M, N, K), M * N * K, M // team.world_size == 0 or N == 0  # K == 0: the partials sum to zero


#: The op as the call pipeline runs it.
GEMM_REDUCE_SCATTER_OP: Op = fused_op(GEMM_REDUCE_SCATTER, _check, _shape, across_nodes=multinode.gemm_reduce_scatter)


def gemm_reduce_scatter(ctx, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor, pattern: str = "auto",
                        config: MatmulConfig | None = None, comm_programs: int | None = None,
                        trace=None, group=None) -> torch.Tensor:
    """``C = (sum over ranks of A @ B)[my rows]``; collective.

    Args:
        ctx: the trident context.
        A: ``M x K_local`` (M divisible by the world size); float16, bfloat16 or float32.
        B: ``K_local x N``, the same dtype.
        C: ``M / world_size x N`` result, on the device (need not be symmetric).
        pattern: one of :data:`PATTERNS` (see the module docstring); the same on every rank.
        config: a :class:`MatmulConfig` for the GEMM tiles (None: the table's).
        comm_programs: reducer programs in ``workgroup_specialized`` (None: :data:`GPU_COMM_PROGRAMS`
            on a GPU, 2 in the simulator).
        trace: a ``trident.trace.Trace`` to record per-tile events, or None (``bulk_synchronous``
            records its reduce-scatter as one event, ``baseline`` nothing).

    Returns:
        ``C``, ordered on the current stream. The fused patterns keep an ``M x N`` staging buffer
        on the heap (reused across calls); the first call allocates it collectively.

    Example::

        C = torch.empty(M // ctx.world_size, N, dtype=torch.bfloat16, device=ctx.device)
        trident.ops.gemm_reduce_scatter(ctx, hidden_shard, W_down_shard, C)
    """
    run_call(team(ctx, group), GEMM_REDUCE_SCATTER_OP, (A, B, C), (pattern, config, comm_programs, trace))
    return C
