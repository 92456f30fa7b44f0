"""trident.ops.moe_dispatch and moe_combine against a reference built from every rank's inputs.

Every rank makes every rank's tokens and routing from the same seeds, so each can say what it
must receive. Dispatch is checked expert by expert as a multiset (the order inside an expert is
free) through ``recv_src``, and row by row bitwise against the sender's token (and its fp8
scales). Combine is checked against ``sum_j w[t, j] * expert_j(x[t])`` in fp32, with every unused
row of the expert output set to NaN (it must be ignored). Tasks run inside the ranks and return a
list of problems (empty when all is well).
"""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch

from tests.conftest import get_pool
from tests.helpers import assert_no_problems
from trident import ccl
from trident.errors import CapacityError, DivergenceError
from trident.ops.moe.combine import moe_combine
from trident.ops.moe.dispatch import moe_dispatch
from trident.ops.moe.sizing import prefill_capacity
from trident.platform import SIMULATOR
from trident.testing import refusals

FP8 = torch.float8_e4m3fn


@dataclasses.dataclass(frozen=True)
class Case:
    """One call: tokens per rank (``tokens[r % len(tokens)]``), k, experts per rank, H, dtype, routing."""

    tokens: tuple
    k: int
    per_rank: int
    hidden: int
    dtype: torch.dtype
    routing: str  # "random" (with -1 entries), "one" (every token to the last expert), "same_rank"
    given: bool   # pass max_tokens_per_rank (the no-host-sync path) or let the ranks agree
    salt: int = 0
    layout: str = "contiguous"

    def t(self, rank: int) -> int:
        return self.tokens[rank % len(self.tokens)]


