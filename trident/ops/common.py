"""Host-side pieces every fused GEMM + communication op shares.

* :class:`SyncState`: the heap memory of :mod:`trident.ops.call_sync` (epoch, ready/arrived
  slots, tile flags), one per context, shared by all ops so that their epochs follow one count.
* :func:`check_operands`: the argument checks (2-D, dtype, device, contiguous, config), with
  messages that name the rank and the op.
* :func:`shares_gpus`, :func:`table_choice`, :func:`gather_into`: what ``auto`` and the
  torch + NCCL baselines need.
"""

from __future__ import annotations

import contextlib
import os

import torch
import torch.distributed as dist
import triton

from ..ccl.workspace import workspace as _ccl_workspace
from ..errors import NotSymmetricError
from .matmul import MatmulConfig, check_matrices, sm_count


class SyncState:
    """Heap memory of the fused ops for one context: the epoch, ready/arrived slots, tile flags.

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
        """At least ``tiles`` flags (symmetric; grown collectively, never reset).

        New flags start at 0, below any epoch, so growing needs no reset. Peers signal into them
        only after :func:`~trident.ops.call_sync.wait_peers_ready` (after this rank's kernel has
        started, so after the zeroing that precedes it on the stream).
        """
        if self.flags.numel() < tiles:
            self.ctx.device_barrier()  # no rank's earlier kernel still signals into the old flags
            self.ctx.free(self.flags)
            self.flags = self.ctx.zeros(triton.next_power_of_2(tiles), dtype=torch.int64)
        return self.flags

    def trace_ptr(self, trace) -> torch.Tensor:
        """What a kernel's ``trace_ptr`` gets: the trace's buffer, or (tracing off, never written) the state."""
        return self.state if trace is None else getattr(trace, "ptr", trace)


def comm_span(trace):
    """``trace.span()`` (the block's device work as one communication event), or nothing when
    ``trace`` is None: how the bulk patterns show the library collective they call."""
    return contextlib.nullcontext() if trace is None else trace.span()


def sync_state(ctx) -> SyncState:
    """The context's :class:`SyncState`, made collectively on first use."""
    ws = _ccl_workspace(ctx)
    sync = getattr(ws, "fused_ops", None)
    if sync is None:
        sync = ws.fused_ops = SyncState(ctx)
    return sync


def check_operands(ctx, where: str, config, symmetric: tuple[str, ...] = (), **tensors) -> None:
    """Raise a clear error unless every tensor is 2-D, contiguous, on ``ctx.device``, of one
    supported dtype, the names in ``symmetric`` lie on the heap, and ``config`` is valid.

    Example::

        check_operands(ctx, f"rank {ctx.rank}: all_gather_gemm", None, ("A_local",), A_local=A, B=B, C=C)
    """
    check_matrices(where, ctx.device, True, **tensors)
    for name in symmetric:
        if not ctx.is_symmetric(tensors[name]):
            raise NotSymmetricError(f"{where}: {name} must be a symmetric tensor (peers access it): allocate it "
                                    f"with ctx.empty / ctx.zeros, or copy it with ctx.as_symmetric")
    if config is not None:
        if not isinstance(config, MatmulConfig):
            raise TypeError(f"{where}: config must be a trident.ops.MatmulConfig, got {type(config).__name__}")
        for name in ("BLOCK_M", "BLOCK_N", "BLOCK_K"):
            v = getattr(config, name)
            if v < 16 or v & (v - 1):
                raise ValueError(f"{where}: config.{name}={v} must be a power of two >= 16")


def check_pattern(ctx, where: str, pattern: str, patterns: tuple[str, ...], comm_programs=None) -> None:
    """Raise unless ``pattern`` is one of ``patterns`` and can run here (the NCCL baseline needs a GPU
    per rank), and ``comm_programs`` is None or a positive int."""
    if pattern not in patterns:
        raise ValueError(f"{where}: pattern={pattern!r} is not one of {patterns}")
    if pattern == "baseline" and shares_gpus(ctx):
        raise ValueError(f"{where}: pattern='baseline' needs one GPU per rank (NCCL cannot place "
                         f"{ctx.world_size} ranks on {torch.cuda.device_count()} GPU(s))")
    if comm_programs is not None and not (isinstance(comm_programs, int) and comm_programs >= 1):
        raise ValueError(f"{where}: comm_programs={comm_programs!r} must be a positive int")


def comm_programs_or_default(ctx, comm_programs: int | None) -> int:
    """``comm_programs``, else 16 on a GPU and 2 in the simulator (whose programs run one by one)."""
    return comm_programs or (16 if ctx.device.type == "cuda" else 2)


def split_roles(ctx, cfg: MatmulConfig, comm_programs: int | None, comm_work: int, other_work: int) -> tuple[int, int]:
    """``(other, comm)``: how many programs of a ``workgroup_specialized`` launch do the GEMM side
    and the communication side. One side waits for the other in the same launch, so on a GPU all
    programs must be resident at once: at most one per SM in all, and at least one of each.

    Example::

        gemm_programs, comm = split_roles(ctx, cfg, None, comm_work=blocks, other_work=tiles)
    """
    sms = sm_count(ctx.device)
    programs = min(cfg.programs or sms, sms) if ctx.device.type == "cuda" else cfg.programs or sms
    comm = max(1, min(comm_programs_or_default(ctx, comm_programs), comm_work, programs - 1))
    return max(1, min(other_work, programs - comm)), comm


def shares_gpus(ctx) -> bool:
    """Whether ranks share GPUs (then NCCL, and with it every torch.distributed baseline, cannot run)."""
    return ctx.device.type == "cuda" and torch.cuda.device_count() < ctx.world_size


def table_choice(table: dict, gpu_name: str, world_size: int, mnk: int) -> str:
    """The pattern a measured ``table`` gives a GPU model, world size and M*N*K; else ``baseline``.

    ``table`` maps (GPU name part, world size) to [(minimum M*N*K, pattern), ...], largest first.

    Example::

        table_choice({("H200", 8): [(1 << 36, "fused_sequential")]}, "NVIDIA H200", 8, 8192 * 4608 * 36864)
    """
    for (gpu, world), rules in table.items():
        if world == world_size and gpu in gpu_name:
            for threshold, pattern in rules:
                if mnk >= threshold:
                    return pattern
    return "baseline"


def auto_pattern(ctx, table: dict, mnk: int, shared: str) -> str:
    """``auto``: ``shared`` when ranks share a GPU (a correctness setting: NCCL cannot run), else
    the table's choice on a GPU, else ``baseline``."""
    if shares_gpus(ctx):
        return shared
    if ctx.device.type != "cuda":
        return "baseline"
    return table_choice(table, torch.cuda.get_device_name(ctx.device), ctx.world_size, mnk)


def no_multicast() -> None:
    """Never NVLink multicast (NVLS) in the baselines: it can take a shared host's GPUs out of service.
    NCCL reads this when it creates its communicator, at the first NCCL collective."""
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")


def gather_into(out: torch.Tensor, inp: torch.Tensor) -> None:
    """torch.distributed's all-gather along dim 0 (``all_gather_into_tensor``, renamed in torch 2.13)."""
    no_multicast()
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(out, inp)


def reduce_scatter_into(out: torch.Tensor, inp: torch.Tensor) -> None:
    """torch.distributed's sum reduce-scatter along dim 0 (``reduce_scatter_tensor``)."""
    no_multicast()
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    scatter(out, inp)
