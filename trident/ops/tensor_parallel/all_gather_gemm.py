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

from ...calls import Op, run_call
from ...ccl import all_gather
from ...ccl.api import input_stage
from ...runtime.groups import team
from ..fused import multinode
from ..fused.baselines import gather_into
from ..fused.call import FusedCall, OpSpec, check_gemm_call, comm_span, fused_op, split_roles
from ..gemm.matmul import MatmulConfig, b_operand, launch_matmul, num_programs
from . import all_gather_gemm_kernels as kernels

#: ``auto``'s measured choices, as :data:`trident.ops.AUTO_TABLE` (docs/tensor-parallel-ops.md), from
#: ``python -m trident.bench.auto_table``. One H200, one rank: ``fused_sequential`` was the fastest at
#: both default shapes, 1-4% ahead of ``baseline`` (``trident bench all-gather-gemm -n 1``,
#: docs/results/h200-2026-12-03b/all_gather_gemm.json). One H100, one rank: ``fused_sequential`` too,
#: 2-7% ahead of ``baseline`` (docs/results/h100-2026-12-05/all_gather_gemm_1). No several-GPU run
#: yet: there ``baseline``.
AUTO_TABLE: dict[tuple[str, int], list[tuple[int, str]]] = {("H200", 1): [(0, "fused_sequential")],
                                                            ("H100", 1): [(0, "fused_sequential")]}
#: Programs that gather in ``workgroup_specialized`` on a GPU, when not given.
GPU_COMM_PROGRAMS = 16
#: A plain A_local up to this size is staged onto the heap by the fused kernel itself, larger ones by
#: a copy kernel ahead of it. One H100, one rank, 2026-12-06 (`trident bench latency -n 1`): staged in
#: the kernel, the 64^3 call issues in 11.5 us instead of 23.2 (device 10.9 us against 10.3), but
#: the 4096^3 call took 255.5 us of device time against 215.0: the GEMM's programs copy 4096-element
#: chunks with latency-bound loads, where a copy kernel streams at full bandwidth. Where the copy is
#: small the launch it saves is what costs.
STAGE_IN_KERNEL_MAX_BYTES = 1 << 20


def _check_all_gather_gemm_args(ctx, A_local, B, C, pattern, config, comm_programs) -> None:
    """Every argument problem, raised before anything runs (the message names the rank)."""
    where = check_gemm_call(ctx, ALL_GATHER_GEMM, pattern, config, comm_programs, ("M/world_size x K", "K x N"),
                            A_local=A_local, B=B, C=C)
    want = (ctx.world_size * A_local.shape[0], B.shape[1])
    if tuple(C.shape) != want:
        raise ValueError(f"{where}: C is {tuple(C.shape)}; expected (world_size * A_local rows, N) = {want}")
    # Peers find A_local at my offset: every rank must pass the same heap tensor (or a plain one).
    placement = ctx.heap_offset(A_local) if ctx.is_symmetric(A_local) else "not on the heap"
    ctx.agree_in_debug("all_gather_gemm", tuple(A_local.shape), tuple(B.shape), A_local.dtype, pattern,
                       f"A_local at heap offset {placement}")


def _full_a(call: FusedCall) -> torch.Tensor:
    """A local ``world_size * m x K`` tensor for the gathered A."""
    m, K = call.A.shape
    return torch.empty(call.ctx.world_size * m, K, dtype=call.A.dtype, device=call.ctx.device)


