"""Host-level collectives with torch.distributed's semantics, run by trident kernels on the heap.

Each call checks its arguments (before anything runs), stages tensors that are not on the heap
through a symmetric buffer (inside the kernel for all_gather and all_reduce; a copy in and out
for the others), and launches one kernel on the current stream. There is no host
synchronization inside, so the calls can be captured in a CUDA graph, as long as split sizes are
given as device tensors.

The small-message path: a call whose key (its tensors' addresses, shapes, strides and dtypes,
and its options) was seen before replays the plan that call recorded (the kernel launched
through its compiled handle, the copies it needed), skipping the checks it passed then
(:mod:`trident.kernels.prepared`). The debug mode checks every call in full.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import triton
import triton.language as tl

from ..errors import NotSymmetricError
from ..kernels.prepared import Plan, copy, launch, plan_key
from ..runtime.groups import team
from . import hierarchical, kernels
from .kernels import MAX_PROGRAMS
from .workspace import keep_plan, new_plan, replay, run_step, workspace

OPS = {"sum": "sum", "max": "max", "min": "min"}
_REDUCE_OPS = {dist.ReduceOp.SUM: "sum", dist.ReduceOp.MAX: "max", dist.ReduceOp.MIN: "min"}
ALGORITHMS = ("one_shot", "two_shot", "auto")
#: The workspace buffer that stages inputs not on the heap. A caller that fills
#: ``input_stage(ctx, numel, dtype)`` itself and passes it as the input saves a heap buffer and a copy.
INPUT_STAGE = "input"
#: all_reduce "auto" uses one_shot up to this many bytes, two_shot above (see docs/collectives.md).
ONE_SHOT_MAX_BYTES = 256 * 1024


def _op_name(op) -> str:
    if isinstance(op, str):
        name = op.lower()
    elif isinstance(op, type(dist.ReduceOp.SUM)) or isinstance(op, dist.ReduceOp):
        name = _REDUCE_OPS.get(op)
    else:  # a bare int compares equal to a ReduceOp: refuse it rather than guess
        name = None
    if name not in OPS:
        raise ValueError(f"op={op!r} is not supported; expected 'sum', 'max' or 'min' (or torch.distributed.ReduceOp)")
    return name


def _acc_dtype(dtype: torch.dtype, ctx, what: str):
    if dtype in (torch.float16, torch.bfloat16, torch.float32):
        return tl.float32  # fp16 and bf16 accumulate in fp32
    if dtype == torch.float64:
        return tl.float64
    if dtype in (torch.int32, torch.int64, torch.int16, torch.int8, torch.uint8):
        return tl.int64 if dtype == torch.int64 else tl.int32
    raise ValueError(f"rank {ctx.rank}: {what}: reductions do not support dtype {dtype}; expected float16, "
                     f"bfloat16, float32, float64, int8, uint8, int16, int32 or int64 (convert first)")


def _check(ctx, what: str, **tensors) -> None:
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"rank {ctx.rank}: {what}: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.device != ctx.device:
            raise ValueError(f"rank {ctx.rank}: {what}: {name} is on {t.device}, expected {ctx.device}")
        if not t.is_contiguous():
            raise ValueError(f"rank {ctx.rank}: {what}: {name} must be contiguous (call .contiguous())")
        if t.is_complex():
            raise ValueError(f"rank {ctx.rank}: {what}: {name} is complex ({t.dtype}); trident's collectives take "
                             f"real tensors: pass torch.view_as_real({name}) (and view the result back)")
    dtypes = {t.dtype for t in tensors.values()}
    if len(dtypes) > 1:
        listing = ", ".join(f"{n}: {t.dtype}" for n, t in tensors.items())
        raise ValueError(f"rank {ctx.rank}: {what}: tensors must share one dtype, got {listing}")


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors' memory (first to last element) overlaps."""
    if a.numel() == 0 or b.numel() == 0 or a.device != b.device:
        return False
    def span(t):
        start = t.untyped_storage().data_ptr() + t.storage_offset() * t.element_size()
        last = sum((n - 1) * st for n, st in zip(t.shape, t.stride(), strict=True))
        return start, start + (last + 1) * t.element_size()
    (a0, a1), (b0, b1) = span(a), span(b)
    return a0 < b1 and b0 < a1


