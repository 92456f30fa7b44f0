"""All-gather + GEMM: ``C = all_gather(A_local) @ B``, the first half of a tensor-parallel MLP.

Each rank holds its row shard ``A_local`` (m x K; tokens split across ranks) and its own B
(K x N; in a TP MLP the rank's column shard of the weight). Every rank computes the whole
``C = [A_0; A_1; ...; A_{W-1}] @ B`` (W*m x N): the activations are gathered while the GEMM runs.

==========================  ========================================================================
``bulk_synchronous``        ``trident.ccl.all_gather`` into a local A, then the matmul
``fused_sequential``        one persistent kernel; each tile reads its rows of A from their owner
``workgroup_specialized``   one kernel: some programs gather A's row blocks, the others multiply,
                            per-block flags between them
``baseline``                torch.distributed.all_gather_into_tensor + torch.matmul
``auto``                    a pattern from :data:`AUTO_TABLE`, else ``baseline``
==========================  ========================================================================
"""

from __future__ import annotations

import torch
import triton

from ..ccl import all_gather
from ..ccl.api import agree_in_debug, input_stage
from . import agg_kernels as kernels
from .common import auto_pattern, check_operands, check_pattern, comm_span, gather_into, split_roles, sync_state
from .matmul import MatmulConfig, launch_matmul, num_programs, pick_config, sm_count

PATTERNS = ("bulk_synchronous", "fused_sequential", "workgroup_specialized", "baseline", "auto")

#: ``auto``'s measured choices, as :data:`trident.ops.AUTO_TABLE` (docs/tensor-parallel-ops.md).
#: Empty until several-GPU runs are recorded: ``auto`` runs ``baseline``.
AUTO_TABLE: dict[tuple[str, int], list[tuple[int, str]]] = {}


def _check(ctx, A_local, B, C, pattern, config, comm_programs) -> None:
    where = f"rank {ctx.rank}: all_gather_gemm"
    check_pattern(ctx, where, pattern, PATTERNS, comm_programs)
    check_operands(ctx, where, config, A_local=A_local, B=B, C=C)
    if A_local.shape[1] != B.shape[0]:
        raise ValueError(f"{where}: K mismatch: A_local is {tuple(A_local.shape)} (M/world_size x K) but B is "
                         f"{tuple(B.shape)} (K x N)")
    want = (ctx.world_size * A_local.shape[0], B.shape[1])
    if tuple(C.shape) != want:
        raise ValueError(f"{where}: C is {tuple(C.shape)}; expected (world_size * A_local rows, N) = {want}")
    # Peers find A_local at my offset: every rank must pass the same heap tensor (or a plain one).
    placement = ctx.heap_offset(A_local) if ctx.is_symmetric(A_local) else "not on the heap"
    agree_in_debug(ctx, "all_gather_gemm", tuple(A_local.shape), tuple(B.shape), A_local.dtype, pattern,
                   f"A_local at heap offset {placement}")