def _staged_a_local(call: FusedCall) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(a_local, source)``: A_local where peers read it and what the kernel stages it from. A symmetric
    A_local is used in place (``source`` None). A plain one goes into the collectives' input buffer:
    up to :data:`STAGE_IN_KERNEL_MAX_BYTES` the fused kernel copies it itself (``source`` is it),
    beyond, a copy ahead of the kernel does (``source`` None). The buffer is taken on every rank all
    the same (used or not), so heap allocations stay in step."""
    A_local, ctx = call.A, call.ctx
    stage = input_stage(ctx, A_local.numel(), A_local.dtype).view(A_local.shape)
    if ctx.is_symmetric(A_local):
        return A_local, None
    if A_local.numel() * A_local.element_size() <= STAGE_IN_KERNEL_MAX_BYTES:
        return stage, A_local
    return call.copy(stage, A_local), None


def _bulk_synchronous(call: FusedCall) -> None:
    """``trident.ccl.all_gather`` into a local A, then the matmul."""
    a_full = _full_a(call)
    with comm_span(call.trace):
        all_gather(call.ctx, a_full, call.A)
    launch_matmul(a_full, call.B, call.C, call.cfg, call.trace_ptr, call.ctx.rank)


def _row_blocks(call: FusedCall, a_local: torch.Tensor) -> int:
    """The gathered A's row blocks (of ``BLOCK_M`` rows); C has as many rows of tiles."""
    return call.ctx.world_size * triton.cdiv(a_local.shape[0], call.cfg.BLOCK_M)


def _sizes(call: FusedCall, a_local: torch.Tensor) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The kernels' size arguments: ``(m, N, K)`` and A_local's, B's and C's strides."""
    (m, K), B, C = a_local.shape, call.B, call.C
    return (m, B.shape[1], K), (a_local.stride(0), a_local.stride(1), B.stride(0), B.stride(1), C.stride(0))


def _fused_sequential(call: FusedCall) -> None:
    """One persistent kernel; each tile reads its rows of A from their owner."""
    ctx, cfg = call.ctx, call.cfg
    a_local, source = _staged_a_local(call)
    tiles = _row_blocks(call, a_local) * triton.cdiv(call.B.shape[1], cfg.BLOCK_N)
    b, b_tma = b_operand(call.B, cfg)
    call.launch_gemm(kernels.pull_kernel, (num_programs(ctx.platform, tiles, cfg),), (
        a_local, source, b, call.C, *_sizes(call, a_local),
        call.sync(), call.trace_ptr,
        ctx.rank, ctx.world_size, ctx.heap_bases,
    ), tile_as_tuple=True, B_TMA=b_tma)


def _workgroup_specialized(call: FusedCall) -> None:
    """One kernel: gather programs copy the peers' row blocks of A and flag them, the others multiply
    (my own rows read in place)."""
    ctx, cfg = call.ctx, call.cfg
    a_local, source = _staged_a_local(call)
    blocks = _row_blocks(call, a_local)  # a flag each
    tiles = blocks * triton.cdiv(call.B.shape[1], cfg.BLOCK_N)
    sync = call.sync(flags=blocks)
    # The GEMM programs wait for the gather programs of the same launch; alone, nothing is gathered.
    peer_blocks = blocks * (ctx.world_size - 1) // ctx.world_size
    gemm_programs, comm = split_roles(call, comm_work=peer_blocks, other_work=tiles)
    a_full = _full_a(call)
    call.own(a_full)
    b, b_tma = b_operand(call.B, cfg)
    call.launch_gemm(kernels.gather_gemm_kernel, (comm + gemm_programs,), (
        a_local, source, a_full, b, call.C, *_sizes(call, a_local),
        comm,
        sync, call.trace_ptr,
        ctx.rank, ctx.world_size, ctx.heap_bases,
    ), tile_as_tuple=True, B_TMA=b_tma)


def _baseline(call: FusedCall) -> None:
    """torch.distributed's all-gather, then torch.matmul."""
    a_full = _full_a(call)
    gather_into(a_full, call.A)
    torch.matmul(a_full, call.B, out=call.C)


