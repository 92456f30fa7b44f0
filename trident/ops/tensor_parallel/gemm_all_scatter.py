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

from ...calls import run_call
from ...runtime.groups import team
from ..fused import multinode
from ..fused.baselines import gather_into
from ..fused.call import FusedCall, OpSpec, check_gemm_call, fused_op, split_roles
from ..gemm.matmul import MatmulConfig, launch_matmul, num_programs, operands
from . import gemm_all_scatter_kernels as kernels

#: ``auto``'s measured choices: (GPU name, world size) -> [(minimum M*N*K, pattern), ...], largest
#: first. Only figures measured on that many GPUs of that kind belong here (docs/gemm-all-scatter.md);
#: where nothing applies ``auto`` runs ``baseline``. One H200, one rank: ``bulk_synchronous`` was the
#: fastest pattern or within 0.5% of it at all four default shapes, 2-19% ahead of ``baseline``
#: (``trident bench gemm-all-scatter -n 1``, docs/results/h200-2026-12-04/gas_1.json). One H100, one
#: rank, since the consumers send tiles in row chunks (docs/results/h100-2026-12-07e): ``fused_sequential``
#: the fastest or within 0.6% of it on the four default shapes (``bulk_synchronous`` 2.7% behind at
#: 8192x3584x14336), ``producer_consumer`` 0.2% ahead of it on the largest.
AUTO_TABLE: dict[tuple[str, int], list[tuple[int, str]]] = {
    ("H200", 1): [(0, "bulk_synchronous")],
    ("H100", 1): [(8192 * 4608 * 36864, "producer_consumer"), (0, "fused_sequential")],  # h100-2026-12-07e
}


