"""Fused all-reduce + residual add + RMSNorm (+ optional fp8 quantisation), one kernel per call.

Tensor-parallel inference runs this after every attention and MLP block: each rank holds a
partial sum ``x`` of the hidden states; every rank needs ``h = all_reduce(x) + residual`` (the new
residual) and ``rmsnorm(h) * weight``, often quantised to fp8 for the next GEMM.

Algorithm: one-shot. Every rank reduces every row itself, reading each peer's copy of the row
(fp32 accumulation), adds its residual and normalises the row while it is in registers, then
writes ``h`` and ``out`` into its own outputs only. That costs ``(world_size - 1) * T * H`` reads
per rank and no writes to peers, the right trade for the small T of decoding; the row is reduced
once per rank instead of once overall (a two-shot version would split rows over ranks and
broadcast results, see examples/05_fused_allreduce_rmsnorm.py).

Sync: the collectives' protocol (``trident.ccl.kernels``): the entry sync publishes where my ``x``
lies on the heap (ranks may pass different heap tensors, or plain ones staged through the ccl
workspace's input buffer, which the kernel fills before this sync) and waits until every peer's
``x`` is written; the exit sync waits until every peer has read my ``x``, so the next call may
overwrite it. Epochs live on the device: no host synchronisation inside, CUDA-graph replays stay
correct.

Small calls: a decode loop calls this every layer, where the checks, workspace lookups and
Triton's launch path would cost ten times what the kernel does on the host. The call runs through
the call pipeline (:mod:`trident.calls`): a call with an earlier call's layout (shapes, strides,
dtypes, placement; its options) replays that call's launch on this call's tensors, its fresh
``out`` and ``h`` included (the kernel stages a plain ``x`` itself: no copy launch).
"""

from __future__ import annotations

import math
import numbers

import torch
import triton

from ...calls import Op, run_call
from ...ccl.collectives import on_heap
from ...ccl.kernels import MAX_PROGRAMS
from ...ccl.workspace import workspace
from ...runtime.groups import team
from ..fused import multinode
from ..fused.call import check_tensor
from .kernels import all_reduce_rmsnorm_kernel, num_warps

#: Input dtypes (x, residual, weight); accumulation is fp32 for all.
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
#: ``out_dtype`` values: None (x's dtype) or fp8 e4m3 (needs ``scale``).
OUT_DTYPES = (None, torch.float8_e4m3fn)
#: Largest hidden size: a whole row is normalised in registers.
MAX_HIDDEN = 32768


def _fail(ctx, message: str, kind=ValueError):
    raise kind(f"{ctx.who()}: all_reduce_rmsnorm: {message}")


def _check(ctx, x, weight, eps, residual, out_dtype, scale):
    where = f"{ctx.who()}: all_reduce_rmsnorm"
    check_tensor(where, "x", x, ctx.device, DTYPES, dims=2)
    check_tensor(where, "weight", weight, ctx.device, DTYPES, dims=1)
    tokens, hidden = x.shape
    if hidden == 0 or hidden > MAX_HIDDEN:
        _fail(ctx, f"x {tuple(x.shape)}: the hidden size must be between 1 and {MAX_HIDDEN}")
    if weight.shape[0] != hidden:
        _fail(ctx, f"weight has {weight.shape[0]} elements, expected x's hidden size {hidden} "
                   f"(x {tuple(x.shape)}, weight {tuple(weight.shape)})")
    if residual is not None:
        check_tensor(where, "residual", residual, ctx.device, DTYPES, dims=2)
        if residual.shape != x.shape:
            _fail(ctx, f"residual shape {tuple(residual.shape)} does not match x {tuple(x.shape)}")
        if residual.dtype != x.dtype:
            _fail(ctx, f"residual has dtype {residual.dtype}, expected x's {x.dtype}")
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real) or not math.isfinite(eps) or eps < 0:
        _fail(ctx, f"eps={eps!r} must be a finite number >= 0")
    if not any(out_dtype is d for d in OUT_DTYPES):
        _fail(ctx, f"out_dtype={out_dtype!r} is not supported; expected None (x's dtype) or torch.float8_e4m3fn")
    if out_dtype is None:
        if scale is not None:
            _fail(ctx, "scale is only used with out_dtype=torch.float8_e4m3fn")
        return
    if scale is None:
        _fail(ctx, "out_dtype=torch.float8_e4m3fn needs a scale (a float or a 1-element float32 tensor)")
    if isinstance(scale, torch.Tensor):
        if scale.numel() != 1 or scale.dtype != torch.float32 or scale.device != ctx.device:
            _fail(ctx, f"scale must be a 1-element float32 tensor on {ctx.device}, got {scale.dtype} "
                       f"{tuple(scale.shape)} on {scale.device}")
    elif isinstance(scale, bool) or not isinstance(scale, numbers.Real) or not math.isfinite(scale) or scale <= 0:
        _fail(ctx, f"scale={scale!r} must be a finite number > 0 or a 1-element float32 tensor")


