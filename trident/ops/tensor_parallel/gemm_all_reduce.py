"""GEMM + all-reduce: ``C = all_reduce(A @ B)``, a row-parallel linear layer whose output every rank keeps.

Each rank holds A (M x K_local: the activations' columns of its shard) and B (K_local x N: its
row shard of the weight); ``A @ B`` is a partial sum of the whole M x N result, and every rank
ends with the sum in C (M x N), as ``torch.distributed.all_reduce`` of the partial products
would give. Decode (M of 1 to 256) is the case that matters most.

==========================  ========================================================================
``bulk_synchronous``        the matmul into the collectives' input buffer, then ``trident.ccl.all_reduce``
``fused_sequential``        one persistent kernel stores each partial tile into every rank's slot of
                            this rank; a small local kernel then sums the W partials
``workgroup_specialized``   one kernel: GEMM programs push tiles to every rank and flag them there,
                            reducer programs sum each tile once all ranks have flagged it
``baseline``                torch.matmul + torch.distributed.all_reduce
``auto``                    a pattern from :data:`AUTO_TABLE`, else ``baseline``
==========================  ========================================================================

The fused patterns are one-shot: each rank sends its whole partial product to every peer
((W - 1) x M x N elements out per rank), and each rank sums W partials locally. A two-shot
scheme (reduce an owned row range, then broadcast it) halves the traffic at large W and M, but
adds a second dependent round of waits: for decode, whose products are a few hundred KB, one
round of latency is what counts (as ``trident.ccl.all_reduce`` picks one-shot below
``ONE_SHOT_MAX_BYTES``). Prefill-sized products are better served by ``bulk_synchronous``, whose
all-reduce goes two-shot above that size.

fp16 and bf16 partials travel in their dtype and are summed in fp32 (NCCL sums in the dtype).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ...calls import Op, run_call
from ...ccl import all_reduce
from ...runtime.groups import team
from ..fused import multinode
from ..fused.call import FusedCall, comm_span, fused_op
from ..gemm.matmul import MatmulConfig
from .gemm_reduce import GPU_COMM_PROGRAMS as GPU_COMM_PROGRAMS  # the op's default, documented here too
from .gemm_reduce import check_partial_product_args, partial_product, partial_product_spec

#: ``auto``'s measured choices (docs/tensor-parallel-ops.md). Empty until several-GPU runs are
#: recorded: ``auto`` runs ``baseline`` (``fused_sequential`` where ranks share a GPU).
AUTO_TABLE: dict[tuple[str, int], list[tuple[int, str]]] = {}


def _bulk_synchronous(call: FusedCall) -> None:
    """The matmul into the collectives' input buffer, then ``trident.ccl.all_reduce`` and a copy into C."""
    partial = partial_product(call)
    with comm_span(call.trace):
        all_reduce(call.ctx, partial)
    call.C.copy_(partial)


def _baseline(call: FusedCall) -> None:
    """torch.matmul into C, then torch.distributed's all-reduce of C."""
    torch.matmul(call.A, call.B, out=call.C)
    dist.all_reduce(call.C)


def _collective_elements(M: int, N: int, world_size: int) -> int:
    """What ``bulk_synchronous`` reads and writes after the matmul: its one-shot all-reduce reads
    every rank's partial and writes the sum (a two-shot one about as much), then the copy into C."""
    return (world_size + 1) * M * N + 2 * M * N


#: The op: its patterns (the fused ones push every partial tile to every rank), ``auto`` table and
#: communication programs.
GEMM_ALL_REDUCE = partial_product_spec("gemm_all_reduce", _bulk_synchronous, _baseline, AUTO_TABLE, to_every_rank=True,
                                       collective_elements=_collective_elements)
#: Every value of ``pattern``.
PATTERNS = GEMM_ALL_REDUCE.pattern_names


def _check(team, A, B, C, pattern, config, comm_programs) -> None:
    check_partial_product_args(team, GEMM_ALL_REDUCE, A, B, C, pattern, config, comm_programs, rows_per_rank=False)


def _shape(team, A, B, C):
    (M, K), N = A.shape, B.shape[1]
    return (M, N, K), M * N * K, M == 0 or N == 0  # K == 0: every pattern sums zero partials


#: The op as the call pipeline runs it.
GEMM_ALL_REDUCE_OP: Op = fused_op(GEMM_ALL_REDUCE, _check, _shape, across_nodes=multinode.gemm_all_reduce)


def gemm_all_reduce(ctx, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor, pattern: str = "auto",
                    config: MatmulConfig | None = None, comm_programs: int | None = None,
                    trace=None, group=None) -> torch.Tensor:
    """``C = sum over ranks of A @ B``, on every rank; collective.

    Args:
        ctx: the trident context.
        A: ``M x K_local``, this rank's shard of the activations along K; float16, bfloat16 or float32.
        B: ``K_local x N``, this rank's rows of the weight, the same dtype.
        C: ``M x N`` result, on the device (need not be symmetric), the same dtype.
        pattern: one of :data:`PATTERNS` (see the module docstring); the same on every rank.
        config: a :class:`MatmulConfig` for the GEMM tiles (None: the table's).
        comm_programs: reducer programs in ``workgroup_specialized`` (None: :data:`GPU_COMM_PROGRAMS`
            on a GPU, 2 in the simulator).
        trace: a ``trident.trace.Trace`` to record per-tile events, or None (``bulk_synchronous``
            records its all-reduce as one event, ``baseline`` nothing).

    Returns:
        ``C``, ordered on the current stream. The fused patterns keep a ``world_size x M x N``
        staging buffer on the heap (reused across calls); the first call allocates it collectively.

    Example::

        C = torch.empty(M, N, dtype=torch.bfloat16, device=ctx.device)
        trident.ops.gemm_all_reduce(ctx, hidden_shard, W_out_shard, C)
    """
    run_call(team(ctx, group), GEMM_ALL_REDUCE_OP, (A, B, C), (pattern, config, comm_programs, trace))
    return C