def _program_limit(ctx) -> int:
    """The platform's limit (one program per SM; a few in the simulator), within the sync block's slots."""
    return min(ctx.platform.program_limit, MAX_PROGRAMS)


def _launch(ctx, plan: Plan | None, kernel, work_items: int | None, *args, **constexprs) -> None:
    """Launch ``kernel`` with enough programs for the work, up to the limit; record it in ``plan``.

    ``work_items`` must be the same on every rank: program ``pid`` meets program ``pid`` of the
    other ranks. None launches the limit (for work whose size differs between ranks).
    """
    ws = workspace(ctx)
    block = constexprs["BLOCK"]
    limit = _program_limit(ctx)
    programs = limit if work_items is None else max(1, min(triton.cdiv(max(work_items, 1), block), limit))
    launch(plan, kernel, (programs,), (*args, ws.sync, ctx.rank, ctx.world_size, ctx.heap_bases),
           {**constexprs, "WORLD_BLOCK": triton.next_power_of_2(ctx.world_size)},
           num_warps=4 if block <= 2048 else 8)


def _block(ctx, numel: int) -> int:
    """Elements per tile: larger tiles for large tensors on a GPU; the simulator keeps one size."""
    if ctx.platform.simulator:
        return 1024
    return 1024 if numel <= 64 * 1024 else 4096


def _on_heap(ctx, t: torch.Tensor, name: str, copy_in: bool, plan: Plan | None = None) -> torch.Tensor:
    """``t`` itself when it lies on the heap, else a staging buffer (with t's data when ``copy_in``,
    a copy recorded in ``plan`` too).

    Ranks may decide differently (and pass heap tensors at different offsets): the kernels
    exchange where each rank's tensor lies. The staging buffer is allocated on every rank all the
    same, so that allocations stay in step."""
    stage = workspace(ctx).buffer(name, t.numel(), t.dtype).view(t.shape)
    if ctx.is_symmetric(t):
        return t
    if copy_in:
        _copy(ctx, plan, stage, t)
    return stage


def _copy(ctx, plan: Plan | None, dst: torch.Tensor, src: torch.Tensor) -> None:
    """``dst.copy_(src)`` now and in every replay of ``plan``; by address where both are contiguous,
    so that the plan holds neither tensor (a user's tensor kept alive by a plan would hold its memory)."""
    if dst.is_contiguous() and src.is_contiguous():
        copy(plan, dst, src, on_gpu=not ctx.platform.simulator)
    else:
        run_step(plan, lambda: dst.copy_(src))


def input_stage(ctx, numel: int, dtype: torch.dtype) -> torch.Tensor:
    """The heap buffer the collectives stage a plain input in (``numel`` elements, flat; collective:
    every rank asks for the same size). Writing an input straight into it, then passing it to a
    collective, saves the staging copy and a second heap buffer of that size.

    Example::

        partial = trident.ccl.api.input_stage(ctx, M * N, torch.bfloat16).view(M, N)
        torch.matmul(A, B, out=partial)
        trident.ccl.reduce_scatter(ctx, out, partial)
    """
    return workspace(ctx).buffer(INPUT_STAGE, numel, dtype)


def all_gather(ctx, out: torch.Tensor, inp: torch.Tensor, group=None) -> torch.Tensor:
    """Gather every rank's ``inp`` into ``out`` along dim 0, like ``all_gather_into_tensor``.

    Args:
        out: ``world_size * inp.numel()`` elements (shape ``(world_size * inp.shape[0], ...)`` or flat).
        inp: this rank's part; staged through the heap when it is not symmetric.

    Returns:
        ``out``.

    Example::

        out = torch.empty(ctx.world_size * 1024, device=ctx.device)
        trident.ccl.all_gather(ctx, out, ctx.ones(1024))
    """
    ctx = team(ctx, group)  # the whole world, or the group's ranks, workspace and heap bases
    if ctx.spans_nodes:  # several nodes: trident inside each, torch.distributed between (one check)
        return hierarchical.all_gather(ctx, out, inp)
    key = plan_key("all_gather", out, inp)
    if replay(ctx, key):
        return out
    _check(ctx, "all_gather", out=out, inp=inp)
    if out.numel() != ctx.world_size * inp.numel():
        raise ValueError(f"rank {ctx.rank}: all_gather: out has {out.numel()} elements, expected world_size x "
                         f"inp = {ctx.world_size} x {inp.numel()} (inp shape {tuple(inp.shape)})")
    ctx.agree_in_debug("all_gather", tuple(inp.shape), inp.dtype)
    plan = new_plan(ctx, key)
    source = _on_heap(ctx, inp, INPUT_STAGE, copy_in=False)  # staged inside the kernel
    _launch(ctx, plan, kernels.all_gather_kernel, inp.numel(), inp, source, out, inp.numel(),
            STAGE=source is not inp, BLOCK=_block(ctx, inp.numel()))
    keep_plan(ctx, key, plan)
    return out


