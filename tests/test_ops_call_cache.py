"""The fused ops' small-call path (trident.ops.call_cache): a repeated call reuses its decisions,
and where its pattern is replayable, replays the launches its first call recorded.

Pinned here: repeated calls on the same buffers with new data give the right results and keep
one entry, for every op and replayable pattern (heap and plain inputs); a call on other buffers
gets its own; a bad call after good ones still raises; a buffer that grows, or a heap_scope that
ends, stops a recording from being replayed; the cache keeps no tensor alive; the debug mode keeps
nothing.
"""

import gc
import weakref

import pytest
import torch

from tests.conftest import get_pool
from trident import ops, platform
from trident.kernels.prepared import PlanCache
from trident.ops.call_cache import RESOURCE_KEY


def _repeat(ctx):
    w, r = ctx.world_size, ctx.rank
    dtype = torch.float32
    A, B_local, C = torch.zeros(32, 16, device=ctx.device), torch.zeros(16, 8, device=ctx.device), ctx.zeros(32, 8 * w)
    wrong = []
    for step in range(3):
        A.copy_(torch.full((32, 16), float(step + 1)))
        B_local.copy_(torch.full((16, 8), float(r + 1)))
        ops.gemm_all_scatter(ctx, A, B_local, C, pattern="fused_sequential")
        expect = torch.cat([torch.full((32, 8), 16.0 * (step + 1) * (p + 1), dtype=dtype) for p in range(w)], dim=1)
        if not torch.equal(C.cpu(), expect):
            wrong.append(f"step {step}")
    entries = len(ctx.resource(RESOURCE_KEY, PlanCache))
    A2 = torch.ones(32, 16, device=ctx.device)
    ops.gemm_all_scatter(ctx, A2, B_local, C, pattern="producer_consumer")  # other memory: a second entry
    entries2 = len(ctx.resource(RESOURCE_KEY, PlanCache))
    try:
        ops.gemm_all_scatter(ctx, A, B_local, C, pattern="no_such_pattern")
        raised = ""
    except ValueError as exc:
        raised = str(exc)
    probe = weakref.ref(A2)  # producer_consumer is not replayable: its entry holds decisions only
    del A2
    gc.collect()
    return wrong, entries, entries2, raised, probe() is None


def test_repeated_fused_calls_reuse_their_decisions_and_keep_no_tensor(pool2):
    for wrong, entries, entries2, raised, freed in pool2.run(_repeat):
        assert not wrong, wrong
        assert entries == 1 and entries2 == 2
        assert "no_such_pattern" in raised
        assert freed  # the cache holds decisions, never the operands


def _debug(ctx):
    A, B_local, C = torch.ones(16, 16, device=ctx.device), torch.ones(16, 8, device=ctx.device), ctx.zeros(16, 16)
    for _ in range(2):
        ops.gemm_all_scatter(ctx, A, B_local, C, pattern="fused_sequential")
    return len(ctx.resource(RESOURCE_KEY, PlanCache)), C.cpu().clone()  # a copy: the heap stays in the rank


def test_the_debug_mode_keeps_no_decision():
    for entries, C in get_pool(2, TRIDENT_DEBUG="1").run(_debug):
        assert entries == 0 and torch.all(C == 16)


#: (op, pattern) pairs whose repeated calls replay the first call's launches.
REPLAYED = [(op, pattern) for op in ("gemm_all_scatter", "all_gather_gemm", "gemm_reduce_scatter", "gemm_all_reduce")
            for pattern in sorted(ops.OPS[op].replayable)]


def _data(p, step, *shape):
    """Rank ``p``'s data at ``step``: small integers, exact in fp32 and TF32 (every rank can make any rank's)."""
    gen = torch.Generator().manual_seed(1000 * step + p)
    return torch.randint(-2, 3, shape, generator=gen).float()


def _operands(ctx, op, heap):
    """The op's operands on this rank: fixed buffers the calls refill (A on the heap or not)."""
    w, dev = ctx.world_size, ctx.device
    make = ctx.zeros if heap else (lambda *shape: torch.zeros(*shape, device=dev))
    if op == "gemm_all_scatter":
        return make(32, 16), torch.zeros(16, 8, device=dev), ctx.zeros(32, 8 * w)
    if op == "all_gather_gemm":
        return make(16, 16), torch.zeros(16, 8, device=dev), torch.zeros(16 * w, 8, device=dev)
    rows = 32 // w if op == "gemm_reduce_scatter" else 32
    return make(32, 16), torch.zeros(16, 8, device=dev), torch.zeros(rows, 8, device=dev)


