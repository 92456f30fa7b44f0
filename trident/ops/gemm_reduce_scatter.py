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
from ..ccl.api import input_stage
from ..runtime.groups import team
from ..runtime.resources import GrowingBuffer
from . import gemm_reduce_scatter_kernels as kernels
from . import multinode
from .call_cache import call_key, recall, remember
from .fused_call import FusedCall, OpSpec, check_fused_operands, check_pattern, comm_span, prepare_call, split_roles
from .matmul import MatmulConfig, launch_matmul, num_programs, operands
from .torch_baselines import reduce_scatter_into

#: ``auto``'s measured choices, as :data:`trident.ops.AUTO_TABLE` (docs/tensor-parallel-ops.md).
#: Empty until several-GPU runs are recorded: ``auto`` runs ``baseline``.
AUTO_TABLE: dict[tuple[str, int], list[tuple[int, str]]] = {}
#: Reducer programs of ``workgroup_specialized`` on a GPU, when not given.
GPU_COMM_PROGRAMS = 16
#: Elements one program of :func:`~trident.ops.gemm_reduce_scatter_kernels.reduce_slots_kernel` sums at a time.
REDUCE_BLOCK = 1024


def _check_gemm_reduce_scatter_args(ctx, A, B, C, pattern, config, comm_programs) -> None:
    """Every argument problem, raised before anything runs (the message names the rank)."""
    where = f"rank {ctx.rank}: gemm_reduce_scatter"
    check_pattern(ctx, where, pattern, GEMM_REDUCE_SCATTER, comm_programs)
    check_fused_operands(ctx, where, config, A=A, B=B, C=C)
    if A.shape[1] != B.shape[0]:
        raise ValueError(f"{where}: K mismatch: A is {tuple(A.shape)} (M x K_local) but B is {tuple(B.shape)} "
                         f"(K_local x N)")
    w = ctx.world_size
    if A.shape[0] % w:
        raise ValueError(f"{where}: A has {A.shape[0]} rows; M must be divisible by world_size {w}")
    want = (A.shape[0] // w, B.shape[1])
    if tuple(C.shape) != want:
        raise ValueError(f"{where}: C is {tuple(C.shape)}; expected (M / world_size, N) = {want}")
    ctx.agree_in_debug("gemm_reduce_scatter", tuple(A.shape), tuple(B.shape), A.dtype, pattern)


def _slots(call: FusedCall) -> torch.Tensor:
    """W slots of ``m x N`` (one ``M x N`` heap buffer, kept and grown per context): rank s stores
    its partial of my rows into my ``slots[s]``."""
    M, N = call.A.shape[0], call.B.shape[1]
    buffer = call.ctx.resource("ops.gemm_reduce_scatter.slots", lambda: GrowingBuffer(call.ctx))
    return buffer.view(M * N, call.A.dtype).view(M, N)


def _bulk_synchronous(call: FusedCall) -> None:
    """The matmul into the collectives' input buffer, then ``trident.ccl.reduce_scatter``."""
    A, B, ctx = call.A, call.B, call.ctx
    M, K = A.shape
    N = B.shape[1]
    # The partial product goes straight into the collectives' input buffer: no second copy on the heap.
    partial = input_stage(ctx, M * N, A.dtype).view(M, N)
    if K:
        launch_matmul(A, B, partial, call.cfg, call.trace_ptr, ctx.rank)
    else:
        partial.zero_()
    with comm_span(call.trace):
        reduce_scatter(ctx, call.C, partial)


def _fused_sequential(call: FusedCall) -> None:
    """One kernel pushes every partial tile into its owner's slot; a local kernel sums my slots."""
    A, B, C, ctx, cfg = call.A, call.B, call.C, call.ctx, call.cfg
    M, K = A.shape
    N = B.shape[1]
    m = M // ctx.world_size
    slots = _slots(call)
    sync = call.sync()
    a, b, use_tma = operands(A, B, cfg) if K else (A, B, False)
    tiles = ctx.world_size * triton.cdiv(m, cfg.BLOCK_M) * triton.cdiv(N, cfg.BLOCK_N)
    kernels.push_kernel[(num_programs(ctx.platform, tiles, cfg),)](
        a, b, slots,
        m, N, K,
        A.stride(0), A.stride(1), B.stride(0), B.stride(1),
        sync, call.trace_ptr,
        ctx.rank, ctx.world_size, ctx.heap_bases,
        BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N, BLOCK_K=cfg.BLOCK_K, GROUP_M=cfg.GROUP_M,
        USE_TMA=use_tma, WORLD_BLOCK=call.world_block,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    programs = max(1, min(triton.cdiv(m * N, REDUCE_BLOCK), 4 * ctx.platform.sm_count))
    kernels.reduce_slots_kernel[(programs,)](slots, C, m, N, ctx.world_size, BLOCK=REDUCE_BLOCK, num_warps=4)


def _workgroup_specialized(call: FusedCall) -> None:
    """One kernel: GEMM programs push tiles and flag them at the owner, reducer programs sum my tiles."""
    A, B, C, ctx, cfg = call.A, call.B, call.C, call.ctx, call.cfg
    M, K = A.shape
    N = B.shape[1]
    m = M // ctx.world_size
    slots = _slots(call)
    a, b, use_tma = operands(A, B, cfg) if K else (A, B, False)
    per_shard = triton.cdiv(m, cfg.BLOCK_M) * triton.cdiv(N, cfg.BLOCK_N)  # my tiles, and each peer's of me
    tiles = ctx.world_size * per_shard
    sync = call.sync(flags=tiles)
    # The reducers wait for the GEMM programs of every rank's launch.
    gemm_programs, comm = split_roles(call, comm_work=per_shard, other_work=tiles)
    kernels.push_reduce_kernel[(gemm_programs + comm,)](
        a, b, slots, C,
        m, N, K,
        A.stride(0), A.stride(1), B.stride(0), B.stride(1),
        gemm_programs,
        sync, call.trace_ptr,
        ctx.rank, ctx.world_size, ctx.heap_bases,
        BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N, BLOCK_K=cfg.BLOCK_K, GROUP_M=cfg.GROUP_M,
        USE_TMA=use_tma, WORLD_BLOCK=call.world_block,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)


def _baseline(call: FusedCall) -> None:
    """torch.matmul, then torch.distributed's reduce-scatter."""
    reduce_scatter_into(call.C, torch.matmul(call.A, call.B))


#: The op: its patterns, ``auto`` table and communication programs.
GEMM_REDUCE_SCATTER = OpSpec(
    name="gemm_reduce_scatter",
    patterns={"bulk_synchronous": _bulk_synchronous, "fused_sequential": _fused_sequential,
              "workgroup_specialized": _workgroup_specialized, "baseline": _baseline},
    auto_table=AUTO_TABLE,
    gpu_comm_programs=lambda world_size: GPU_COMM_PROGRAMS)
#: Every value of ``pattern``.
PATTERNS = GEMM_REDUCE_SCATTER.pattern_names


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
    ctx = team(ctx, group)  # the whole world, or a group of ctx.new_group
    if ctx.spans_nodes:  # several nodes: see trident.ops.multinode
        return multinode.gemm_reduce_scatter(ctx, A, B, C, pattern=pattern, config=config,
                                             comm_programs=comm_programs, trace=trace)
    key = call_key(ctx, GEMM_REDUCE_SCATTER, A, B, C, pattern, config, comm_programs, trace)
    call = recall(ctx, key, A, B, C)
    if call is None:  # the first call with this key: check everything, then decide
        _check_gemm_reduce_scatter_args(ctx, A, B, C, pattern, config, comm_programs)
    M, K = A.shape
    N = B.shape[1]
    m = M // ctx.world_size
    if call is None:
        call = prepare_call(ctx, GEMM_REDUCE_SCATTER, pattern, A, B, C, gemm=(M, N, K), size=M * N * K,
                            config=config, comm_programs=comm_programs, trace=trace)
        remember(ctx, key, call)
    if m == 0 or N == 0:
        return C
    call.run()  # K == 0 too: every pattern sums zero partials (the collective still runs on every rank)
    return C