def reduce_scatter(ctx, out: torch.Tensor, inp: torch.Tensor, op="sum", group=None) -> torch.Tensor:
    """Reduce every rank's ``inp`` and keep this rank's chunk (dim 0) in ``out``, like ``reduce_scatter_tensor``.

    Example::

        out = torch.empty(1024, device=ctx.device)
        trident.ccl.reduce_scatter(ctx, out, ctx.ones(ctx.world_size * 1024))   # out == world_size
    """
    ctx = team(ctx, group)  # the whole world, or the group's ranks, workspace and heap bases
    if ctx.spans_nodes:  # several nodes: trident inside each, torch.distributed between (one check)
        return hierarchical.reduce_scatter(ctx, out, inp, op)
    key = plan_key("reduce_scatter", out, inp, op)
    if replay(ctx, key):
        return out
    _check(ctx, "reduce_scatter", out=out, inp=inp)
    name = _op_name(op)
    if inp.numel() != ctx.world_size * out.numel():
        raise ValueError(f"rank {ctx.rank}: reduce_scatter: inp has {inp.numel()} elements, expected world_size x "
                         f"out = {ctx.world_size} x {out.numel()}")
    ctx.agree_in_debug("reduce_scatter", tuple(inp.shape), inp.dtype, name)
    plan = new_plan(ctx, key)
    source = _on_heap(ctx, inp, INPUT_STAGE, copy_in=True, plan=plan)
    _launch(ctx, plan, kernels.reduce_scatter_kernel, out.numel(), source, out, out.numel(), OP=name,
            ACC=_acc_dtype(inp.dtype, ctx, "reduce_scatter"), BLOCK=_block(ctx, out.numel()))
    keep_plan(ctx, key, plan)
    return out


def all_reduce(ctx, tensor: torch.Tensor, op="sum", algorithm: str = "auto", group=None) -> torch.Tensor:
    """Reduce ``tensor`` across ranks, in place, like ``torch.distributed.all_reduce``.

    Args:
        tensor: the same shape and dtype on every rank; staged when not symmetric.
        op: "sum", "max", "min" or a ``torch.distributed.ReduceOp``. fp16/bf16 accumulate in fp32.
        algorithm: "one_shot" (every rank reads every peer), "two_shot" (reduce-scatter, then
            all-gather), or "auto" (one_shot up to ``ONE_SHOT_MAX_BYTES``).

    Returns:
        ``tensor``.

    Example::

        x = ctx.full((4096,), float(ctx.rank))
        trident.ccl.all_reduce(ctx, x)      # every element: 0 + 1 + ... + world_size-1
    """
    ctx = team(ctx, group)  # the whole world, or the group's ranks, workspace and heap bases
    if ctx.spans_nodes:  # several nodes: trident inside each, torch.distributed between (one check)
        return hierarchical.all_reduce(ctx, tensor, op, algorithm)
    key = plan_key("all_reduce", tensor, op, algorithm)
    if replay(ctx, key):
        return tensor
    _check(ctx, "all_reduce", tensor=tensor)
    name = _op_name(op)
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm={algorithm!r} is not one of {ALGORITHMS}")
    if algorithm == "auto":
        algorithm = "one_shot" if tensor.numel() * tensor.element_size() <= ONE_SHOT_MAX_BYTES else "two_shot"
    ctx.agree_in_debug("all_reduce", tuple(tensor.shape), tensor.dtype, name, algorithm)
    n = tensor.numel()
    plan = new_plan(ctx, key)
    x = _on_heap(ctx, tensor, INPUT_STAGE, copy_in=False)  # staged inside the kernel
    scratch = workspace(ctx).buffer("scratch", n, tensor.dtype)
    acc = _acc_dtype(tensor.dtype, ctx, "all_reduce")
    meta = {"OP": name, "ACC": acc, "STAGE": x is not tensor, "BLOCK": _block(ctx, n)}
    if algorithm == "one_shot":
        _launch(ctx, plan, kernels.all_reduce_one_shot_kernel, n, tensor, x, scratch, tensor, n, **meta)
    else:
        chunk = triton.cdiv(n, ctx.world_size)
        _launch(ctx, plan, kernels.all_reduce_two_shot_kernel, chunk, tensor, x, scratch, tensor, n, chunk, **meta)
    keep_plan(ctx, key, plan)
    return tensor


