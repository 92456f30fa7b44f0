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
import triton

from ..ccl import all_reduce
from ..ccl.api import input_stage
from ..runtime.groups import team
from ..runtime.resources import GrowingBuffer
from . import gemm_all_reduce_kernels as kernels
from . import multinode
from .call_cache import call_key, recall, remember
from .fused_call import FusedCall, OpSpec, check_fused_operands, check_pattern, comm_span, prepare_call, split_roles
from .matmul import MatmulConfig, launch_matmul, num_programs, operands
from .torch_baselines import no_multicast

#: ``auto``'s measured choices (docs/tensor-parallel-ops.md). Empty until several-GPU runs are
#: recorded: ``auto`` runs ``baseline`` (``fused_sequential`` where ranks share a GPU).
AUTO_TABLE: dict[tuple[str, int], list[tuple[int, str]]] = {}
#: Reducer programs of ``workgroup_specialized`` on a GPU, when not given.
GPU_COMM_PROGRAMS = 16
#: Elements one program of :func:`~trident.ops.gemm_reduce_scatter_kernels.reduce_slots_kernel` sums at a time.
REDUCE_BLOCK = 1024


def _check_gemm_all_reduce_args(ctx, A, B, C, pattern, config, comm_programs) -> None:
    """Every argument problem, raised before anything runs (the message names the rank)."""
    where = f"rank {ctx.rank}: gemm_all_reduce"
    check_pattern(ctx, where, pattern, GEMM_ALL_REDUCE, comm_programs)
    check_fused_operands(ctx, where, config, A=A, B=B, C=C)
    if A.shape[1] != B.shape[0]:
        raise ValueError(f"{where}: K mismatch: A is {tuple(A.shape)} (M x K_local) but B is {tuple(B.shape)} "
                         f"(K_local x N)")
    want = (A.shape[0], B.shape[1])
    if tuple(C.shape) != want:
        raise ValueError(f"{where}: C is {tuple(C.shape)}; expected (M, N) = {want}")
    ctx.agree_in_debug("gemm_all_reduce", tuple(A.shape), tuple(B.shape), A.dtype, pattern)


def _slots(call: FusedCall) -> torch.Tensor:
    """W slots of ``M x N`` (one ``W x M x N`` heap buffer, kept and grown per context): rank s
    stores its partial product into every rank's ``slots[s]``."""
    M, N = call.A.shape[0], call.B.shape[1]
    W = call.ctx.world_size
    buffer = call.ctx.resource("ops.gemm_all_reduce.slots", lambda: GrowingBuffer(call.ctx))
    return buffer.view(W * M * N, call.A.dtype).view(W, M, N)


def _bulk_synchronous(call: FusedCall) -> None:
    """The matmul into the collectives' input buffer, then ``trident.ccl.all_reduce`` and a copy into C."""
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
        all_reduce(ctx, partial)
    call.C.copy_(partial)


def _fused_sequential(call: FusedCall) -> None:
    """One kernel pushes every partial tile into every rank's slot; a local kernel sums my slots."""
    A, B, C, ctx, cfg = call.A, call.B, call.C, call.ctx, call.cfg
    M, K = A.shape
    N = B.shape[1]
    slots = _slots(call)
    sync = call.sync()
    a, b, use_tma = operands(A, B, cfg) if K else (A, B, False)
    tiles = triton.cdiv(M, cfg.BLOCK_M) * triton.cdiv(N, cfg.BLOCK_N)
    kernels.push_all_kernel[(num_programs(ctx.platform, tiles, cfg),)](
        a, b, slots,
        M, N, K,
        A.stride(0), A.stride(1), B.stride(0), B.stride(1),
        sync, call.trace_ptr,
        ctx.rank, ctx.world_size, ctx.heap_bases,
        BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N, BLOCK_K=cfg.BLOCK_K, GROUP_M=cfg.GROUP_M,
        USE_TMA=use_tma, WORLD_BLOCK=call.world_block,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    programs = max(1, min(triton.cdiv(M * N, REDUCE_BLOCK), 4 * ctx.platform.sm_count))
    kernels.reduce_slots_kernel[(programs,)](slots, C, M, N, ctx.world_size, BLOCK=REDUCE_BLOCK, num_warps=4)


def _workgroup_specialized(call: FusedCall) -> None:
    """One kernel: GEMM programs push tiles to every rank and flag them there, reducer programs sum C's tiles."""
    A, B, C, ctx, cfg = call.A, call.B, call.C, call.ctx, call.cfg
    M, K = A.shape
    N = B.shape[1]
    slots = _slots(call)
    a, b, use_tma = operands(A, B, cfg) if K else (A, B, False)
    tiles = triton.cdiv(M, cfg.BLOCK_M) * triton.cdiv(N, cfg.BLOCK_N)  # my tiles, and each peer's
    sync = call.sync(flags=ctx.world_size * tiles)
    # The reducers wait for the GEMM programs of every rank's launch.
    gemm_programs, comm = split_roles(call, comm_work=tiles, other_work=tiles)
    kernels.push_all_reduce_kernel[(gemm_programs + comm,)](
        a, b, slots, C,
        M, N, K,
        A.stride(0), A.stride(1), B.stride(0), B.stride(1),
        gemm_programs,
        sync, call.trace_ptr,
        ctx.rank, ctx.world_size, ctx.heap_bases,
        BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N, BLOCK_K=cfg.BLOCK_K, GROUP_M=cfg.GROUP_M,
        USE_TMA=use_tma, WORLD_BLOCK=call.world_block,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)


def _baseline(call: FusedCall) -> None:
    """torch.matmul into C, then torch.distributed's all-reduce of C."""
    no_multicast()
    torch.matmul(call.A, call.B, out=call.C)
    dist.all_reduce(call.C)


#: The op: its patterns, ``auto`` table and communication programs.
GEMM_ALL_REDUCE = OpSpec(
    name="gemm_all_reduce",
    patterns={"bulk_synchronous": _bulk_synchronous, "fused_sequential": _fused_sequential,
              "workgroup_specialized": _workgroup_specialized, "baseline": _baseline},
    auto_table=AUTO_TABLE,
    gpu_comm_programs=lambda world_size: GPU_COMM_PROGRAMS)
#: Every value of ``pattern``.
PATTERNS = GEMM_ALL_REDUCE.pattern_names


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
    ctx = team(ctx, group)  # the whole world, or a group of ctx.new_group
    if ctx.spans_nodes:  # several nodes: see trident.ops.multinode
        return multinode.gemm_all_reduce(ctx, A, B, C, pattern=pattern, config=config,
                                             comm_programs=comm_programs, trace=trace)
    key = call_key(ctx, GEMM_ALL_REDUCE, A, B, C, pattern, config, comm_programs, trace)
    call = recall(ctx, key, A, B, C)
    if call is None:  # the first call with this key: check everything, then decide
        _check_gemm_all_reduce_args(ctx, A, B, C, pattern, config, comm_programs)
    M, K = A.shape
    N = B.shape[1]
    if call is None:
        call = prepare_call(ctx, GEMM_ALL_REDUCE, pattern, A, B, C, gemm=(M, N, K), size=M * N * K,
                            config=config, comm_programs=comm_programs, trace=trace)
        remember(ctx, key, call)
    if M == 0 or N == 0:
        return C
    call.run()  # K == 0 too: every pattern sums zero partials (the collective still runs on every rank)
    return C