def all_reduce_rmsnorm(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6,
                       residual: torch.Tensor | None = None, out_dtype: torch.dtype | None = None,
                       scale=None, group=None) -> tuple[torch.Tensor, torch.Tensor]:
    """All-reduce ``x`` across ranks, add ``residual``, RMS-normalise each row: one kernel.

    Args:
        x: ``[T, H]`` partial sums of this rank (bf16, fp16 or fp32); read by peers, so staged
            through the collectives' workspace when not on the heap. Same shape and dtype on every rank.
        weight: ``[H]`` RMSNorm gain (any of the three float dtypes), read locally.
        eps: added to the mean square.
        residual: ``[T, H]``, x's dtype, or None; read locally (any placement).
        out_dtype: None (``out`` in x's dtype) or ``torch.float8_e4m3fn``.
        scale: with fp8 only: a float, or a 1-element float32 tensor on the device (graph-friendly);
            ``out = clamp(normed / scale, -448, 448)`` cast to fp8 (round to nearest even).

    Returns:
        ``(out, h)``: ``h = all_reduce(x) + residual`` in x's dtype (the new residual) and
        ``out = h * rsqrt(mean(h^2, -1) + eps) * weight``, computed in fp32 from the unrounded ``h``.
        Both are new plain tensors on ``ctx.device``.

    Example::

        out, residual = trident.ops.all_reduce_rmsnorm(ctx, partial, norm_weight, 1e-6, residual=residual)
    """
    me = team(ctx, group)  # the whole world, or a group of ctx.new_group
    if isinstance(x, torch.Tensor) and (out_dtype is None or isinstance(out_dtype, torch.dtype)):
        h = torch.empty_like(x)  # new tensors on every call: the caller keeps the last ones
        out = torch.empty_like(x) if out_dtype is None else torch.empty(x.shape, dtype=out_dtype, device=x.device)
    else:  # the check says what is wrong
        h = out = None
    number = None if isinstance(scale, torch.Tensor) else scale
    run_call(me, ALL_REDUCE_RMSNORM, (x, weight, residual, out, h, scale if number is None else None),
             (eps, type(eps), out_dtype, number, type(number)))
    return out, h


def _check_call(team, tensors, options) -> None:
    x, weight, residual, _, _, scale = tensors
    eps, _, out_dtype, number, _ = options
    _check(team, x, weight, eps, residual, out_dtype, scale if number is None else number)


def _run(team, rec, tensors, options) -> None:
    x, weight, residual, out, h, scale_ptr = tensors
    eps, _, out_dtype, number, _ = options
    tokens, hidden = x.shape
    fp8 = out_dtype is not None
    # Allocated on every rank whether or not x is on the heap: allocations stay in step.
    source = on_heap(team, x)  # a plain x is staged by the kernel itself
    if tokens == 0:  # the same on every rank: nobody launches
        rec.discard()
        return
    scale_value = float(number) if fp8 and scale_ptr is None else 1.0
    block_h = triton.next_power_of_2(hidden)
    programs = max(1, min(tokens, team.platform.program_limit, MAX_PROGRAMS))  # the same on every rank
    rec.launch(
        all_reduce_rmsnorm_kernel, (programs,),
        (x, source, residual, weight, out, h, scale_ptr, scale_value, float(eps), (tokens, hidden),
         workspace(team).sync, team.rank, team.world_size, team.heap_bases),
        {"ROUND_FP8_IN_FP32": fp8 and team.platform.simulator, "STAGE": source is not x,
         "BLOCK_H": block_h, "WORLD_BLOCK": triton.next_power_of_2(team.world_size)},
        num_warps=num_warps(block_h))


#: The op as the call pipeline runs it (it does not run across nodes: run it in a node's group).
ALL_REDUCE_RMSNORM = Op(
    "all_reduce_rmsnorm", _check_call, _run, refusal=lambda team: multinode.refuse(team, "all_reduce_rmsnorm"),
    facts=lambda tensors, options: (tuple(tensors[0].shape), tensors[0].dtype, tensors[2] is None, str(options[2])))


__all__ = ["all_reduce_rmsnorm", "ALL_REDUCE_RMSNORM", "DTYPES", "OUT_DTYPES", "MAX_HIDDEN"]