def _split_table(ctx, in_splits, out_splits, rows_in: int, rows_out: int, what: str) -> torch.Tensor:
    """Fill this rank's split table: rows sent to each rank, where they start, where received rows go.

    Splits given on the host (lists, CPU tensors) are checked here; splits already on the GPU are
    not, since checking them would make the host wait for the device (and break graph capture).
    """
    table = workspace(ctx).table
    w = ctx.world_size
    sizes = []
    for name, splits, rows in (("in_splits", in_splits, rows_in), ("out_splits", out_splits, rows_out)):
        on_device = isinstance(splits, torch.Tensor) and not splits.is_cpu  # where the caller keeps them
        s = splits if on_device else torch.as_tensor(splits)
        if s.dtype.is_floating_point or s.dtype.is_complex or s.dtype == torch.bool:
            raise TypeError(f"rank {ctx.rank}: {what}: {name} must hold integer row counts, got {s.dtype}"
                            + ("" if on_device else f" {s.tolist()}"))
        if s.numel() != w:
            raise ValueError(f"rank {ctx.rank}: {what}: {name} has {s.numel()} entries, expected world_size = {w}")
        if not on_device and (int(s.sum()) != rows or bool((s < 0).any())):
            raise ValueError(f"rank {ctx.rank}: {what}: {name} {s.tolist()} must be non-negative and sum to "
                             f"the {rows} rows along dim 0")
        sizes.append(s.reshape(-1).to(device=ctx.device, dtype=torch.int64))
    table[:w] = sizes[0]
    table[w:2 * w] = torch.cumsum(sizes[0], 0) - sizes[0]
    table[2 * w:] = torch.cumsum(sizes[1], 0) - sizes[1]
    return table


def all_to_all_v(ctx, out: torch.Tensor, inp: torch.Tensor, out_splits, in_splits, group=None) -> torch.Tensor:
    """Exchange rows (dim 0) with per-rank sizes, like ``all_to_all_single`` with split sizes (MoE dispatch).

    Args:
        out: receives ``out_splits[p]`` rows from each rank ``p``, in rank order (any tensor).
        inp: sends ``in_splits[p]`` rows to each rank ``p``, in rank order. It must lie on the heap
            (row counts differ between ranks, so no staging buffer could be allocated collectively
            without a host round trip): allocate a buffer of the largest row count once, e.g.
            ``ctx.empty(capacity, hidden)``, and pass ``buf[:rows]`` (also when ``rows`` is 0).
        out_splits, in_splits: lists or int tensors of ``world_size`` row counts; ``out_splits[p]``
            must equal rank p's ``in_splits[this rank]``. Device tensors keep the call graph-capturable.

    Example::

        trident.ccl.all_to_all_v(ctx, out, tokens[:n], out_splits=recv_counts, in_splits=send_counts)
    """
    ctx = team(ctx, group)  # the whole world, or the group's ranks, workspace and heap bases
    if ctx.spans_nodes:  # several nodes: trident inside each, torch.distributed between (one check)
        return hierarchical.all_to_all_v(ctx, out, inp, out_splits, in_splits)
    _check(ctx, "all_to_all_v", out=out, inp=inp)
    if _overlap(out, inp):
        raise ValueError(f"rank {ctx.rank}: all_to_all_v: out and inp share memory; every rank reads its peers' "
                         f"inp while they write their out, so in place is not possible: pass a separate out")
    if not ctx.is_symmetric(inp):
        raise NotSymmetricError(
            f"rank {ctx.rank}: all_to_all_v: inp must lie on the heap (its size differs between ranks, so it "
            f"cannot be staged): allocate a buffer of the largest size with ctx.empty and pass a slice of it"
        )
    _check_rows(ctx, out, inp, "all_to_all_v")
    table = _split_table(ctx, in_splits, out_splits, inp.shape[0], out.shape[0], "all_to_all_v")
    ctx.agree_in_debug("all_to_all_v", tuple(inp.shape[1:]), inp.dtype)
    # Row counts differ between ranks: launch the limit (program pid must meet pid everywhere).
    _launch(ctx, None, kernels.all_to_all_kernel, None, inp, out, table, math.prod(inp.shape[1:]), 0,
            EQUAL=False, BLOCK=_block(ctx, out.numel()))
    return out


