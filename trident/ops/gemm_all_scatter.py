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
import os

import torch
import torch.distributed as dist
import triton

from ..ccl.workspace import workspace as _ccl_workspace
from ..errors import NotSymmetricError
from . import gas_kernels as kernels
from .matmul import DTYPES, MatmulConfig, launch_matmul, operands, pick_config, sm_count

PATTERNS = ("bulk_synchronous", "producer_consumer", "fused_sequential", "workgroup_specialized", "baseline", "auto")

#: ``auto``'s measured choices: (GPU name, world size) -> [(minimum M*N*K, pattern), ...], largest
#: first. Only figures measured on that many GPUs of that kind belong here (docs/gemm-all-scatter.md);
#: where nothing applies ``auto`` runs ``baseline``. Empty until multi-GPU runs are recorded.
AUTO_TABLE: dict[tuple[str, int], list[tuple[int, str]]] = {}


class _SyncState:
    """Heap memory of the patterns for one context: the epoch, ready/arrived slots, tile flags.

    It hangs off the collectives' workspace, so it lives exactly as long as that (and goes when a
    test pool drops the workspace with the task's allocations). Allocation is collective: every
    rank creates it in its first call, and grows the tile flags at the same call.
    """

    def __init__(self, ctx):
        self.ctx = ctx
        self.state = ctx.zeros(8, dtype=torch.int64)  # [epoch, finish ticket]
        self.ready = ctx.zeros(ctx.world_size, dtype=torch.int64)
        self.arrived = ctx.zeros(ctx.world_size, dtype=torch.int64)
        self.flags = ctx.zeros(64, dtype=torch.int64)
        self.side_stream = torch.cuda.Stream(ctx.device) if ctx.device.type == "cuda" else None
        ctx.barrier()  # peers signal into ready/arrived: they must be zeroed everywhere first

    def tile_flags(self, tiles: int) -> torch.Tensor:
        """At least ``tiles`` per-tile flags (local to this rank; grown collectively, never reset)."""
        if self.flags.numel() < tiles:  # new flags start at 0, below any epoch: no reset needed
            self.ctx.free(self.flags)
            self.flags = self.ctx.zeros(triton.next_power_of_2(tiles), dtype=torch.int64)
        return self.flags


def _sync_state(ctx) -> _SyncState:
    ws = _ccl_workspace(ctx)
    sync = getattr(ws, "gemm_all_scatter", None)
    if sync is None:
        sync = ws.gemm_all_scatter = _SyncState(ctx)
    return sync


