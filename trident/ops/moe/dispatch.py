"""MoE dispatch: send tokens to the ranks of their experts (the combine, :mod:`.combine`, brings them back).

``d = moe_dispatch(ctx, x, topk_idx, num_experts)`` sends each token row of ``x`` to the rank of
each of its top-k experts (rank r owns experts ``[r * E/W, (r+1) * E/W)``); ``d.recv_x`` then holds
this rank's rows, grouped by local expert. ``moe_combine(ctx, expert_out, topk_weights, d)`` sends
every expert output row back to its token's rank and sums them there, weighted, in fp32.

A dispatch is one kernel with no host synchronisation when ``max_tokens_per_rank`` is given: the
ranks exchange their counts on the device, each sender computes where its rows go from every
rank's counts, and stores them straight into the receiver's buffer on the symmetric heap
(:mod:`trident.ops.moe.kernels`; docs/moe.md has the layout and the protocol). Counts, offsets and
the overflow check stay on the device, so the calls can be captured in a CUDA graph.

The receive buffers belong to the context (its ops workspace, on the heap): a dispatch result is
valid until the next ``moe_dispatch`` on the same context or group; ``moe_combine`` refuses an
older one.

Example::

    d = trident.ops.moe_dispatch(ctx, x, topk_idx, num_experts=64, max_tokens_per_rank=128)
    y = my_grouped_gemm(d.recv_x, d.recv_offsets, d.recv_counts)   # one row per received row
    out = trident.ops.moe_combine(ctx, y, topk_weights, d)          # [T, H] on every token's rank
"""

from __future__ import annotations

import numbers

import torch
import triton

from ...calls import Op, run_call
from ...ccl.api import all_reduce
from ...ccl.workspace import workspace
from ...errors import CapacityError, DivergenceError
from ...faults import describe_capacity_fault
from ...runtime.groups import Group, team
from ..fused import multinode
from ..fused.call import check_tensor
from ..fused.sync import sync_block
from .kernels import MAX_EXPERTS, STATUS_NEEDED, STATUS_WORDS, STATUS_WORST, moe_dispatch_kernel
from .result import DispatchCount, MoEDispatch, MoEHandle, buffer_names
from .sizing import MASKED_ROWS_ROUNDING, SCALE_BLOCK, prefill_capacity, receive_rows

#: Token dtypes ``moe_dispatch`` moves (bits, unchanged: fp8 is passed through, not requantised).
X_DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn)
#: The dtype of fp8 tokens, passed through with ``x_scales`` or made by ``quantize="fp8"``.
FP8 = torch.float8_e4m3fn
#: Words (of the row's word type) one step of the dispatch, or of the combine's push, moves: a block of
#: rows of ``BLOCK_R`` (``BLOCK_H``) words.
TILE_WORDS = 4096
#: Most words (or columns, when quantizing) of a row one step of a full tile of tokens moves at once
#: (a step of fewer tokens takes wider chunks: :func:`_step_shape`).
MAX_BLOCK_R = 1024
#: Most tokens one step of the dispatch moves (each to all its k experts: the row is read once).
TOKENS_PER_STEP = 16
#: Programs a dispatch launches per SM (at most one per step): a program's steps run one after
#: another, each a chain of dependent memory operations (ids, slot claims, rows), so several programs
#: per SM keep the rows of several steps in flight at once. 8, with 4 warps each, from the launch-shape
#: sweep on an H100 (2026-12-06, docs/moe.md): 1.7x faster than one program of 8 warps per SM at
#: DeepSeek-V3's 4096-token bf16 dispatch (270 against 452 us); 4 tied with 8 after the read-once
#: steps of 2026-12-07 (228.1 against 230.3 us bf16).
PROGRAMS_PER_SM = 8
#: Routing entries a program counts at once: programs claim chunks of the rank's routing and count
#: them in parallel, and the one that counts the last chunk plans (a decode-sized call is one chunk).
#: 1024 from the A/B of 2026-12-07 (one H100, docs/moe.md): at DeepSeek-V3's 4096 tokens, fp8 131.8
#: against 137.8 us with 4096-entry chunks, bf16 224.2 against 230.3.
PLAN_CHUNK = 1024
#: Warps of a dispatch program (0: 4 for rows of up to 512 words or columns, else 8).
WARPS = 4
#: How ``recv_x`` is laid out: experts one after another, each as long as it needs ("contiguous"),
#: or a fixed region of ``capacity`` rows per local expert, as DeepGEMM's masked grouped GEMMs read
#: it ("masked": no count exchange, the decode path).
LAYOUTS = ("contiguous", "masked")
#: What ``moe_dispatch`` can quantize rows to on their way (``quantize=``): fp8 e4m3 with a float32
#: scale per 128 columns, as fp8 tokens with ``x_scales`` travel.
QUANTIZE = ("fp8",)


