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
import triton

from ..ccl import reduce_scatter
from ..ccl.api import agree_in_debug, input_stage
from ..ccl.workspace import workspace
from . import grs_kernels as kernels
from .common import auto_pattern, check_operands, check_pattern, comm_span, reduce_scatter_into, split_roles, sync_state
from .matmul import MatmulConfig, launch_matmul, num_programs, operands, pick_config, sm_count

PATTERNS = ("bulk_synchronous", "fused_sequential", "workgroup_specialized", "baseline", "auto")

#: ``auto``'s measured choices, as :data:`trident.ops.AUTO_TABLE` (docs/tensor-parallel-ops.md).
#: Empty until several-GPU runs are recorded: ``auto`` runs ``baseline``.
AUTO_TABLE: dict[tuple[str, int], list[tuple[int, str]]] = {}


def _check(ctx, A, B, C, pattern, config, comm_programs) -> None:
    where = f"rank {ctx.rank}: gemm_reduce_scatter"
    check_pattern(ctx, where, pattern, PATTERNS, comm_programs)
    check_operands(ctx, where, config, A=A, B=B, C=C)
    if A.shape[1] != B.shape[0]:
        raise ValueError(f"{where}: K mismatch: A is {tuple(A.shape)} (M x K_local) but B is {tuple(B.shape)} "
                         f"(K_local x N)")
    w = ctx.world_size
    if A.shape[0] % w:
        raise ValueError(f"{where}: A has {A.shape[0]} rows; M must be divisible by world_size {w}")
    want = (A.shape[0] // w, B.shape[1])
    if tuple(C.shape) != want:
        raise ValueError(f"{where}: C is {tuple(C.shape)}; expected (M / world_size, N) = {want}")
    agree_in_debug(ctx, "gemm_reduce_scatter", tuple(A.shape), tuple(B.shape), A.dtype, pattern)


def gemm_reduce_scatter(ctx, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor, pattern: str = "auto",
                        config: MatmulConfig | None = None, comm_programs: int | None = None,
                        trace=None) -> torch.Tensor:
    """``C = (sum over ranks of A @ B)[my rows]``; collective.

    Args:
        ctx: the trident context.
        A: ``M x K_local`` (M divisible by the world size); float16, bfloat16 or float32.
        B: ``K_local x N``, the same dtype.
        C: ``M / world_size x N`` result, on the device (need not be symmetric).
        pattern: one of :data:`PATTERNS` (see the module docstring); the same on every rank.
        config: a :class:`MatmulConfig` for the GEMM tiles (None: the table's).
        comm_programs: reducer programs in ``workgroup_specialized`` (None: 16 on a GPU, 2 in the
            simulator).
        trace: a ``trident.trace.Trace`` to record per-tile events, or None (``bulk_synchronous``
            records its reduce-scatter as one event, ``baseline`` nothing).

    Returns:
        ``C``, ordered on the current stream. The fused patterns keep an ``M x N`` staging buffer
        on the heap (reused across calls); the first call allocates it collectively.

    Example::

        C = torch.empty(M // ctx.world_size, N, dtype=torch.bfloat16, device=ctx.device)
        trident.ops.gemm_reduce_scatter(ctx, hidden_shard, W_down_shard, C)
    """
    _check(ctx, A, B, C, pattern, config, comm_programs)
    M, K = A.shape
    N = B.shape[1]
    m = M // ctx.world_size
    if pattern == "auto":
        pattern = auto_pattern(ctx, AUTO_TABLE, M * N * K, shared="fused_sequential")
    if m == 0 or N == 0:
        return C
    if pattern == "baseline":
        reduce_scatter_into(C, torch.matmul(A, B))
        return C
    cfg = config or pick_config(M, N, K, A.dtype, ctx.backend, sm_count(ctx.device))
    if pattern == "bulk_synchronous":
        # The partial product goes straight into the collectives' input buffer: no second copy on the heap.
        partial = input_stage(ctx, M * N, A.dtype).view(M, N)
        if K:
            launch_matmul(A, B, partial, cfg, None if trace is None else trace.ptr, ctx.rank)
        else:
            partial.zero_()
        with comm_span(trace):
            reduce_scatter(ctx, C, partial)
        return C
    # W slots of m x N: rank s stores its partial of my rows into my slots[s].
    slots = workspace(ctx).buffer("gemm_reduce_scatter.slots", M * N, A.dtype).view(M, N)
    sync = sync_state(ctx)
    trace_ptr = sync.trace_ptr(trace)
    a, b, use_tma = operands(A, B, cfg) if K else (A, B, False)
    common = dict(rank=ctx.rank, world_size=ctx.world_size, heap_bases=ctx.heap_bases, BLOCK_M=cfg.BLOCK_M,
                  BLOCK_N=cfg.BLOCK_N, BLOCK_K=cfg.BLOCK_K, GROUP_M=cfg.GROUP_M, USE_TMA=use_tma,
                  WORLD_BLOCK=triton.next_power_of_2(ctx.world_size), TRACE=trace is not None,
                  num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    gemm_args = (a, b, slots, m, N, K, A.stride(0), A.stride(1), B.stride(0), B.stride(1))
    per_shard = triton.cdiv(m, cfg.BLOCK_M) * triton.cdiv(N, cfg.BLOCK_N)  # my tiles, and each peer's of me
    tiles = ctx.world_size * per_shard
    if pattern == "fused_sequential":
        sms = sm_count(ctx.device)
        kernels.push_kernel[(num_programs(ctx.device, tiles, cfg),)](
            *gemm_args, sync.state, sync.ready, sync.arrived, trace_ptr, **common)
        block = 1024
        kernels.reduce_slots_kernel[(max(1, min(triton.cdiv(m * N, block), 4 * sms)),)](
            slots, C, m, N, ctx.world_size, BLOCK=block, num_warps=4)
        return C
    # workgroup_specialized: the reducers wait for the GEMM programs of every rank's launch.
    flags = sync.tile_flags(tiles)
    gemm_programs, comm = split_roles(ctx, cfg, comm_programs, comm_work=per_shard, other_work=tiles)
    kernels.push_reduce_kernel[(gemm_programs + comm,)](
        *gemm_args, C, gemm_programs, sync.state, sync.ready, sync.arrived, flags, trace_ptr, **common)
    return C