def _extra_bytes(pattern: str, shape: tuple[int, int, int], world_size: int, element_size: int) -> int | None:
    """Bytes a pattern moves on one rank beyond its GEMM (``shape``: C's M x N and K; A_local is
    M/W x K): ``bulk_synchronous`` gathers all of A into a local buffer (each row read and written
    once, its own rows too), ``workgroup_specialized`` copies the peers' rows only, and
    ``fused_sequential`` reads peers' rows in place, in its K loop (A_local on the heap: a plain
    one is staged first, ``2 M/W K`` bytes more)."""
    M, _, K = shape
    rows = {"bulk_synchronous": M, "workgroup_specialized": M - M // world_size, "fused_sequential": 0}.get(pattern)
    return None if rows is None else 2 * rows * K * element_size


#: The op: its patterns, ``auto`` table and communication programs.
ALL_GATHER_GEMM = OpSpec(
    name="all_gather_gemm",
    patterns={"bulk_synchronous": _bulk_synchronous, "fused_sequential": _fused_sequential,
              "workgroup_specialized": _workgroup_specialized, "baseline": _baseline},
    auto_table=AUTO_TABLE,
    gpu_comm_programs=lambda world_size: GPU_COMM_PROGRAMS,
    replayable=frozenset({"fused_sequential", "workgroup_specialized"}),
    zero_when_k_is_zero=True,
    extra_bytes=_extra_bytes)
#: Every value of ``pattern``.
PATTERNS = ALL_GATHER_GEMM.pattern_names


def _shape(team, A_local, B, C):
    (m, K), N = A_local.shape, B.shape[1]
    M = team.world_size * m
    return (M, N, K), M * N * K, M == 0 or N == 0


#: The op as the call pipeline runs it.
ALL_GATHER_GEMM_OP: Op = fused_op(
    ALL_GATHER_GEMM, lambda team, *args: _check_all_gather_gemm_args(team, *args), _shape,
    across_nodes=multinode.all_gather_gemm)


def all_gather_gemm(ctx, A_local: torch.Tensor, B: torch.Tensor, C: torch.Tensor, pattern: str = "auto",
                    config: MatmulConfig | None = None, comm_programs: int | None = None,
                    trace=None, group=None) -> torch.Tensor:
    """``C = all_gather(A_local) @ B`` on every rank (A gathered along rows); collective.

    Args:
        ctx: the trident context.
        A_local: ``m x K``, this rank's rows of A (rank r's are rows ``r*m .. r*m + m - 1``);
            float16, bfloat16 or float32 (fp32 accumulation). Used in place when it is symmetric
            (``ctx.empty`` ...), else copied into a heap buffer (peers read it): by the fused kernel
            itself up to :data:`STAGE_IN_KERNEL_MAX_BYTES`, by a copy kernel ahead of it beyond. Every rank
            passes the same heap tensor, or a plain tensor (checked in debug mode).
        B: ``K x N``, this rank's (any tensor on the device).
        C: ``world_size * m x N`` result, on the device (need not be symmetric).
        pattern: one of :data:`PATTERNS` (see the module docstring); the same on every rank.
        config: a :class:`MatmulConfig` for the GEMM tiles (None: the table's).
        comm_programs: programs that gather in ``workgroup_specialized`` (None:
            :data:`GPU_COMM_PROGRAMS` on a GPU, 2 in the simulator).
        trace: a ``trident.trace.Trace`` to record per-tile events, or None (``bulk_synchronous``
            records its all-gather as one event, ``baseline`` nothing).

    Returns:
        ``C``, ordered on the current stream. No host synchronization inside (the fused ops' sync
        block is made, or grown, collectively with device barriers:
        :func:`~trident.ops.fused.sync.sync_block`).

    Example::

        A_local = ctx.randn(1024, 4096, dtype=torch.bfloat16)        # my tokens
        C = torch.empty(ctx.world_size * 1024, 2048, dtype=torch.bfloat16, device=ctx.device)
        trident.ops.all_gather_gemm(ctx, A_local, W_up_shard, C)       # every rank's tokens x my columns
    """
    run_call(team(ctx, group), ALL_GATHER_GEMM_OP, (A_local, B, C), (pattern, config, comm_programs, trace))
    return C