def _check_rows(ctx, out, inp, what: str) -> None:
    if out.dim() == 0 or inp.dim() == 0 or out.shape[1:] != inp.shape[1:]:
        raise ValueError(f"rank {ctx.rank}: {what}: out {tuple(out.shape)} and inp {tuple(inp.shape)} must "
                         f"have at least one dimension and match beyond dim 0")


def all_to_all(ctx, out: torch.Tensor, inp: torch.Tensor, group=None) -> torch.Tensor:
    """Send chunk ``p`` (dim 0) of ``inp`` to rank ``p``; receive rank ``p``'s chunk into chunk ``p`` of ``out``.

    Like ``all_to_all_single`` with equal splits.

    Example::

        trident.ccl.all_to_all(ctx, out, inp)   # inp.shape[0] divisible by world_size
    """
    ctx = team(ctx, group)  # the whole world, or the group's ranks, workspace and heap bases
    if ctx.spans_nodes:  # several nodes: trident inside each, torch.distributed between (one check)
        return hierarchical.all_to_all(ctx, out, inp)
    key = plan_key("all_to_all", out, inp)
    if replay(ctx, key):
        return out
    _check(ctx, "all_to_all", out=out, inp=inp)
    w = ctx.world_size
    if inp.dim() == 0 or inp.shape[0] % w or out.shape != inp.shape:
        raise ValueError(f"rank {ctx.rank}: all_to_all: inp {tuple(inp.shape)} needs dim 0 divisible by "
                         f"world_size = {w}, and out {tuple(out.shape)} the same shape")
    if _overlap(out, inp):
        raise ValueError(f"rank {ctx.rank}: all_to_all: out and inp share memory; every rank reads its peers' "
                         f"inp while they write their out, so in place is not possible: pass a separate out")
    ctx.agree_in_debug("all_to_all", tuple(inp.shape), inp.dtype)
    plan = new_plan(ctx, key)
    rows, inner = inp.shape[0] // w, math.prod(inp.shape[1:])
    source = _on_heap(ctx, inp, INPUT_STAGE, copy_in=True, plan=plan)  # equal sizes everywhere: collective
    # Equal splits: the offsets follow from the row count, so no split table is built or read.
    _launch(ctx, plan, kernels.all_to_all_kernel, rows * inner, source, out, workspace(ctx).table, inner, rows,
            EQUAL=True, BLOCK=_block(ctx, out.numel()))
    keep_plan(ctx, key, plan)
    return out


def broadcast(ctx, tensor: torch.Tensor, src: int, group=None) -> torch.Tensor:
    """Overwrite ``tensor`` on every rank with ``src``'s, in place, like ``torch.distributed.broadcast``.

    Example::

        trident.ccl.broadcast(ctx, weights, src=0)
    """
    ctx = team(ctx, group)  # the whole world, or the group's ranks, workspace and heap bases
    if ctx.spans_nodes:  # several nodes: trident inside each, torch.distributed between (one check)
        return hierarchical.broadcast(ctx, tensor, src)
    key = plan_key("broadcast", tensor, src)
    if replay(ctx, key):
        return tensor
    _check(ctx, "broadcast", tensor=tensor)
    if not isinstance(src, int) or not 0 <= src < ctx.world_size:
        raise ValueError(f"rank {ctx.rank}: broadcast: src={src!r} is not a rank (world size {ctx.world_size})")
    ctx.agree_in_debug("broadcast", tuple(tensor.shape), tensor.dtype, src)
    plan = new_plan(ctx, key)
    x = _on_heap(ctx, tensor, INPUT_STAGE, copy_in=ctx.rank == src, plan=plan)
    _launch(ctx, plan, kernels.broadcast_kernel, tensor.numel(), x, tensor.numel(), src,
            BLOCK=_block(ctx, tensor.numel()))
    if x is not tensor:
        _copy(ctx, plan, tensor, x)
    keep_plan(ctx, key, plan)
    return tensor
