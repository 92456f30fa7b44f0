"""Argument checks of the collectives, shared by the in-node and the across-nodes versions."""

from __future__ import annotations

import torch
import torch.distributed as dist
import triton.language as tl

from ..runtime.team import Team

OPS = {"sum": "sum", "max": "max", "min": "min"}
_REDUCE_OPS: dict[object, str] = {dist.ReduceOp.SUM: "sum", dist.ReduceOp.MAX: "max", dist.ReduceOp.MIN: "min"}
#: Dtypes the reductions take, and what they accumulate in (fp16 and bf16 in fp32).
ACCUMULATE = {torch.float16: tl.float32, torch.bfloat16: tl.float32, torch.float32: tl.float32,
              torch.float64: tl.float64, torch.int64: tl.int64, torch.int32: tl.int32, torch.int16: tl.int32,
              torch.int8: tl.int32, torch.uint8: tl.int32}


def op_name(team: Team, op) -> str:
    """``op`` ("sum", "max", "min" or a ``torch.distributed.ReduceOp``) as a name; a clear error otherwise."""
    name: str | None
    if isinstance(op, str):
        name = op.lower()
    elif isinstance(op, type(dist.ReduceOp.SUM)) or isinstance(op, dist.ReduceOp):
        name = _REDUCE_OPS.get(op)
    else:  # a bare int compares equal to a ReduceOp: refuse it rather than guess
        name = None
    if name is None or name not in OPS:
        raise ValueError(f"{team.who()}: op={op!r} is not supported; expected 'sum', 'max' or 'min' "
                         f"(or torch.distributed.ReduceOp)")
    return name


def acc_dtype(team: Team, dtype: torch.dtype, what: str):
    """The Triton dtype a reduction of ``dtype`` accumulates in; a clear error naming the rank otherwise."""
    if dtype not in ACCUMULATE:
        raise ValueError(f"{team.who()}: {what}: reductions do not support dtype {dtype}; expected one of "
                         f"{', '.join(str(d).removeprefix('torch.') for d in ACCUMULATE)}")
    return ACCUMULATE[dtype]


def check_tensors(team: Team, what: str, **tensors) -> None:
    """Every tensor a real, contiguous torch.Tensor on the team's device, all of one dtype."""
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{team.who()}: {what}: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.device != team.device:
            raise ValueError(f"{team.who()}: {what}: {name} is on {t.device}, expected {team.device}")
        if not t.is_contiguous():
            raise ValueError(f"{team.who()}: {what}: {name} must be contiguous (call .contiguous())")
        if t.is_complex():
            raise ValueError(f"{team.who()}: {what}: {name} is complex ({t.dtype}); trident's collectives take "
                             f"real tensors: pass torch.view_as_real({name}) (and view the result back)")
    dtypes = {t.dtype for t in tensors.values()}
    if len(dtypes) > 1:
        listing = ", ".join(f"{n}: {t.dtype}" for n, t in tensors.items())
        raise ValueError(f"{team.who()}: {what}: tensors must share one dtype, got {listing}")


def overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors' memory (first to last element) overlaps."""
    if a.numel() == 0 or b.numel() == 0 or a.device != b.device:
        return False

    def span(t):
        start = t.untyped_storage().data_ptr() + t.storage_offset() * t.element_size()
        last = sum((n - 1) * st for n, st in zip(t.shape, t.stride(), strict=True))
        return start, start + (last + 1) * t.element_size()
    (a0, a1), (b0, b1) = span(a), span(b)
    return a0 < b1 and b0 < a1


def check_separate(team: Team, what: str, out: torch.Tensor, inp: torch.Tensor) -> None:
    """Refuse an ``out`` that shares memory with ``inp`` (peers read my inp while I write my out)."""
    if overlap(out, inp):
        raise ValueError(f"{team.who()}: {what}: out and inp share memory; every rank reads its peers' "
                         f"inp while they write their out, so in place is not possible: pass a separate out")


def check_rows(team: Team, what: str, out: torch.Tensor, inp: torch.Tensor) -> None:
    """``out`` and ``inp`` have a dim 0 and match beyond it."""
    if out.dim() == 0 or inp.dim() == 0 or out.shape[1:] != inp.shape[1:]:
        raise ValueError(f"{team.who()}: {what}: out {tuple(out.shape)} and inp {tuple(inp.shape)} must "
                         f"have at least one dimension and match beyond dim 0")


def check_world_multiple(team: Team, what: str, big: torch.Tensor, small: torch.Tensor, big_name: str,
                         small_name: str) -> None:
    """``big`` holds ``world_size`` times the elements of ``small``."""
    if big.numel() != team.world_size * small.numel():
        raise ValueError(f"{team.who()}: {what}: {big_name} has {big.numel()} elements, expected world_size x "
                         f"{small_name} = {team.world_size} x {small.numel()} ({small_name} shape "
                         f"{tuple(small.shape)})")


def check_equal_chunks(team: Team, what: str, out: torch.Tensor, inp: torch.Tensor) -> None:
    """all_to_all's shapes: dim 0 divisible by the world size, ``out`` like ``inp``, separate memory."""
    w = team.world_size
    if inp.dim() == 0 or inp.shape[0] % w or out.shape != inp.shape:
        raise ValueError(f"{team.who()}: {what}: inp {tuple(inp.shape)} needs dim 0 divisible by "
                         f"world_size = {w}, and out {tuple(out.shape)} the same shape")
    check_separate(team, what, out, inp)


def check_src(team: Team, what: str, src) -> None:
    """``src`` is a rank of the team."""
    if isinstance(src, bool) or not isinstance(src, int) or not 0 <= src < team.world_size:
        raise ValueError(f"{team.who()}: {what}: src={src!r} is not a rank (world size {team.world_size})")