def _inputs(case: Case, rank: int, world: int):
    """Rank ``rank``'s (x, topk_idx, x_scales or None, topk_weights), on the CPU; the same on every rank."""
    g = torch.Generator().manual_seed(1000 * case.salt + 17 * rank + 3)
    T, k, E, E_l = case.t(rank), case.k, case.per_rank * world, case.per_rank
    x = torch.randn(T, case.hidden, generator=g) * 2
    if case.routing == "random":
        idx = torch.rand(T, E, generator=g).topk(k, dim=1).indices
        idx[torch.rand(T, k, generator=g) < 0.25] = -1
    elif case.routing == "one":
        idx = torch.full((T, k), -1, dtype=torch.int64)
        idx[:, 0] = E - 1
    else:  # all k experts of a token on one rank
        owners = (torch.arange(T) + rank) % world
        picks = [torch.randperm(E_l, generator=g)[:k] for _ in range(T)]
        idx = (torch.stack(picks) if picks else torch.zeros(0, k, dtype=torch.int64)) + owners[:, None] * E_l
    scales = (torch.rand(T, case.hidden // 128, generator=g) + 0.5) if case.dtype == FP8 else None
    weights = torch.rand(T, k, generator=g)
    return x.to(case.dtype), idx.to(torch.int64), scales, weights


def _dequant(x, scales):
    return x.float() if scales is None else x.float() * scales.repeat_interleave(128, dim=1)


def _call(ctx, case: Case, capacity=None, buffer_set=0):
    x, idx, scales, weights = _inputs(case, ctx.rank, ctx.world_size)
    dev = ctx.device
    M = max(case.t(r) for r in range(ctx.world_size)) if case.given else None
    d = moe_dispatch(ctx, x.to(dev), idx.to(dev), case.per_rank * ctx.world_size, max_tokens_per_rank=M,
                     capacity=capacity, x_scales=None if scales is None else scales.to(dev), layout=case.layout,
                     buffer_set=buffer_set)
    return d, weights


def _check_dispatch(ctx, case: Case, d, what: str) -> list[str]:
    W, r, E_l = ctx.world_size, ctx.rank, case.per_rank
    everyone = [_inputs(case, s, W) for s in range(W)]
    M = max(case.t(s) for s in range(W))
    problems = []
    if d.max_tokens_per_rank != M or d.recv_x.dtype != case.dtype or d.recv_x.shape != (d.capacity, case.hidden):
        problems.append(f"{what}: {d!r}, expected max_tokens_per_rank {M}")
    offsets, counts = d.recv_offsets.cpu().tolist(), d.recv_counts.cpu().tolist()
    src, rx = d.recv_src.cpu(), d.recv_x.cpu()
    scales = None if d.recv_scales is None else d.recv_scales.cpu()
    used = torch.zeros(d.capacity, dtype=torch.bool)
    if case.layout == "masked":  # a fixed region per local expert: W * M rows, or by the counts (rounded)
        region = d.expert_capacity
        busiest = max(sum(int((i == e).sum()) for _, i, _, _ in everyone) for e in range(E_l * W))
        want = W * M if case.given else -(-max(busiest, 1) // 64) * 64
        if region != want or d.capacity != E_l * region or offsets != [e * region for e in range(E_l)]:
            problems.append(f"{what}: masked layout: region {region}, capacity {d.capacity}, offsets {offsets}")
    for e in range(E_l):
        expert = r * E_l + e
        want = sorted(s * M + t for s, (_, idx, _, _) in enumerate(everyone)
                      for t, _ in (idx == expert).nonzero().tolist())
        rows = range(offsets[e], offsets[e] + counts[e])
        if rows.start < 0 or rows.stop > d.capacity or used[rows.start:rows.stop].any():
            problems.append(f"{what}: expert {expert}: rows {rows} overlap or leave the capacity {d.capacity}")
            continue
        used[rows.start:rows.stop] = True
        got = sorted(src[rows.start:rows.stop].tolist())
        if got != want:
            problems.append(f"{what}: expert {expert} received {got}, expected {want}")
            continue
        for row in rows:
            s, t = divmod(int(src[row]), M)
            x_s, _, scales_s, _ = everyone[s]
            if not torch.equal(rx[row].view(torch.uint8), x_s[t].view(torch.uint8)):
                problems.append(f"{what}: row {row} (rank {s} token {t}) differs from the sent token")
            if scales is not None and not torch.equal(scales[row], scales_s[t]):
                problems.append(f"{what}: row {row} (rank {s} token {t}): scales {scales[row]} != {scales_s[t]}")
    if case.layout == "contiguous" and not torch.all(src[~used] == -1):  # masked: unused rows not cleared
        problems.append(f"{what}: unused rows' recv_src are {src[~used].tolist()}, expected -1")
    return problems


def _expert(x, scales, expert, dtype):
    """What the test's expert ``expert`` makes of a row: its dequantised value times (expert + 1)."""
    return (_dequant(x, scales) * (expert + 1)).to(dtype)


def _check_combine(ctx, case: Case, d, weights, what: str, out_dtype=torch.bfloat16, on_heap=False) -> list[str]:
    """The combine of ``d`` against the reference; ``on_heap``: expert_out on the heap (the pull path)."""
    W, r, E_l = ctx.world_size, ctx.rank, case.per_rank
    rx = d.recv_x.cpu()
    scales = None if d.recv_scales is None else d.recv_scales.cpu()
    expert_out = torch.full((d.capacity, case.hidden), float("nan"), dtype=out_dtype)  # unused rows: ignored
    offsets, counts = d.recv_offsets.cpu().tolist(), d.recv_counts.cpu().tolist()
    for e in range(E_l):
        rows = slice(offsets[e], offsets[e] + counts[e])
        expert_out[rows] = _expert(rx[rows], None if scales is None else scales[rows], r * E_l + e, out_dtype)
    expert_out = ctx.as_symmetric(expert_out.to(ctx.device)) if on_heap else expert_out.to(ctx.device)
    out = moe_combine(ctx, expert_out, weights.to(ctx.device), d).cpu()
    if on_heap:
        ctx.free(expert_out)
    x, idx, x_scales, _ = _inputs(case, r, W)
    want = torch.zeros(x.shape[0], case.hidden)
    for t, j in (idx >= 0).nonzero().tolist():
        row = _expert(x[t:t + 1], None if x_scales is None else x_scales[t:t + 1], int(idx[t, j]), out_dtype)
        want[t] += weights[t, j] * row[0].float()
    if out.dtype != out_dtype or out.shape != want.shape:
        return [f"{what}: combine gave {out.dtype} {tuple(out.shape)}, expected {out_dtype} {tuple(want.shape)}"]
    tol = 1e-5 if out_dtype == torch.float32 else 2e-2
    if not torch.allclose(out.float(), want.to(out_dtype).float(), rtol=tol, atol=tol):
        return [f"{what}: combine differs by {(out.float() - want).abs().max().item():.3g}"]
    return []


def _run(ctx, case: Case, what: str, out_dtype=torch.bfloat16) -> list[str]:
    d, weights = _call(ctx, case)
    problems = _check_dispatch(ctx, case, d, what)
    # A wrong dispatch may leave rows undelivered, which a combine would wait for: then no rank combines.
    if any(ctx.all_gather_object("moe test: dispatch problems", bool(problems))):
        return problems or ["another rank's dispatch went wrong"]
    problems = _check_combine(ctx, case, d, weights, what, out_dtype)  # expert_out plain: pushed home
    return problems + _check_combine(ctx, case, d, weights, what + " (expert_out on the heap)", out_dtype,
                                     on_heap=True)  # read in place at its owners


CASES = [
    Case((6, 3, 5), 2, 2, 64, torch.bfloat16, "random", given=False, salt=1),  # T differs between ranks
    Case((4,), 2, 1, 32, torch.float16, "one", given=True, salt=2),            # every token to one expert
    Case((0, 5), 3, 3, 32, torch.bfloat16, "same_rank", given=True, salt=3),   # T = 0 on some ranks; k on one rank
    Case((3, 5), 2, 2, 256, FP8, "random", given=False, salt=4),              # fp8 with scales, passed through
]


def _cases_body(ctx):
    problems = []
    for case in CASES:
        problems += _run(ctx, case, f"rank {ctx.rank}/{ctx.world_size} {case}")
    return problems


@pytest.mark.parametrize("world", [2, 3, 4], ids=lambda w: f"{w}ranks")
def test_dispatch_and_combine_match_the_reference(world):
    assert_no_problems(get_pool(world), _cases_body)


def _any_order_body(ctx, orders):
    """Each launch's programs run in reverse, then in a shuffle of each rank's own: roles come from
    arrival tickets, so the planner and the pushers still run before whoever waits on them."""
    from tests.test_progress import _programs_run_in

    problems = []
    for order in orders:
        with _programs_run_in(order, ctx.rank + 1):
            for case in (CASES[0], MASKED_CASES[0]):
                problems += _run(ctx, case, f"rank {ctx.rank} programs {order} {case.layout}")
    return problems


@pytest.mark.skipif(not SIMULATOR, reason="the simulator runs a launch's programs in an order the test picks")
def test_programs_in_any_order():
    assert_no_problems(get_pool(2), _any_order_body, ("reversed", "shuffled"))


def _repeated_body(ctx):
    """The no-host-sync path on the same sizes again and again (epochs on the device), another collective
    and a call of other sizes in between, and an fp32 combine."""
    problems, other = [], ctx.zeros(16)
    for salt in range(3):
        case = Case((5, 2), 2, 2, 64, torch.bfloat16, "random", given=True, salt=10 + salt)
        problems += _run(ctx, case, f"rank {ctx.rank} call {salt}", out_dtype=torch.float32 if salt == 1 else
                         torch.bfloat16)
        other.fill_(1.0)
        ccl.all_reduce(ctx, other)
        if salt == 1:
            problems += _run(ctx, Case((2,), 1, 1, 32, torch.float32, "random", given=False, salt=20), "between")
    return problems


def test_repeated_calls():
    assert_no_problems(get_pool(2), _repeated_body)


def _chunked_count_body(ctx):
    """The routing counted in several chunks (the count's tally, read and reset by the planner): twice
    the same call (a tally not reset would double the second call's counts), then other expert counts
    (the tally is indexed by expert), then the first again, in any program order."""
    from tests.test_progress import _programs_run_in
    from trident.ops.moe import dispatch

    problems, chunk = [], dispatch.PLAN_CHUNK
    dispatch.PLAN_CHUNK = 16  # 13 tokens x 3 choices: 3 chunks of routing entries on rank 0
    ctx.call_cache.clear()
    try:
        first = Case((13, 7), 3, 2, 32, torch.bfloat16, "random", given=True, salt=30)
        other = Case((11, 9), 2, 5, 32, torch.bfloat16, "random", given=True, salt=31)
        for i, (case, order) in enumerate(((first, "by_id"), (first, "by_id"), (other, "reversed"),
                                           (first, "shuffled"))):
            with _programs_run_in(order, ctx.rank + 1):
                problems += _run(ctx, case, f"rank {ctx.rank} call {i} ({order}, E={case.per_rank * ctx.world_size})")
    finally:
        dispatch.PLAN_CHUNK = chunk
        ctx.call_cache.clear()
    return problems


def test_routing_counted_in_several_chunks():
    assert_no_problems(get_pool(2), _chunked_count_body)


def _group_body(ctx):
    """Over a group of ranks 0 and 2 of three (the agreement on T is then a one-element all-reduce), in both
    layouts (masked: the per-expert counts agreed by an all-reduce too, or max_tokens_per_rank given)."""
    group = ctx.new_group([0, 2])
    if group is None:
        return []
    case = Case((4, 2), 2, 1, 32, torch.bfloat16, "random", given=False, salt=30)
    x, idx, _, weights = _inputs(case, group.rank, group.world_size)
    problems = []
    for layout, given in (("contiguous", None), ("masked", 4), ("masked", None)):
        d = moe_dispatch(ctx, x.to(ctx.device), idx.to(ctx.device), 2, max_tokens_per_rank=given, group=group,
                         layout=layout)
        out = moe_combine(ctx, d.recv_x, weights.to(ctx.device), d, group=group).cpu().float()
        want = (weights * (idx >= 0)).sum(1, keepdim=True) * x.float()
        ok = torch.allclose(out, want.to(torch.bfloat16).float(), rtol=2e-2, atol=2e-2) and int(d.recv_counts.sum())
        if not ok:
            problems.append(f"group rank {group.rank}: {layout} (given={given}): the identity experts' combine is off")
    return problems


def test_in_a_group():
    assert_no_problems(get_pool(3), _group_body)


def _overflow_body(ctx):
    """Every token to expert 0: rank 0 must receive 8 rows; a capacity of 5 is an error on every rank,
    raised by the call (ranks agree on T, or the simulator) or by d.check(); then a good call works."""
    problems, r = [], ctx.rank
    case = Case((4,), 2, 1, 32, torch.bfloat16, "one", given=True, salt=40)
    x, idx, _, _ = _inputs(case, r, 2)
    idx[:, 0] = 0
    for given in (None, 4):
        try:
            d = moe_dispatch(ctx, x.to(ctx.device), idx.to(ctx.device), 2, max_tokens_per_rank=given, capacity=5)
            d.check()
            problems.append(f"rank {r}: capacity 5 for 8 rows was accepted (max_tokens_per_rank={given})")
        except CapacityError as exc:
            for fragment in (f"rank {r}", "capacity=5", "rank 0 had to receive 8 rows", "capacity >= 8"):
                if fragment not in str(exc):
                    problems.append(f"rank {r}: {fragment!r} not in {str(exc)!r}")
    ctx.check()  # nothing left behind
    # The context is still in step: good calls work, and an older result is refused.
    first, _ = _call(ctx, case)
    problems += _run(ctx, Case((3, 4), 2, 1, 32, torch.bfloat16, "random", given=True, salt=41), f"rank {r} after")
    messages = refusals({"stale": lambda: moe_combine(ctx, first.recv_x, torch.ones(4, 2, device=ctx.device), first)})
    if "not the latest moe_dispatch" not in messages["stale"]:
        problems.append(f"rank {r}: a stale dispatch result was not refused: {messages['stale']}")
    return problems


def test_overflowing_capacity_is_a_clear_error():
    assert_no_problems(get_pool(2), _overflow_body)


def _repeated_ids_body(ctx):
    """Every token names expert 0 in all k=3 of its slots (E/W = 2 < k): rank 0 receives W*T*k = 30
    rows. The default capacity covers it (it was W*T*min(k, E/W) = 20, a CapacityError), and the
    combine sums all k rows of a token (identity experts: x times the sum of its weights)."""
    problems, r, dev = [], ctx.rank, ctx.device
    x = (torch.arange(5 * 32, dtype=torch.float32).reshape(5, 32) / 64 + r).to(torch.bfloat16)
    idx, weights = torch.zeros(5, 3, dtype=torch.int64), torch.rand(5, 3, generator=torch.Generator().manual_seed(r))
    for given in (None, 5):
        d = moe_dispatch(ctx, x.to(dev), idx.to(dev), 4, max_tokens_per_rank=given)
        d.check()
        counts = d.recv_counts.cpu().tolist()
        capacity = 30 if given else prefill_capacity(30)  # prefill: the real counts, rounded up
        if d.capacity != capacity or counts != ([30, 0] if r == 0 else [0, 0]):
            problems.append(f"rank {r}: capacity {d.capacity}, counts {counts} (given={given})")
        problems += _identity_combine(ctx, d, x, weights, f"repeated ids (given={given})")
    return problems


def _identity_combine(ctx, d, x, weights, what: str) -> list[str]:
    """The combine of ``d`` with identity experts (``expert_out`` = the received rows) must give each
    token ``x`` times the sum of its weights, however many of its rows went to one expert."""
    out = moe_combine(ctx, d.recv_x.clone(), weights.to(ctx.device), d).float().cpu()
    want = x.float() * weights.sum(1, keepdim=True)
    if torch.allclose(out, want, rtol=2e-2, atol=2e-2):
        return []
    return [f"rank {ctx.rank}: combine of {what} off by {(out - want).abs().max():.3g}"]


def test_a_token_may_repeat_an_expert_id():
    assert_no_problems(get_pool(2), _repeated_ids_body)


MASKED_CASES = [
    Case((6, 3, 5), 2, 2, 64, torch.bfloat16, "random", given=True, salt=50, layout="masked"),
    Case((4,), 2, 1, 32, torch.float16, "one", given=True, salt=51, layout="masked"),  # one expert's region full
    Case((0, 5), 3, 3, 32, torch.bfloat16, "same_rank", given=True, salt=52, layout="masked"),
    Case((3, 5), 2, 2, 256, FP8, "random", given=False, salt=53, layout="masked"),  # ranks agree on T
]


def _masked_body(ctx):
    """The masked layout (no count exchange: senders claim slots at the owners' cursors), each case
    twice (the second call claims from cursors the first one reset), then the contiguous layout on
    the same buffers, then masked again."""
    problems = []
    for case in MASKED_CASES:
        for turn in range(2):
            problems += _run(ctx, case, f"rank {ctx.rank}/{ctx.world_size} {case} call {turn}")
    problems += _run(ctx, dataclasses.replace(MASKED_CASES[0], layout="contiguous"), f"rank {ctx.rank} contiguous")
    return problems + _run(ctx, MASKED_CASES[0], f"rank {ctx.rank} masked after contiguous")


@pytest.mark.parametrize("world", [2, 3], ids=lambda w: f"{w}ranks")
def test_masked_layout_matches_the_reference(world):
    assert_no_problems(get_pool(world), _masked_body)


def _quantized(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(fp8 rows, scales)`` of ``x`` [T, H] as ``moe_dispatch(quantize="fp8")`` documents them."""
    groups = x.float().reshape(x.shape[0], -1, 128)
    scales = groups.abs().amax(-1).clamp(min=1e-4) / 448.0
    return (groups / scales[..., None]).reshape(x.shape).to(FP8), scales


def _quantize_body(ctx):
    """bf16 tokens quantized to fp8 on the way, in both layouts: every received row and its scales
    are bitwise what the documented quantization of the sender's row gives, and the combine of the
    dequantized rows (identity experts) matches its reference."""
    problems, r, W, dev = [], ctx.rank, ctx.world_size, ctx.device
    for layout in ("contiguous", "masked"):
        case = Case((5, 3), 2, 2, 384, torch.bfloat16, "random", given=True, salt=70, layout=layout)
        everyone = [_inputs(case, s, W) for s in range(W)]
        x, idx, _, weights = everyone[r]
        M = max(case.t(s) for s in range(W))
        d = moe_dispatch(ctx, x.to(dev), idx.to(dev), 2 * W, max_tokens_per_rank=M, layout=layout, quantize="fp8")
        if d.recv_x.dtype != FP8 or d.recv_scales is None or d.recv_scales.shape != (d.capacity, 3):
            problems.append(f"rank {r} {layout}: {d!r}, expected fp8 rows and [capacity, 3] scales")
            continue
        src, rx, rs = d.recv_src.cpu(), d.recv_x.cpu(), d.recv_scales.cpu()
        offsets, counts = d.recv_offsets.cpu().tolist(), d.recv_counts.cpu().tolist()
        expert_out = torch.zeros(d.capacity, 384, dtype=torch.bfloat16)
        for e in range(2):
            for row in range(offsets[e], offsets[e] + counts[e]):
                s, t = divmod(int(src[row]), M)
                want_q, want_s = _quantized(everyone[s][0][t:t + 1])
                if not (torch.equal(rx[row].view(torch.uint8), want_q[0].view(torch.uint8))
                        and torch.equal(rs[row], want_s[0])):
                    problems.append(f"rank {r} {layout}: row {row} (rank {s} token {t}) is not its quantization")
                expert_out[row] = (rx[row].float() * rs[row].repeat_interleave(128)).to(torch.bfloat16)
        out = moe_combine(ctx, expert_out.to(dev), weights.to(dev), d).float().cpu()
        q, sc = _quantized(x)
        want = (q.float() * sc.repeat_interleave(128, dim=1)).to(torch.bfloat16).float()
        want = want * (weights * (idx >= 0)).sum(1, keepdim=True)
        if not torch.allclose(out, want, rtol=2e-2, atol=2e-2):
            problems.append(f"rank {r} {layout}: combine of the quantized rows off by {(out - want).abs().max():.3g}")
    return problems


def test_dispatch_quantizes_to_fp8_on_the_way():
    assert_no_problems(get_pool(2), _quantize_body)


def _masked_overflow_body(ctx):
    """Every token names expert 0 in both its slots: expert 0 must receive W*T*k = 16 rows. An error
    naming the region: raised on every rank before anything is sent when the ranks agree on the
    counts on the host (max_tokens_per_rank=None, a region of 8), else recorded on the device by the
    owner and by every sender that lost a row, and raised at the call (simulator) or by d.check(): a
    region of 4 leaves each rank's 8 claims with rows lost, whatever their order. The cursors are
    reset all the same, so a call with a region of 16 then gets every row, and its combine sums both
    rows of each token; with the counts agreed on the host and no capacity, the region is sized by them."""
    problems, r, dev = [], ctx.rank, ctx.device
    x = (torch.arange(4 * 32, dtype=torch.float32).reshape(4, 32) / 64 + r).to(torch.bfloat16)
    idx, weights = torch.zeros(4, 2, dtype=torch.int64), torch.rand(4, 2, generator=torch.Generator().manual_seed(r))
    for given, capacity in ((None, 8), (4, 4)):
        try:
            d = moe_dispatch(ctx, x.to(dev), idx.to(dev), 2, max_tokens_per_rank=given, capacity=capacity,
                             layout="masked")
            d.check()
            problems.append(f"rank {r}: a region of {capacity} rows for 16 was accepted (max_tokens_per_rank={given})")
        except CapacityError as exc:
            exact = given is None or r == 0  # a sender knows a lower bound only: the claims it saw
            for fragment in (f"rank {r}:", "layout='masked'", f"capacity={capacity} rows per local expert",
                             "an expert of rank 0 had to receive at least"):
                if fragment not in str(exc):
                    problems.append(f"rank {r}: {fragment!r} not in {str(exc)!r}")
            if exact and "at least 16 rows" not in str(exc):
                problems.append(f"rank {r}: 'at least 16 rows' not in {str(exc)!r}")
    ctx.check()  # nothing left behind
    for given, capacity, region in ((4, 16, 16), (None, None, 64)):
        d = moe_dispatch(ctx, x.to(dev), idx.to(dev), 2, max_tokens_per_rank=given, capacity=capacity,
                         layout="masked")
        d.check()
        if d.recv_counts.cpu().tolist() != ([16] if r == 0 else [0]) or d.expert_capacity != region:
            problems.append(f"rank {r}: counts {d.recv_counts.tolist()}, region {d.expert_capacity}, expected "
                            f"{region} (max_tokens_per_rank={given}, capacity={capacity})")
        problems += _identity_combine(ctx, d, x, weights, f"the masked layout (region {region})")
    return problems


def _micro_batches_body(ctx):
    """Two micro-batches in flight (dispatch A, dispatch B, then their combines), each in a buffer set
    of its own (B in the masked layout): both results stay valid side by side. A later dispatch of
    set 0 makes A stale (refused), and B stays valid."""
    r = ctx.rank
    a = Case((5, 3), 2, 2, 64, torch.bfloat16, "random", given=True, salt=60)
    b = Case((2, 6), 2, 2, 64, torch.bfloat16, "random", given=True, salt=61, layout="masked")
    d_a, w_a = _call(ctx, a, buffer_set=0)
    d_b, w_b = _call(ctx, b, buffer_set=1)
    problems = _check_dispatch(ctx, a, d_a, f"rank {r} A") + _check_dispatch(ctx, b, d_b, f"rank {r} B")
    problems += _check_combine(ctx, a, d_a, w_a, f"rank {r} A") + _check_combine(ctx, b, d_b, w_b, f"rank {r} B")
    _call(ctx, dataclasses.replace(a, salt=62), buffer_set=0)
    stale = refusals({"A": lambda: moe_combine(ctx, d_a.recv_x, w_a.to(ctx.device), d_a)})["A"]
    if "not the latest moe_dispatch of buffer_set=0" not in stale:
        problems.append(f"rank {r}: a stale set-0 result was not refused: {stale}")
    return problems + _check_combine(ctx, b, d_b, w_b, f"rank {r} B after a set-0 dispatch", on_heap=True)


def test_two_micro_batches_in_flight_take_a_buffer_set_each():
    assert_no_problems(get_pool(2), _micro_batches_body)


def test_masked_layout_overflow_is_a_clear_error():
    assert_no_problems(get_pool(2), _masked_overflow_body)


def _refusals_body(ctx):
    me, dev, problems = ctx.rank, ctx.device, []
    x = torch.ones(4, 32, device=dev, dtype=torch.bfloat16)
    idx = torch.tensor([[0, 1]] * 4, device=dev)  # one row per rank and token
    f8 = torch.ones(4, 128, device=dev).to(FP8)
    dispatch = {
        "experts not divisible": (lambda: moe_dispatch(ctx, x, idx, 3), ["num_experts=3", "divisible"]),
        "x int": (lambda: moe_dispatch(ctx, x.int(), idx, 2), ["x", "int32"]),
        "x 1-D": (lambda: moe_dispatch(ctx, x[0], idx, 2), ["x", "dimensions"]),
        "idx int32": (lambda: moe_dispatch(ctx, x, idx.int(), 2), ["topk_idx", "int32"]),
        "idx rows": (lambda: moe_dispatch(ctx, x, idx[:3], 2), ["topk_idx", r"\(3, 2\)"]),
        "too many tokens": (lambda: moe_dispatch(ctx, x, idx, 2, max_tokens_per_rank=3), ["max_tokens_per_rank=3"]),
        "capacity": (lambda: moe_dispatch(ctx, x, idx, 2, capacity=-1), ["capacity=-1"]),
        "layout": (lambda: moe_dispatch(ctx, x, idx, 2, layout="padded"), ["layout='padded'", "'masked'"]),
        "buffer set": (lambda: moe_dispatch(ctx, x, idx, 2, buffer_set=-1), ["buffer_set=-1", ">= 0"]),
        "quantize": (lambda: moe_dispatch(ctx, x, idx, 2, quantize="int8"), ["quantize='int8'", "'fp8'"]),
        "quantize H": (lambda: moe_dispatch(ctx, x, idx, 2, quantize="fp8"), ["quantize='fp8'", "multiple of 128"]),
        "fp8 without scales": (lambda: moe_dispatch(ctx, f8, idx, 2), ["x_scales"]),
        "scales shape": (lambda: moe_dispatch(ctx, f8, idx, 2, x_scales=torch.ones(4, 2, device=dev)),
                         ["x_scales", r"\(4, 2\)", r"\[4, 1\]"]),
        "scales for bf16": (lambda: moe_dispatch(ctx, x, idx, 2, x_scales=torch.ones(4, 1, device=dev)), ["x_scales"]),
    }
    d = moe_dispatch(ctx, x, idx, 2, max_tokens_per_rank=4)
    out = torch.ones(d.capacity, 32, device=dev, dtype=torch.bfloat16)
    w = torch.ones(4, 2, device=dev)
    combine = {
        "not a dispatch": (lambda: moe_combine(ctx, out, w, "d"), ["MoEDispatch"]),
        "rows": (lambda: moe_combine(ctx, out[:-1], w, d), ["expert_out", f"capacity={d.capacity}"]),
        "weights": (lambda: moe_combine(ctx, out, w[:, :1].contiguous(), d), ["topk_weights", r"\(4, 1\)"]),
        "fp8 out": (lambda: moe_combine(ctx, out.to(FP8), w, d), ["expert_out", "float8"]),
    }
    for op, calls in (("moe_dispatch", dispatch), ("moe_combine", combine)):
        messages = refusals({name: call for name, (call, _) in calls.items()})
        for name, (_, fragments) in calls.items():
            for fragment in [f"rank {me}", op] + fragments:
                if not re.search(fragment, messages[name]):
                    problems.append(f"{name}: {fragment!r} not in {messages[name]!r}")
    # Still in step: the combine of the valid dispatch works.
    got = moe_combine(ctx, d.recv_x, w, d).cpu().float()
    if not torch.allclose(got, torch.full((4, 32), 2.0)):
        problems.append(f"rank {me}: the combine after the refusals gave {got[0, :4]}")
    return problems


def test_bad_input_is_refused():
    assert_no_problems(get_pool(2), _refusals_body)


def _mixed_placement_body(ctx):
    case = CASES[0]
    d, weights = _call(ctx, case)
    expert_out = torch.zeros(d.capacity, case.hidden, dtype=torch.bfloat16, device=ctx.device)
    moe_combine(ctx, expert_out, weights.to(ctx.device), d)  # the combine's buffers exist, in step
    mixed = ctx.as_symmetric(expert_out) if ctx.rank == 0 else expert_out  # the heap on rank 0 only
    moe_combine(ctx, mixed, weights.to(ctx.device), d)
    with pytest.raises(DivergenceError, match="lies at heap offset"):
        ctx.check()
    problems = _check_combine(ctx, case, d, weights, "after a refused combine")  # the context is still in step
    return problems


def test_expert_out_on_the_heap_on_some_ranks_only_fails_clearly():
    assert_no_problems(get_pool(2), _mixed_placement_body)


# -- sm_90 ------------------------------------------------------------------------------------------------

COMPILE_CHILD = r'''
import json
from tests.sm90_harness import outcome, with_ones
from trident.ops.moe.combine_kernels import moe_pull_kernel, moe_push_kernel, moe_reduce_kernel
from trident.ops.moe.kernels import moe_dispatch_kernel

TEAM = {"sync_ptr": "*i64", "rank": "i32", "world_size": "i32", "heap_bases": "*i64"}
DISPATCH = {**TEAM, "x_ptr": "*i32", "topk_ptr": "*i64", "recv_x_ptr": "*i32", "recv_src_ptr": "*i64",
            "recv_j_ptr": "*i32", "counts_ptr": "*i32", "local_ptr": "*i32", "status_ptr": "*i64"}
DISPATCH_SIZES = ("tokens", "row_words", "scale_words", "k", "experts_local", "max_tokens", "capacity")
PUSH = {**TEAM, "expert_ptr": "*bf16", "staging_ptr": "*bf16", "recv_src_ptr": "*i64", "recv_j_ptr": "*i32",
        "layout_ptr": "*i32"}
PUSH_SIZES = ("hidden", "k", "max_tokens", "experts_local")
REDUCE = {"rank": "i32", "expert_ptr": "*bf16", "staging_ptr": "*bf16", "out_ptr": "*bf16", "weights_ptr": "*fp32",
          "sent_ptr": "*i32"}
REDUCE_SIZES = ("tokens", "hidden", "k", "capacity")
PULL = {**TEAM, "expert_ptr": "*bf16", "out_ptr": "*bf16", "weights_ptr": "*fp32", "sent_ptr": "*i32"}
ONES = ("rank", "world_size", "tokens", "k", "experts_local", "max_tokens")  # Triton's 1-specialisation


def build(name, kernel, signature, sizes, meta, ones, check=None):
    """``sizes`` name the elements of the kernel's ``sizes`` tuple (i32; constants of 1 with ``ones``)."""
    meta = dict(meta)
    at = kernel.arg_names.index("sizes")
    types = []
    for i, size in enumerate(sizes):
        if ones and size in ONES:
            types.append("constexpr")
            meta[(at, i)] = 1
        else:
            types.append("i32")
    signature = {**signature, "sizes": tuple(types)}
    sig = {a: ("constexpr" if a in meta else signature[a]) for a in kernel.arg_names}
    if ones:
        sig, meta = with_ones(sig, meta, ONES)
    results[name + ("-ones" if ones else "")] = outcome(kernel, sig, meta, check, num_warps=8)


results = {}
for ones in (False, True):
    for fp8, masked, quantize in ((False, False, False), (True, False, False), (False, True, False),
                                  (False, True, True)):
        scale = "*fp32" if fp8 else "constexpr"
        # 4 tokens of 8 choices a step, 1024-word chunks: DeepSeek-V3's bf16 rows
        meta = {"BLOCKS": (256, 4, 8, 1024, 1024, 64), "OPTIONS": (True, masked, quantize),
                "WORLD_BLOCK": 8}
        if not fp8:
            meta.update(scales_ptr=None, recv_scales_ptr=None)
        signature = {**DISPATCH, "scales_ptr": scale, "recv_scales_ptr": scale}
        if quantize:  # bf16 rows in, fp8 rows and their scales out
            meta.pop("recv_scales_ptr")
            signature.update(x_ptr="*bf16", recv_x_ptr="*fp8e4nv", recv_scales_ptr="*fp32")
        build(f"dispatch fp8={fp8} masked={masked} quantize={quantize}", moe_dispatch_kernel, signature,
              DISPATCH_SIZES, meta, ones, "atom")
    build("combine push", moe_push_kernel, PUSH, PUSH_SIZES, {"ROWS": 4, "BLOCK_H": 1024, "WORLD_BLOCK": 8}, ones)
    build("combine reduce", moe_reduce_kernel, REDUCE, REDUCE_SIZES, {"K_BLOCK": 8, "BLOCK_H": 1024}, ones)
    build("combine pull", moe_pull_kernel, PULL, REDUCE_SIZES, {"K_BLOCK": 8, "BLOCK_H": 1024, "WORLD_BLOCK": 8}, ones)
print(json.dumps(results))
'''


@pytest.mark.sm90_child(COMPILE_CHILD)
def test_kernels_compile_for_sm90(tmp_path):
    from tests.sm90_harness import assert_compiled

    assert_compiled(COMPILE_CHILD, tmp_path, 14)