def _expected(ctx, op, step, shapes):
    """What C holds after a call at ``step``, from every rank's data."""
    w, r = ctx.world_size, ctx.rank
    (a_shape, b_shape) = shapes
    A = [_data(p, step, *a_shape) for p in range(w)]
    B = [_data(p + 100, step, *b_shape) for p in range(w)]
    if op == "gemm_all_scatter":
        return A[0] @ torch.cat(B, dim=1)
    if op == "all_gather_gemm":
        return torch.cat(A) @ B[r]
    total = sum(a @ b for a, b in zip(A, B))
    return total.view(w, -1, total.shape[1])[r] if op == "gemm_reduce_scatter" else total


def _call(ctx, op, pattern, A, B, C, step):
    A.copy_(_data(0 if op == "gemm_all_scatter" else ctx.rank, step, *A.shape))  # gemm_all_scatter: one A
    B.copy_(_data(ctx.rank + 100, step, *B.shape))
    getattr(ops, op)(ctx, A, B, C, pattern=pattern)
    return C.cpu().clone()


def _replays(ctx, op, pattern, heap):
    A, B, C = _operands(ctx, op, heap)
    wrong, recorded = [], []
    cache = ctx.resource(RESOURCE_KEY, PlanCache)
    for step in range(3):
        got = _call(ctx, op, pattern, A, B, C, step)
        if not torch.equal(got, _expected(ctx, op, step, (A.shape, B.shape))):
            wrong.append(f"step {step}")
        recorded.append(all(entry.plan is not None for entry in cache._plans.values()))
    return wrong, recorded, len(cache)


@pytest.mark.parametrize("heap", [True, False], ids=["heap_A", "plain_A"])
@pytest.mark.parametrize("op,pattern", REPLAYED, ids=[f"{o}-{p}" for o, p in REPLAYED])
def test_repeated_calls_replay_the_recorded_launches_with_new_data(pool2, op, pattern, heap):
    for wrong, recorded, entries in pool2.run(_replays, op, pattern, heap):
        assert not wrong, wrong
        assert recorded == [True, True, True] and entries == 1


def _moved_buffers(ctx):
    op, pattern = "gemm_all_scatter", "workgroup_specialized"
    A, B, C = _operands(ctx, op, heap=False)
    cache = ctx.resource(RESOURCE_KEY, PlanCache)
    wrong = []
    _call(ctx, op, pattern, A, B, C, 0)                                    # recorded
    big = (torch.zeros(384, 16, device=ctx.device), torch.zeros(16, 512, device=ctx.device),
           ctx.zeros(384, 512 * ctx.world_size))
    _call(ctx, op, pattern, *big, 1)                                       # 192 tile flags: the sync block grows
    user = ctx.full((64,), 7.0)                                            # where the old block was
    for step in (2, 3):                                                    # recorded afresh on the new block
        if not torch.equal(_call(ctx, op, pattern, A, B, C, step), _expected(ctx, op, step, (A.shape, B.shape))):
            wrong.append(f"after growth, step {step}")
    if not torch.all(user == 7.0):
        wrong.append("a replay wrote into the freed sync block")
    fresh = cache.get(next(iter(cache._plans))).generation == ctx._resources.generation
    with ctx.heap_scope():                                                 # the sync block grows inside a scope
        _call(ctx, op, pattern, torch.zeros(544, 16, device=ctx.device), torch.zeros(16, 512, device=ctx.device),
              ctx.zeros(544, 512 * ctx.world_size), 4)                     # 272 flags
    user = ctx.full((1024,), 7.0)                                          # where the scope's block was
    for step in (5, 6):                                                    # ... and is let go at its end
        if not torch.equal(_call(ctx, op, pattern, A, B, C, step), _expected(ctx, op, step, (A.shape, B.shape))):
            wrong.append(f"after the scope, step {step}")
    if not torch.all(user == 7.0):
        wrong.append("a replay wrote into the block the scope freed")
    return wrong, fresh


def test_a_recording_is_not_replayed_once_its_buffers_moved(pool2):
    for wrong, fresh in pool2.run(_moved_buffers):
        assert not wrong, wrong
        assert fresh


def _holds_nothing(ctx):
    A, B, C = _operands(ctx, "gemm_all_scatter", heap=False)
    for step in range(2):
        _call(ctx, "gemm_all_scatter", "fused_sequential", A, B, C, step)
    probe = weakref.ref(A)
    del A
    gc.collect()
    return probe() is None


@pytest.mark.skipif(platform.SIMULATOR, reason="in the simulator a recorded launch is the interpreter's call "
                                                "again, holding its tensors")
def test_a_recorded_call_holds_no_tensor(pool2):
    assert all(pool2.run(_holds_nothing))
