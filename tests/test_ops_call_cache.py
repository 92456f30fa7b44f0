"""The fused ops' small-call path (trident.ops.call_cache): a repeated call reuses its decisions.

Pinned here: repeated calls on the same buffers with new data give the right results and keep
one entry; a call on other buffers gets its own; a bad call after good ones still raises; the
cache keeps no tensor alive; the debug mode keeps nothing.
"""

import gc
import weakref

import torch

from tests.conftest import get_pool
from trident import ops
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
    ops.gemm_all_scatter(ctx, A2, B_local, C, pattern="fused_sequential")   # other memory: a second entry
    entries2 = len(ctx.resource(RESOURCE_KEY, PlanCache))
    try:
        ops.gemm_all_scatter(ctx, A, B_local, C, pattern="no_such_pattern")
        raised = ""
    except ValueError as exc:
        raised = str(exc)
    probe = weakref.ref(A2)
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