def gpu_comm_programs(world_size: int) -> int:
    """Communication programs of ``producer_consumer`` / ``workgroup_specialized`` on a GPU, when
    not given: 16 at 8 ranks, in proportion to the ``world_size - 1`` peers every tile is stored
    into (1 at one rank, where there is nothing to send, 3 at two, 7 at four): SMs given to
    communication are taken from the GEMM.

    Example::

        gpu_comm_programs(8)   # 16
    """
    return max(1, -(-16 * (world_size - 1) // 7))


def _check_gemm_all_scatter_args(ctx, A, B_local, C, pattern, config, comm_programs) -> None:
    """Every argument problem, raised before anything runs (the message names the rank)."""
    where = check_gemm_call(ctx, GEMM_ALL_SCATTER, pattern, config, comm_programs, ("M x K", "K x N/world_size"),
                            ("C",), A=A, B_local=B_local, C=C)
    w = ctx.world_size
    if C.shape[0] != A.shape[0] or C.shape[1] % w or C.shape[1] // w != B_local.shape[1]:
        raise ValueError(f"{where}: C is {tuple(C.shape)}; expected (M, world_size * N_local) = "
                         f"({A.shape[0]}, {w} * {B_local.shape[1]}): N must be divisible by world_size {w} and "
                         f"every rank's B_local must hold N / world_size columns")
    # Peers store into C at my offset: every rank must pass the same heap tensor.
    ctx.agree_in_debug("gemm_all_scatter", tuple(A.shape), tuple(B_local.shape), A.dtype, pattern,
                       f"C at heap offset {ctx.heap_offset(C)}")


class _Block:
    """This rank's part of a call: its column block of C, the block's sizes and tiles."""

    def __init__(self, call: FusedCall):
        self.M, self.K = call.A.shape
        self.n = call.B.shape[1]
        rank = call.ctx.rank
        self.block = call.C[:, rank * self.n:(rank + 1) * self.n]  # my column block: same offsets on every rank
        self.tiles = triton.cdiv(self.M, call.cfg.BLOCK_M) * triton.cdiv(self.n, call.cfg.BLOCK_N)

    def gemm_args(self, call: FusedCall) -> tuple[tuple, bool]:
        """``(args, use_tma)``: the GEMM kernels' leading arguments (A and B as :func:`operands` gives
        them, my block of C, its sizes and the three strides) and their ``USE_TMA``."""
        a, b, use_tma = operands(call.A, call.B, call.cfg)
        return (a, b, self.block, (self.M, self.n, self.K),
                (call.A.stride(0), call.A.stride(1), call.B.stride(0), call.B.stride(1), self.block.stride(0))), use_tma


def _scatter(call: FusedCall, s: _Block, sync: torch.Tensor, programs: int, wait_flags: bool) -> None:
    """The all-scatter kernel on ``programs`` programs (after the GEMM, or alongside it with ``wait_flags``)."""
    cfg, ctx = call.cfg, call.ctx
    call.launch(kernels.scatter_kernel, (programs,), (
        s.block,
        s.M, s.n, s.block.stride(0),
        sync, call.trace_ptr,
        ctx.rank, ctx.world_size, ctx.heap_bases,
    ), dict(BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N, GROUP_M=cfg.GROUP_M, WORLD_BLOCK=call.world_block,
            WAIT_FLAGS=wait_flags), num_warps=cfg.num_warps)


def _bulk_synchronous(call: FusedCall) -> None:
    """The matmul into my column block, then the all-scatter kernel."""
    s = _Block(call)
    sync = call.sync()
    launch_matmul(call.A, call.B, s.block, call.cfg, call.trace_ptr, call.ctx.rank, call.rec)
    _scatter(call, s, sync, num_programs(call.ctx.platform, s.tiles, call.cfg), wait_flags=False)


def _fused_sequential(call: FusedCall) -> None:
    """One persistent kernel: every tile into every rank's C as it is computed."""
    s, ctx = _Block(call), call.ctx
    args, use_tma = s.gemm_args(call)
    call.launch_gemm(kernels.fused_sequential_kernel, (num_programs(ctx.platform, s.tiles, call.cfg),), (
        *args,
        call.sync(), call.trace_ptr,
        ctx.rank, ctx.world_size, ctx.heap_bases,
    ), USE_TMA=use_tma)


def _workgroup_specialized(call: FusedCall) -> None:
    """One kernel: GEMM programs release tile flags, communication programs acquire and scatter
    (none at one rank: there is nobody to scatter to)."""
    s, ctx = _Block(call), call.ctx
    args, use_tma = s.gemm_args(call)
    scatter_work = s.tiles if ctx.world_size > 1 else 0  # alone, there is nobody to scatter to
    gemm_programs, comm = split_roles(call, comm_work=scatter_work, other_work=s.tiles)
    call.launch_gemm(kernels.workgroup_specialized_kernel, (gemm_programs + comm,), (
        *args,
        gemm_programs,
        call.sync(flags=s.tiles), call.trace_ptr,
        ctx.rank, ctx.world_size, ctx.heap_bases,
    ), USE_TMA=use_tma)


def _producer_consumer(call: FusedCall) -> None:
    """The GEMM on this stream, the all-scatter on a second one at the same time, tile flags between."""
    s, cfg, ctx = _Block(call), call.cfg, call.ctx
    args, use_tma = s.gemm_args(call)
    gemm_programs, comm = split_roles(call, comm_work=s.tiles, other_work=s.tiles)
    sync = call.sync(flags=s.tiles)
    side = None if ctx.platform.simulator else ctx.resource("ops.side_stream", lambda: torch.cuda.Stream(ctx.device))
    if side is not None:
        # The scatter stream waits for what came before this call, not for the GEMM launched
        # next: the two kernels then run side by side (the simulator runs them one after another).
        side.wait_stream(torch.cuda.current_stream(ctx.device))
    kernels.producer_kernel[(gemm_programs,)](
        *args,
        sync, call.trace_ptr,
        ctx.rank, ctx.world_size, ctx.heap_bases,
        BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N, BLOCK_K=cfg.BLOCK_K, GROUP_M=cfg.GROUP_M, USE_TMA=use_tma,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
        _scatter(call, s, sync, comm, wait_flags=True)
    if side is not None:
        torch.cuda.current_stream(ctx.device).wait_stream(side)  # (the scatter touches heap memory only)


def _baseline(call: FusedCall) -> None:
    """torch.matmul, torch.distributed's all-gather, and a copy that puts the blocks side by side."""
    ctx, C = call.ctx, call.C
    local = torch.matmul(call.A, call.B)
    gathered = torch.empty((ctx.world_size * local.shape[0], local.shape[1]), dtype=local.dtype, device=local.device)
    gather_into(gathered, local)
    blocks = gathered.view(ctx.world_size, *local.shape)  # rank r's block is blocks[r]; C wants them side by side
    C.view(C.shape[0], ctx.world_size, -1).copy_(blocks.permute(1, 0, 2))


def _extra_bytes(pattern: str, shape: tuple[int, int, int], world_size: int, element_size: int) -> int | None:
    """Bytes a pattern moves on one rank beyond the GEMM of its ``M x N/W`` column block (``shape``:
    M x N x K, N every rank's columns): its block into every peer's C, and for all but
    ``fused_sequential`` each tile read back from the local C first; nothing at one rank."""
    M, N, _ = shape
    block = M * (N // world_size) * element_size
    if pattern == "fused_sequential":
        return (world_size - 1) * block
    if pattern in ("bulk_synchronous", "producer_consumer", "workgroup_specialized"):
        return world_size * block if world_size > 1 else 0  # the read-back, then W - 1 stores
    return None


#: The op: its patterns (in the order the docs list them), ``auto`` table and communication programs.
GEMM_ALL_SCATTER = OpSpec(
    name="gemm_all_scatter",
    patterns={"bulk_synchronous": _bulk_synchronous, "producer_consumer": _producer_consumer,
              "fused_sequential": _fused_sequential, "workgroup_specialized": _workgroup_specialized,
              "baseline": _baseline},
    auto_table=AUTO_TABLE,
    gpu_comm_programs=gpu_comm_programs,
    replayable=frozenset({"bulk_synchronous", "fused_sequential", "workgroup_specialized"}),
    zero_when_k_is_zero=True,
    extra_bytes=_extra_bytes)
#: Every value of ``pattern``.
PATTERNS = GEMM_ALL_SCATTER.pattern_names


def _shape(team, A, B_local, C):
    (M, K), n_local = A.shape, B_local.shape[1]
    return (M, n_local, K), M * C.shape[1] * K, M == 0 or n_local == 0


#: The op as the call pipeline runs it (it refuses across nodes).
GEMM_ALL_SCATTER_OP = fused_op(GEMM_ALL_SCATTER, lambda team, *args: _check_gemm_all_scatter_args(team, *args),
                               _shape, refusal=lambda team: multinode.refuse(team, "gemm_all_scatter"))


def gemm_all_scatter(ctx, A: torch.Tensor, B_local: torch.Tensor, C: torch.Tensor, pattern: str = "auto",
                     config: MatmulConfig | None = None, comm_programs: int | None = None, trace=None,
                     group=None) -> torch.Tensor:
    """``C = A @ B`` on every rank, where rank r holds B's column block r; collective.

    Args:
        ctx: the trident context.
        A: ``M x K``, the same on every rank; float16, bfloat16 or float32 (fp32 accumulation).
        B_local: ``K x N/world_size``, this rank's column block of B.
        C: ``M x N``, symmetric (``ctx.empty``); receives every rank's block.
        pattern: one of :data:`PATTERNS` (see the module docstring); the same on every rank.
        config: a :class:`MatmulConfig` for the GEMM tiles (None: the table's, as for ``matmul``).
        comm_programs: programs that communicate in ``producer_consumer`` and
            ``workgroup_specialized`` (None: :func:`gpu_comm_programs` on a GPU, 2 in the
            simulator; at most one per tile, and at least one program is left for the GEMM).
        trace: a ``trident.trace.Trace`` to record per-tile compute/communication/wait events, or None.

    Returns:
        ``C``. Ordered on the current stream: work queued after the call sees the complete ``C``.
        No host synchronization inside (except when the fused ops' sync block is made or grows,
        collectively, with device barriers: :func:`~trident.ops.fused.sync.sync_block`); per-call
        epochs on the device keep repeated calls correct.

    Example::

        C = ctx.empty(M, N, dtype=torch.bfloat16)
        trident.ops.gemm_all_scatter(ctx, A, B_local, C, pattern="fused_sequential")
    """
    run_call(team(ctx, group), GEMM_ALL_SCATTER_OP, (A, B_local, C), (pattern, config, comm_programs, trace))
    return C