def _check(ctx, A, B_local, C, pattern, config, comm_programs) -> None:
    """Every argument problem, raised before anything runs (the message names the rank)."""
    where = f"rank {ctx.rank}: gemm_all_scatter"
    if pattern not in PATTERNS:
        raise ValueError(f"{where}: pattern={pattern!r} is not one of {PATTERNS}")
    for name, t in (("A", A), ("B_local", B_local), ("C", C)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{where}: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 2:
            raise ValueError(f"{where}: {name} must be 2-D, got shape {tuple(t.shape)}")
        if t.dtype not in DTYPES:
            raise ValueError(f"{where}: {name} has dtype {t.dtype}; supported: float16, bfloat16, float32")
        if t.device != ctx.device:
            raise ValueError(f"{where}: {name} is on {t.device}, expected {ctx.device}")
        if not t.is_contiguous():
            raise ValueError(f"{where}: {name} must be contiguous (call .contiguous())")
    if not A.dtype == B_local.dtype == C.dtype:
        raise ValueError(f"{where}: A, B_local and C must share one dtype, got {A.dtype}, {B_local.dtype}, {C.dtype}")
    if A.shape[1] != B_local.shape[0]:
        raise ValueError(f"{where}: K mismatch: A is {tuple(A.shape)} (M x K) but B_local is "
                         f"{tuple(B_local.shape)} (K x N/world_size)")
    w = ctx.world_size
    if C.shape[0] != A.shape[0] or C.shape[1] % w or C.shape[1] // w != B_local.shape[1]:
        raise ValueError(f"{where}: C is {tuple(C.shape)}; expected (M, world_size * N_local) = "
                         f"({A.shape[0]}, {w} * {B_local.shape[1]}): N must be divisible by world_size {w} and "
                         f"every rank's B_local must hold N / world_size columns")
    if not ctx.is_symmetric(C):
        raise NotSymmetricError(f"{where}: C must be a symmetric tensor (peers store into it): allocate it "
                                f"with ctx.empty / ctx.zeros")
    if config is not None:
        if not isinstance(config, MatmulConfig):
            raise TypeError(f"{where}: config must be a trident.ops.MatmulConfig, got {type(config).__name__}")
        for name in ("BLOCK_M", "BLOCK_N", "BLOCK_K"):
            v = getattr(config, name)
            if v < 16 or v & (v - 1):
                raise ValueError(f"{where}: config.{name}={v} must be a power of two >= 16")
    if pattern == "baseline" and _shares_gpus(ctx):
        raise ValueError(f"{where}: pattern='baseline' needs one GPU per rank (NCCL cannot place "
                         f"{ctx.world_size} ranks on {torch.cuda.device_count()} GPU(s))")
    if comm_programs is not None and not (isinstance(comm_programs, int) and comm_programs >= 1):
        raise ValueError(f"{where}: comm_programs={comm_programs!r} must be a positive int")


def _shares_gpus(ctx) -> bool:
    return ctx.device.type == "cuda" and torch.cuda.device_count() < ctx.world_size


def choose_pattern(ctx, M: int, N: int, K: int) -> str:
    """What ``pattern="auto"`` runs for an ``M x N x K`` product (N: all ranks' columns).

    The first :data:`AUTO_TABLE` entry for this GPU and world size whose size threshold ``M*N*K``
    reaches; else ``baseline``. With ranks sharing a GPU (NCCL cannot run there) it is
    ``fused_sequential``, a correctness setting only.

    Example::

        trident.ops.choose_pattern(ctx, 8192, 4608, 36864)   # 'baseline' until measured otherwise
    """
    if _shares_gpus(ctx):
        return "fused_sequential"
    if ctx.device.type != "cuda":
        return "baseline"
    return table_choice(torch.cuda.get_device_name(ctx.device), ctx.world_size, M * N * K)


def table_choice(gpu_name: str, world_size: int, mnk: int, table: dict | None = None) -> str:
    """The pattern ``table`` (default :data:`AUTO_TABLE`) gives a GPU model, world size and M*N*K.

    Example::

        table_choice("NVIDIA H200", 8, 8192 * 4608 * 36864, {("H200", 8): [(1 << 36, "fused_sequential")]})
    """
    for (gpu, world), rules in (AUTO_TABLE if table is None else table).items():
        if world == world_size and gpu in gpu_name:
            for threshold, pattern in rules:
                if mnk >= threshold:
                    return pattern
    return "baseline"


def _baseline(ctx, A, B_local, C) -> None:
    # Never NVLink multicast (NVLS): it can take a shared host's GPUs out of service. NCCL reads this
    # when it creates its communicator, i.e. at the first NCCL collective (unless the user chose).
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    local = torch.matmul(A, B_local)
    gathered = torch.empty((ctx.world_size * local.shape[0], local.shape[1]), dtype=local.dtype, device=local.device)
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # renamed in torch 2.13
    gather(gathered, local)
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
            ``workgroup_specialized`` (None: 16 on a GPU, 2 in the simulator).
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
    sync = _sync_state(ctx)
    block = C[:, ctx.rank * n_local:(ctx.rank + 1) * n_local]  # my column block: same offsets on every rank
    tiles = triton.cdiv(M, cfg.BLOCK_M) * triton.cdiv(n_local, cfg.BLOCK_N)
    flags = sync.tile_flags(tiles)
    trace_ptr = sync.state if trace is None else getattr(trace, "ptr", trace)
    programs = cfg.programs or sms
    comm = comm_programs or (16 if ctx.device.type == "cuda" else 2)
    common = dict(rank=ctx.rank, heap_bases=ctx.heap_bases, BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N,
                  GROUP_M=cfg.GROUP_M, TRACE=trace is not None)
    world = dict(world_size=ctx.world_size, WORLD_BLOCK=triton.next_power_of_2(ctx.world_size))
    launch = dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    a, b, use_tma = operands(A, B_local, cfg)
    gemm_args = (a, b, block, M, n_local, K, A.stride(0), A.stride(1), B_local.stride(0), B_local.stride(1),
                 block.stride(0))
    if pattern == "bulk_synchronous":
        launch_matmul(A, B_local, block, cfg)
        kernels.scatter_kernel[(max(1, min(tiles, programs)),)](
            block, M, n_local, block.stride(0), sync.state, sync.ready, sync.arrived, flags, trace_ptr,
            WAIT_FLAGS=False, **common, **world, num_warps=cfg.num_warps)
    elif pattern == "fused_sequential":
        kernels.fused_sequential_kernel[(max(1, min(tiles, programs)),)](
            *gemm_args, sync.state, sync.ready, sync.arrived, trace_ptr, BLOCK_K=cfg.BLOCK_K, USE_TMA=use_tma,
            **common, **world, **launch)
    elif pattern == "workgroup_specialized":
        # Communication programs wait for GEMM programs of the same launch: all must be resident
        # at once, so at most one program per SM on a GPU.
        programs = min(programs, sms) if ctx.device.type == "cuda" else programs
        gemm_programs = max(1, min(tiles, programs - comm if programs > comm else 1))
        kernels.workgroup_specialized_kernel[(gemm_programs + comm,)](
            *gemm_args, gemm_programs, sync.state, sync.ready, sync.arrived, flags, trace_ptr, BLOCK_K=cfg.BLOCK_K,
            USE_TMA=use_tma, **common, **world, **launch)
    else:  # producer_consumer
        gemm_programs = max(1, min(tiles, programs - comm if programs > comm else 1))
        side = sync.side_stream
        if side is not None:
            # The scatter stream waits for what came before this call, not for the GEMM launched
            # next: the two kernels then run side by side (the simulator runs them one after another).
            side.wait_stream(torch.cuda.current_stream(ctx.device))
        kernels.producer_kernel[(gemm_programs,)](*gemm_args, sync.state, flags, trace_ptr, BLOCK_K=cfg.BLOCK_K,
                                                  USE_TMA=use_tma, **common, **launch)
        with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
            kernels.scatter_kernel[(min(comm, tiles),)](
                block, M, n_local, block.stride(0), sync.state, sync.ready, sync.arrived, flags, trace_ptr,
                WAIT_FLAGS=True, **common, **world, num_warps=cfg.num_warps)
        if side is not None:
            torch.cuda.current_stream(ctx.device).wait_stream(side)  # (the scatter touches heap memory only)
    return C