def all_gather_gemm(ctx, A_local: torch.Tensor, B: torch.Tensor, C: torch.Tensor, pattern: str = "auto",
                    config: MatmulConfig | None = None, comm_programs: int | None = None,
                    trace=None) -> torch.Tensor:
    """``C = all_gather(A_local) @ B`` on every rank (A gathered along rows); collective.

    Args:
        ctx: the trident context.
        A_local: ``m x K``, this rank's rows of A (rank r's are rows ``r*m .. r*m + m - 1``);
            float16, bfloat16 or float32 (fp32 accumulation). Used in place when it is symmetric
            (``ctx.empty`` ...), else copied into a heap buffer first (peers read it). Every rank
            passes the same heap tensor, or a plain tensor (checked in debug mode).
        B: ``K x N``, this rank's (any tensor on the device).
        C: ``world_size * m x N`` result, on the device (need not be symmetric).
        pattern: one of :data:`PATTERNS` (see the module docstring); the same on every rank.
        config: a :class:`MatmulConfig` for the GEMM tiles (None: the table's).
        comm_programs: programs that gather in ``workgroup_specialized`` (None: 16 on a GPU, 2 in
            the simulator).
        trace: a ``trident.trace.Trace`` to record per-tile events, or None (``bulk_synchronous``
            records its all-gather as one event, ``baseline`` nothing).

    Returns:
        ``C``, ordered on the current stream. No host synchronization inside (the first call on a
        context allocates the fused ops' flags collectively and runs ``ctx.barrier()``).

    Example::

        A_local = ctx.randn(1024, 4096, dtype=torch.bfloat16)        # my tokens
        C = torch.empty(ctx.world_size * 1024, 2048, dtype=torch.bfloat16, device=ctx.device)
        trident.ops.all_gather_gemm(ctx, A_local, W_up_shard, C)       # every rank's tokens x my columns
    """
    _check(ctx, A_local, B, C, pattern, config, comm_programs)
    m, K = A_local.shape
    N = B.shape[1]
    M = ctx.world_size * m
    if pattern == "auto":
        pattern = auto_pattern(ctx, AUTO_TABLE, M * N * K, shared="fused_sequential")
    if M == 0 or N == 0:
        return C
    if K == 0:
        return C.zero_()
    if pattern == "baseline":
        a_full = torch.empty(M, K, dtype=A_local.dtype, device=ctx.device)
        gather_into(a_full, A_local)
        return torch.matmul(a_full, B, out=C)
    cfg = config or pick_config(M, N, K, A_local.dtype, ctx.backend, sm_count(ctx.device))
    if pattern == "bulk_synchronous":
        a_full = torch.empty(M, K, dtype=A_local.dtype, device=ctx.device)
        with comm_span(trace):
            all_gather(ctx, a_full, A_local)
        launch_matmul(a_full, B, C, cfg, None if trace is None else trace.ptr, ctx.rank)
        return C
    # Peers read A_local: a plain one goes into the collectives' input buffer. It is taken on every
    # rank all the same (whether used or not), so heap allocations stay in step.
    stage = input_stage(ctx, A_local.numel(), A_local.dtype).view(A_local.shape)
    if ctx.is_symmetric(A_local):
        stage = A_local
    else:
        stage.copy_(A_local)
    sync = sync_state(ctx)
    trace_ptr = sync.trace_ptr(trace)
    common = dict(rank=ctx.rank, world_size=ctx.world_size, heap_bases=ctx.heap_bases, BLOCK_M=cfg.BLOCK_M,
                  BLOCK_N=cfg.BLOCK_N, BLOCK_K=cfg.BLOCK_K, GROUP_M=cfg.GROUP_M,
                  WORLD_BLOCK=triton.next_power_of_2(ctx.world_size), TRACE=trace is not None,
                  num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    tiles = ctx.world_size * triton.cdiv(m, cfg.BLOCK_M) * triton.cdiv(N, cfg.BLOCK_N)
    if pattern == "fused_sequential":
        kernels.pull_kernel[(num_programs(ctx.device, tiles, cfg),)](
            stage, B, C, m, N, K, stage.stride(0), stage.stride(1), B.stride(0), B.stride(1), C.stride(0),
            sync.state, sync.ready, sync.arrived, trace_ptr, **common)
        return C
    # workgroup_specialized: the GEMM programs wait for the gather programs of the same launch.
    blocks = ctx.world_size * triton.cdiv(m, cfg.BLOCK_M)
    flags = sync.tile_flags(blocks)
    gemm_programs, comm = split_roles(ctx, cfg, comm_programs, comm_work=blocks, other_work=tiles)
    a_full = torch.empty(M, K, dtype=A_local.dtype, device=ctx.device)
    kernels.gather_gemm_kernel[(comm + gemm_programs,)](
        stage, a_full, B, C, m, N, K, stage.stride(0), stage.stride(1), B.stride(0), B.stride(1), C.stride(0),
        comm, sync.state, sync.ready, sync.arrived, flags, trace_ptr, **common)
    return C
