"""GEMM + all-scatter: ``C = A @ [B_0 | B_1 | ... | B_{W-1}]`` on every rank, in five patterns.

Each rank holds A (M x K, the same everywhere) and its column shard ``B_local`` (K x N/W); it
computes its column block ``C[:, r*N/W:(r+1)*N/W] = A @ B_local`` and stores it into every rank's
``C``. The patterns differ in how computing and communicating overlap (docs/gemm-all-scatter.md):

==========================  ========================================================================
``bulk_synchronous``        the matmul kernel, then an all-scatter kernel (after the whole GEMM)
``producer_consumer``       the GEMM on this stream, the all-scatter on a second stream at the same
                            time (SMs split), per-tile flags between them
``fused_sequential``        one persistent kernel; each tile is stored into every rank as computed
``workgroup_specialized``   one kernel whose programs are split into GEMM and communication roles,
                            per-tile flags between them
``baseline``                torch.matmul + torch.distributed.all_gather_into_tensor + layout fix
``auto``                    a pattern from :data:`AUTO_TABLE`, else ``baseline``
==========================  ========================================================================
"""

from __future__ import annotations

import contextlib

import torch
import triton

from ..ccl.api import agree_in_debug
from . import gas_kernels as kernels
from .common import auto_pattern, check_operands, check_pattern, gather_into, split_roles, sync_state
from .matmul import MatmulConfig, launch_matmul, operands, pick_config, sm_count

PATTERNS = ("bulk_synchronous", "producer_consumer", "fused_sequential", "workgroup_specialized", "baseline", "auto")

#: ``auto``'s measured choices: (GPU name, world size) -> [(minimum M*N*K, pattern), ...], largest
#: first. Only figures measured on that many GPUs of that kind belong here (docs/gemm-all-scatter.md);
#: where nothing applies ``auto`` runs ``baseline``. Empty until multi-GPU runs are recorded.
AUTO_TABLE: dict[tuple[str, int], list[tuple[int, str]]] = {}


def _check(ctx, A, B_local, C, pattern, config, comm_programs) -> None:
    """Every argument problem, raised before anything runs (the message names the rank)."""
    where = f"rank {ctx.rank}: gemm_all_scatter"
    check_pattern(ctx, where, pattern, PATTERNS, comm_programs)
    check_operands(ctx, where, config, ("C",), A=A, B_local=B_local, C=C)
    if A.shape[1] != B_local.shape[0]:
        raise ValueError(f"{where}: K mismatch: A is {tuple(A.shape)} (M x K) but B_local is "
                         f"{tuple(B_local.shape)} (K x N/world_size)")
    w = ctx.world_size
    if C.shape[0] != A.shape[0] or C.shape[1] % w or C.shape[1] // w != B_local.shape[1]:
        raise ValueError(f"{where}: C is {tuple(C.shape)}; expected (M, world_size * N_local) = "
                         f"({A.shape[0]}, {w} * {B_local.shape[1]}): N must be divisible by world_size {w} and "
                         f"every rank's B_local must hold N / world_size columns")
    # Peers store into C at my offset: every rank must pass the same heap tensor.
    agree_in_debug(ctx, "gemm_all_scatter", tuple(A.shape), tuple(B_local.shape), A.dtype, pattern,
                   f"C at heap offset {ctx.heap_offset(C)}")


def choose_pattern(ctx, M: int, N: int, K: int) -> str:
    """What ``pattern="auto"`` runs for an ``M x N x K`` product (N: all ranks' columns).

    The first :data:`AUTO_TABLE` entry for this GPU and world size whose size threshold ``M*N*K``
    reaches (:func:`~trident.ops.common.table_choice`); else ``baseline``. With ranks sharing a
    GPU (NCCL cannot run there) it is ``fused_sequential``, a correctness setting only.

    Example::

        trident.ops.choose_pattern(ctx, 8192, 4608, 36864)   # 'baseline' until measured otherwise
    """
    return auto_pattern(ctx, AUTO_TABLE, M * N * K, shared="fused_sequential")