def fail(where: str, message: str, kind=ValueError):
    """Raise ``kind`` with ``where: message`` (the MoE calls' argument errors)."""
    raise kind(f"{where}: {message}")


def _check_int(where: str, name: str, value, low: int, optional: bool = True) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
        fail(where, f"{name}={value!r} must be an int >= {low}{' or None' if optional else ''}")


def _check_dispatch(ctx, where, x, topk_idx, num_experts, max_tokens_per_rank, capacity, x_scales, layout,
                    buffer_set, quantize) -> None:
    check_tensor(where, "x", x, ctx.device, X_DTYPES, dims=2)
    check_tensor(where, "topk_idx", topk_idx, ctx.device, (torch.int64,), dims=2)
    tokens, hidden = x.shape
    if topk_idx.shape[0] != tokens or topk_idx.shape[1] < 1:
        fail(where, f"topk_idx {tuple(topk_idx.shape)} must be [T, k] with x's T={tokens} and k >= 1")
    if hidden < 1:
        fail(where, f"x {tuple(x.shape)} has no columns")
    _check_int(where, "num_experts", num_experts, 1, optional=False)
    if num_experts % ctx.world_size or num_experts > MAX_EXPERTS:
        fail(where, f"num_experts={num_experts} must be divisible by the world size {ctx.world_size} (rank r "
                     f"owns experts [r*E/W, (r+1)*E/W)) and at most {MAX_EXPERTS}")
    _check_int(where, "max_tokens_per_rank", max_tokens_per_rank, 0)
    if max_tokens_per_rank is not None and tokens > max_tokens_per_rank:
        fail(where, f"x has {tokens} tokens, more than max_tokens_per_rank={max_tokens_per_rank}")
    _check_int(where, "capacity", capacity, 0)
    _check_int(where, "buffer_set", buffer_set, 0, optional=False)
    if layout not in LAYOUTS:
        fail(where, f"layout={layout!r} must be one of {LAYOUTS}")
    if quantize is not None:
        if quantize not in QUANTIZE:
            fail(where, f"quantize={quantize!r} must be None or one of {QUANTIZE}")
        if x.dtype == FP8 or x_scales is not None or hidden % SCALE_BLOCK:
            fail(where, f"quantize='fp8' takes bf16, fp16 or fp32 x with H a multiple of {SCALE_BLOCK} and no "
                         f"x_scales (the scales are made on the way); got x {x.dtype} {tuple(x.shape)}"
                         f"{' and x_scales' if x_scales is not None else ''}")
        return
    if x.dtype != FP8:
        if x_scales is not None:
            fail(where, f"x_scales is only for float8_e4m3fn tokens; x is {x.dtype}")
        return
    if x_scales is None:
        fail(where, "float8_e4m3fn tokens need x_scales [T, H/128] float32 (they travel with their rows)")
    check_tensor(where, "x_scales", x_scales, ctx.device, (torch.float32,), dims=2)
    if hidden % SCALE_BLOCK or tuple(x_scales.shape) != (tokens, hidden // SCALE_BLOCK):
        fail(where, f"x_scales {tuple(x_scales.shape)} must be [T, H/{SCALE_BLOCK}] = "
                     f"[{tokens}, {hidden / SCALE_BLOCK:g}] for x {tuple(x.shape)} (H a multiple of {SCALE_BLOCK})")


def _agree(ctx, where: str, tokens: int, facts: tuple, sends: torch.Tensor) -> tuple[int, int, int]:
    """``(largest T of any rank, most rows any receiver takes, that receiver)`` from one small host exchange, given this
    rank's ``sends`` (int64: rows it routes to each receiver, a rank or an expert); also checks that every
    rank passed the same sizes and options. Inside a group (no host store of its own): two small all-reduces."""
    if isinstance(ctx, Group):
        count = torch.tensor([tokens], dtype=torch.int64, device=ctx.device)
        all_reduce(ctx, count, op="max")
        into = sends.clone()
        all_reduce(ctx, into)  # into[r]: rows every rank routes to receiver r
        return int(count.item()), int(into.max().item()), int(into.argmax().item())
    everyone = ctx.all_gather_object("moe_dispatch tokens", (tokens, facts, sends.tolist()))
    if len({f for _, f, _ in everyone}) > 1:
        listing = "; ".join(f"rank {r}: {f}" for r, (_, f, _) in enumerate(everyone))
        raise DivergenceError(f"{where}: ranks passed different (H, k, num_experts, dtype, capacity, scales, layout, "
                              f"buffer_set, quantize): {listing}")
    received = [sum(s[r] for _, _, s in everyone) for r in range(len(sends))]
    return max(t for t, _, _ in everyone), max(received), received.index(max(received))


def _step_shape(max_tokens: int, row: int, program_limit: int) -> tuple[int, int]:
    """``(tokens, block_r)``: the tokens one dispatch step moves and the words (or columns, when
    quantizing) of a row it moves at once, for rows of ``row`` words (columns).

    A step is a tile of about :data:`TILE_WORDS` words: rows in chunks of at most :data:`MAX_BLOCK_R`,
    as many tokens as fill the tile (at most :data:`TOKENS_PER_STEP`), halved while that leaves fewer
    steps than the GPU has program slots (a decode-sized call spreads its few tokens over more SMs).
    A step left with fewer tokens takes wider chunks, so that its tile stays :data:`TILE_WORDS`: a
    chunk's stores wait on its load, so a decode program (one token) reads its row in one trip to
    memory rather than one per chunk (four for DeepSeek-V3's bf16 rows: docs/moe.md, "The decode
    dispatch taken apart")."""
    widest = triton.next_power_of_2(row)
    block_r = min(widest, MAX_BLOCK_R)
    tokens = min(TOKENS_PER_STEP, max(1, TILE_WORDS // block_r))
    while tokens > 1 and triton.cdiv(max_tokens, tokens) < program_limit:
        tokens //= 2
    return tokens, min(widest, max(block_r, TILE_WORDS // tokens))


def _word_dtype(row_bytes: int) -> torch.dtype:
    """The widest integer that tiles a row: rows are moved as raw words, never converted."""
    return torch.int32 if row_bytes % 4 == 0 else torch.int16 if row_bytes % 2 == 0 else torch.uint8


def moe_dispatch(ctx, x: torch.Tensor, topk_idx: torch.Tensor, num_experts: int,
                 max_tokens_per_rank: int | None = None, capacity: int | None = None,
                 x_scales: torch.Tensor | None = None, group=None, layout: str = "contiguous",
                 buffer_set: int = 0, quantize: str | None = None) -> MoEDispatch:
    """Send every token to the ranks of its top-k experts (collective): one kernel, no host sync.

    Args:
        x: ``[T, H]`` this rank's tokens: bf16, fp16, fp32, or float8_e4m3fn (with ``x_scales``). Any
            placement (read locally). T may differ between ranks.
        topk_idx: ``[T, k]`` int64: expert ids in ``[0, num_experts)``, or -1 for none. Each valid
            (token, j) becomes one received row (a token may have several experts on one rank).
        num_experts: E, divisible by the world size: rank r owns experts ``[r*E/W, (r+1)*E/W)``.
        max_tokens_per_rank: a bound on every rank's T, the same on every rank. None: the ranks
            agree on their largest T through one small host exchange (and the call waits for the
            device to check the capacity). Given: nothing on the host waits, and the call can be
            captured in a CUDA graph.
        capacity: rows of the receive buffer (in the masked layout: rows per local expert, default
            ``W * max_tokens_per_rank``, every token naming an expert at most once); default the worst
            case ``W * max_tokens_per_rank * k`` (a token may name one expert, or experts of one rank,
            in all its k slots). A smaller one
            that the routing overflows is an error (:class:`~trident.errors.CapacityError`), never a
            silent drop: raised by this call when ``max_tokens_per_rank`` is None (or in the
            simulator), else recorded on the device and raised by ``d.check()``, ``ctx.check()`` or
            ``ctx.barrier()``.
        x_scales: ``[T, H/128]`` float32 with fp8 ``x``: each row's scales travel with it.
        group: a group of ``ctx`` (``ctx.new_group``) to run over, or None for the whole world.
        layout: ``"contiguous"`` (default: each expert's rows right after the previous expert's; the
            ranks exchange their counts first) or ``"masked"`` (a fixed region of ``capacity`` rows
            per local expert, ``[E_local, capacity, H]`` as masked grouped GEMMs take it, as DeepEP's
            low-latency mode: senders claim slots at the owner, no count exchange; for decode).
        buffer_set: which set of receive buffers (0, 1, ...) the result goes to: a result stays valid
            until the next dispatch of its own set, so two micro-batches in flight (dispatch A,
            dispatch B, combine A, combine B) take sets 0 and 1. Each set costs its own receive
            buffers on the heap (``moe_heap_bytes(..., buffer_sets=)``); calls stay stream-ordered.
        quantize: ``"fp8"``: bf16, fp16 or fp32 ``x`` is quantized on the way (one kernel, no separate
            quantization pass): ``recv_x`` is float8_e4m3fn and ``recv_scales`` ``[capacity, H/128]``
            float32 with ``x ~ recv_x * scale`` per 128 columns (``scale = max(amax, 1e-4) / 448``),
            as DeepEP's low-latency dispatch does. None: rows travel as they are.

    Returns:
        An :class:`MoEDispatch` (receive buffers, per-expert offsets and counts, origins).

    Example::

        d = trident.ops.moe_dispatch(ctx, x, topk_idx, num_experts=256, max_tokens_per_rank=128)
    """
    me = team(ctx, group)
    rec = run_call(me, MOE_DISPATCH, (x, topk_idx, x_scales),
                   (num_experts, max_tokens_per_rank, capacity, layout, buffer_set, quantize))
    state = me.resource(buffer_names(buffer_set)[1], DispatchCount)
    state.calls += 1
    got = rec.memo
    offsets, recv_counts = got["layout"].view(2, got["experts_local"])
    masked = layout == "masked"
    scaled = x_scales is not None or quantize is not None
    return MoEDispatch(got["recv_x"].view(FP8 if quantize else x.dtype), offsets, recv_counts, got["recv_src"],
                       got["recv_scales"] if scaled else None, num_experts, got["experts_local"],
                       got["max_tokens"], got["rows"], topk_idx,
                       MoEHandle(got["recv_j"], got["status"], got["layout"],
                                 got["sent"][:x.shape[0] * topk_idx.shape[1]], me, state.calls),
                       layout, got["rows"] // got["experts_local"] if masked else None, buffer_set)


def _check_dispatch_call(team, tensors, options) -> None:
    (x, topk_idx, x_scales), (num_experts, max_tokens_per_rank, capacity, layout, buffer_set, quantize) = \
        tensors, options
    _check_dispatch(team, f"{team.who()}: moe_dispatch", x, topk_idx, num_experts, max_tokens_per_rank,
                    capacity, x_scales, layout, buffer_set, quantize)


def _run_dispatch(team, rec, tensors, options) -> None:
    (x, topk_idx, x_scales), (num_experts, max_tokens_per_rank, capacity, layout, buffer_set, quantize) = \
        tensors, options
    ctx, where = team, f"{team.who()}: moe_dispatch"
    (tokens, hidden), k, world = x.shape, topk_idx.shape[1], ctx.world_size
    facts = (hidden, k, num_experts, str(x.dtype), capacity, x_scales is not None, layout, buffer_set, quantize)
    experts_local = num_experts // world
    masked = layout == "masked"
    if max_tokens_per_rank is None:  # the host exchange sizes the receive buffer by the real counts
        valid = topk_idx[(topk_idx >= 0) & (topk_idx < num_experts)]
        # Rows per receiving rank, or per expert in the masked layout (a region each).
        bins = valid if masked else torch.div(valid, experts_local, rounding_mode="floor")
        sends = torch.bincount(bins, minlength=num_experts if masked else world)
        max_tokens, received, busiest = _agree(ctx, where, tokens, facts, sends)
        if masked and capacity is not None and received > capacity:  # every rank knows: nothing is sent
            raise CapacityError(describe_capacity_fault(ctx.rank, busiest // experts_local, capacity, received, True))
        if capacity is None:
            capacity = prefill_capacity(received, MASKED_ROWS_ROUNDING) if masked else prefill_capacity(received)
    else:
        max_tokens = int(max_tokens_per_rank)
        ctx.agree_in_debug("moe_dispatch", *facts, max_tokens)
    if ctx.debug:  # the kernel ignores ids outside [-1, E) like -1; the debug mode refuses them on every rank
        bad = topk_idx[(topk_idx < -1) | (topk_idx >= num_experts)].unique().tolist()
        ctx.agree_in_debug("moe_dispatch: topk_idx ids outside [-1, num_experts)", bad)
        if bad:
            fail(where, f"topk_idx holds ids outside [-1, {num_experts}): {bad}")
    rows = receive_rows(layout, world, max_tokens, k, experts_local, capacity)
    # Every buffer is asked for on every rank with the same size (collective), in the same order. A buffer
    # set's own: what the result holds; shared by the sets: what only lives during a call.
    ws, prefix = workspace(ctx), buffer_names(buffer_set)[0]
    row_bytes = hidden * (1 if quantize else x.element_size())  # a received row
    word = _word_dtype(row_bytes)
    row_words = row_bytes // word.itemsize
    recv_words = ws.buffer(f"{prefix}.recv_x", rows * row_words, word).view(rows, row_words)
    scale_cols = hidden // SCALE_BLOCK if x_scales is not None or quantize else 0
    recv_scales = ws.buffer(f"{prefix}.recv_scales", rows * scale_cols, torch.float32).view(rows, scale_cols)
    recv_src = ws.buffer(f"{prefix}.recv_src", rows, torch.int64)
    recv_j = ws.buffer(f"{prefix}.recv_j", rows, torch.int32)
    if masked:  # the cursors senders claim slots at; zero between calls (the kernel resets them)
        counts = ws.buffer("moe.cursors", experts_local, torch.int32, zeroed=True)
    else:
        counts = ws.buffer("moe.counts", MAX_EXPERTS + world * num_experts, torch.int32, zeroed=True)  # tally, matrix
    local = ws.buffer(f"{prefix}.local", 2 * num_experts + 2 * experts_local + max_tokens * k, torch.int32)
    sent = local[2 * num_experts + 2 * experts_local:]  # where each (token, j) went: the combine's map
    status = ws.buffer(f"{prefix}.status", STATUS_WORDS, torch.int64)
    sync = sync_block(ctx, world + 1)  # flags: the count rows and the layout
    rec.memo.update(recv_x=recv_words, recv_scales=recv_scales, recv_src=recv_src, recv_j=recv_j,
                    layout=local[2 * num_experts:2 * num_experts + 2 * experts_local], status=status, sent=sent,
                    experts_local=experts_local, max_tokens=max_tokens, rows=rows)
    if max_tokens == 0:  # no rank has a token (every rank knows): nothing to send
        rec.every_replay(local.zero_)
        rec.every_replay(status.zero_)
        if masked:  # the regions still start where the layout says
            starts = torch.arange(experts_local, dtype=torch.int32, device=ctx.device) * (rows // experts_local)
            rec.every_replay(lambda: local[2 * num_experts:2 * num_experts + experts_local].copy_(starts))
    else:
        per_step, block_r = _step_shape(max_tokens, hidden if quantize else row_words,  # columns, or words
                                        ctx.platform.program_limit)
        programs = max(1, min(PROGRAMS_PER_SM * ctx.platform.program_limit, triton.cdiv(max_tokens, per_step)))
        rec.launch(moe_dispatch_kernel, (programs,), (
            x if quantize else x.view(word), x_scales, topk_idx,  # quantized: x's values; else raw words
            recv_words.view(FP8) if quantize else recv_words, recv_scales if scale_cols else None, recv_src, recv_j,
            counts, local, status,  # local holds offsets and recv_counts too
            (tokens, hidden if quantize else row_words, scale_cols, k, experts_local, max_tokens, rows),
            sync, ctx.rank, world, ctx.heap_bases),
            dict(BLOCKS=(triton.next_power_of_2(num_experts), per_step, triton.next_power_of_2(k),  # E_BLOCK,
                         # TOKENS, K_BLOCK
                         min(PLAN_CHUNK, triton.next_power_of_2(max(max_tokens * k, 16))), block_r,  # CHUNK, BLOCK_R
                         triton.next_power_of_2(max(scale_cols, 1))),  # BLOCK_S
                 OPTIONS=(max_tokens_per_rank is not None, masked, quantize is not None),
                 WORLD_BLOCK=triton.next_power_of_2(world)),
            num_warps=WARPS or (4 if block_r <= 512 else 8))
    if max_tokens_per_rank is None:  # this call synchronises anyway: check the capacity now
        needed, worst = status[STATUS_NEEDED:STATUS_WORST + 1].tolist()
        bound = rows // experts_local if masked else rows
        if needed > bound:
            raise CapacityError(describe_capacity_fault(ctx.rank, worst, bound, needed, masked))
    elif ctx.platform.simulator:  # the kernel recorded any overflow; the simulator raises faults at once
        world_ctx = getattr(ctx, "ctx", ctx)
        rec.every_replay(world_ctx.check)


#: The dispatch as the call pipeline runs it. A call with ``max_tokens_per_rank`` given replays on
#: new tokens; without it every call agrees on T with the host (and checks the capacity): the full path.
MOE_DISPATCH = Op("moe_dispatch", _check_dispatch_call, _run_dispatch,
                  refusal=lambda team: multinode.refuse(team, "moe_dispatch"),
                  cacheable=lambda options: options[1] is not None)


__all__ = ["moe_dispatch", "MoEDispatch", "MoEHandle", "MOE_DISPATCH", "LAYOUTS", "QUANTIZE", "X_DTYPES", "SCALE_BLOCK",
           "MAX_EXPERTS", "STATUS_WORDS"]