def default_comm_programs(ctx) -> int:
    """Communication programs of ``producer_consumer`` / ``workgroup_specialized`` when not given.

    On a GPU 16 at 8 ranks, in proportion to the ``world_size - 1`` peers every tile is stored
    into (1 at one rank, where there is nothing to send, 3 at two, 7 at four): SMs given to
    communication are taken from the GEMM. 2 in the simulator, whose programs run one by one.

    Example::

        default_comm_programs(ctx)   # 16 on 8 GPUs
    """
    if ctx.device.type != "cuda":
        return 2
    return max(1, -(-16 * (ctx.world_size - 1) // 7))


def _baseline(ctx, A, B_local, C) -> None:
    local = torch.matmul(A, B_local)
    gathered = torch.empty((ctx.world_size * local.shape[0], local.shape[1]), dtype=local.dtype, device=local.device)
    gather_into(gathered, local)
    blocks = gathered.view(ctx.world_size, *local.shape)  # rank r's block is blocks[r]; C wants them side by side
    C.view(C.shape[0], ctx.world_size, -1).copy_(blocks.permute(1, 0, 2))


def gemm_all_scatter(ctx, A: torch.Tensor, B_local: torch.Tensor, C: torch.Tensor, pattern: str = "auto",
                     config: MatmulConfig | None = None, comm_programs: int | None = None, trace=None) -> torch.Tensor:
    """``C = A @ B`` on every rank, where rank r holds B's column block r; collective.

    Args:
        ctx: the trident context.
        A: ``M x K``, the same on every rank; float16, bfloat16 or float32 (fp32 accumulation).
        B_local: ``K x N/world_size``, this rank's column block of B.
        C: ``M x N``, symmetric (``ctx.empty``); receives every rank's block.
        pattern: one of :data:`PATTERNS` (see the module docstring); the same on every rank.
        config: a :class:`MatmulConfig` for the GEMM tiles (None: the table's, as for ``matmul``).
        comm_programs: programs that communicate in ``producer_consumer`` and
            ``workgroup_specialized`` (None: :func:`default_comm_programs`; at most one per tile,
            and at least one program is left for the GEMM).
        trace: a ``trident.trace.Trace`` to record per-tile compute/communication/wait events, or None.

    Returns:
        ``C``. Ordered on the current stream: work queued after the call sees the complete ``C``.
        No host synchronization inside (except once: the first call on a context allocates the
        patterns' flags on the heap, collectively, and runs ``ctx.barrier()``); per-call epochs on
        the device keep repeated calls correct.

    Example::

        C = ctx.empty(M, N, dtype=torch.bfloat16)
        trident.ops.gemm_all_scatter(ctx, A, B_local, C, pattern="fused_sequential")
    """
    _check(ctx, A, B_local, C, pattern, config, comm_programs)
    M, K = A.shape
    n_local = B_local.shape[1]
    if pattern == "auto":
        pattern = choose_pattern(ctx, M, C.shape[1], K)
    if M == 0 or n_local == 0:
        return C
    if pattern == "baseline" or K == 0:
        if K == 0:
            C.zero_()
        else:
            _baseline(ctx, A, B_local, C)
        return C
    sms = sm_count(ctx.device)
    cfg = config or pick_config(M, n_local, K, A.dtype, ctx.backend, sms)
    sync = sync_state(ctx)
    block = C[:, ctx.rank * n_local:(ctx.rank + 1) * n_local]  # my column block: same offsets on every rank
    tiles = triton.cdiv(M, cfg.BLOCK_M) * triton.cdiv(n_local, cfg.BLOCK_N)
    flags = sync.tile_flags(tiles)
    trace_ptr = sync.trace_ptr(trace)
    programs = cfg.programs or sms
    # The GEMM / communication split of producer_consumer and workgroup_specialized (all programs
    # of both resident at once on a GPU: one side waits for the other).
    gemm_programs, comm = split_roles(ctx, cfg, comm_programs or default_comm_programs(ctx), comm_work=tiles,
                                      other_work=tiles)
    common = dict(rank=ctx.rank, heap_bases=ctx.heap_bases, BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N,
                  GROUP_M=cfg.GROUP_M, TRACE=trace is not None)
    world = dict(world_size=ctx.world_size, WORLD_BLOCK=triton.next_power_of_2(ctx.world_size))
    launch = dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    a, b, use_tma = operands(A, B_local, cfg)
    gemm_args = (a, b, block, M, n_local, K, A.stride(0), A.stride(1), B_local.stride(0), B_local.stride(1),
                 block.stride(0))
    if pattern == "bulk_synchronous":
        launch_matmul(A, B_local, block, cfg, None if trace is None else trace_ptr, ctx.rank)
        kernels.scatter_kernel[(max(1, min(tiles, programs)),)](
            block, M, n_local, block.stride(0), sync.state, sync.ready, sync.arrived, flags, trace_ptr,
            WAIT_FLAGS=False, **common, **world, num_warps=cfg.num_warps)
    elif pattern == "fused_sequential":
        kernels.fused_sequential_kernel[(max(1, min(tiles, programs)),)](
            *gemm_args, sync.state, sync.ready, sync.arrived, trace_ptr, BLOCK_K=cfg.BLOCK_K, USE_TMA=use_tma,
            **common, **world, **launch)
    elif pattern == "workgroup_specialized":
        kernels.workgroup_specialized_kernel[(gemm_programs + comm,)](
            *gemm_args, gemm_programs, sync.state, sync.ready, sync.arrived, flags, trace_ptr, BLOCK_K=cfg.BLOCK_K,
            USE_TMA=use_tma, **common, **world, **launch)
    else:  # producer_consumer
        side = sync.side_stream
        if side is not None:
            # The scatter stream waits for what came before this call, not for the GEMM launched
            # next: the two kernels then run side by side (the simulator runs them one after another).
            side.wait_stream(torch.cuda.current_stream(ctx.device))
        kernels.producer_kernel[(gemm_programs,)](*gemm_args, sync.state, flags, trace_ptr, BLOCK_K=cfg.BLOCK_K,
                                                  USE_TMA=use_tma, **common, **launch)
        with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
            kernels.scatter_kernel[(comm,)](
                block, M, n_local, block.stride(0), sync.state, sync.ready, sync.arrived, flags, trace_ptr,
                WAIT_FLAGS=True, **common, **world, num_warps=cfg.num_warps)
        if side is not None:
            torch.cuda.current_stream(ctx.device).wait_stream(side)  # (the scatter touches heap memory only)
    return C

