"""The collectives' small-message path: a repeated call replays the plan its first call recorded.

Pinned here: a replay gives the same results as a full call (new data in the same buffers, heap
and plain tensors, every collective); a call on other memory, or with other options, does not
replay another call's plan; a bad call after good ones still raises; a buffer that grows drops
every plan (they point at the freed buffer); the debug mode records nothing.
"""

import pytest
import torch

from tests.conftest import get_pool
from trident import ccl
from trident.ccl.workspace import workspace


def _filled(ctx, t, value):
    t.copy_(torch.full(t.shape, float(value), dtype=t.dtype))
    return t


def _repeat_every_collective(ctx, plain):
    """Each collective three times on the same buffers with new data each time; returns what went wrong."""
    w, r = ctx.world_size, ctx.rank
    make = (lambda *shape: torch.zeros(*shape, device=ctx.device)) if plain else (lambda *shape: ctx.zeros(*shape))
    x, gathered, part, inp, out = make(300), make(w * 40), make(40), make(w * 8), make(w * 8)
    wrong = []
    for step in range(3):
        _filled(ctx, x, r + step)
        ccl.all_reduce(ctx, x)
        if not torch.all(x == sum(range(w)) + w * step):
            wrong.append(f"all_reduce step {step}: {x[:3].tolist()}")
        ccl.all_gather(ctx, gathered, _filled(ctx, part, 10 * r + step))
        expect = torch.cat([torch.full((40,), 10.0 * p + step) for p in range(w)])
        if not torch.equal(gathered.cpu(), expect):
            wrong.append(f"all_gather step {step}")
        inp.copy_(torch.arange(w * 8, dtype=inp.dtype) + 100 * r + step)
        ccl.all_to_all(ctx, out, inp)
        expect = torch.cat([torch.arange(r * 8, r * 8 + 8, dtype=inp.dtype) + 100 * p + step for p in range(w)])
        if not torch.equal(out.cpu(), expect):
            wrong.append(f"all_to_all step {step}: {out.tolist()}")
        ccl.reduce_scatter(ctx, part, _filled(ctx, gathered, r + step))
        if not torch.all(part == sum(range(w)) + w * step):
            wrong.append(f"reduce_scatter step {step}")
        ccl.broadcast(ctx, _filled(ctx, x, r + step), src=w - 1)
        if not torch.all(x == w - 1 + step):
            wrong.append(f"broadcast step {step}")
    return wrong, len(workspace(ctx).plans)


@pytest.mark.parametrize("plain", [False, True], ids=["heap", "plain"])
def test_repeated_calls_replay_their_plan_with_new_data(pool, plain):
    for wrong, plans in pool.run(_repeat_every_collective, plain):
        assert not wrong, wrong
        assert plans == 5  # one plan per collective: the second and third calls replayed it


def _other_memory_and_options(ctx):
    x = ctx.zeros(64)
    y = ctx.zeros(64)
    ccl.all_reduce(ctx, _filled(ctx, x, 1))
    ccl.all_reduce(ctx, _filled(ctx, y, 2))                     # other memory: its own plan
    ccl.all_reduce(ctx, _filled(ctx, x, 3), op="max")           # other option: its own plan
    results = [x.cpu().clone(), y.cpu().clone()]
    plans = len(workspace(ctx).plans)
    try:
        ccl.all_reduce(ctx, x, op="prod")                       # a bad option after good calls still raises
        raised = ""
    except ValueError as exc:
        raised = str(exc)
    return results, plans, raised


def test_a_plan_is_only_replayed_for_its_own_memory_and_options(pool2):
    for (x, y), plans, raised in pool2.run(_other_memory_and_options):
        assert torch.all(x == 3) and torch.all(y == 4)
        assert plans == 3
        assert "not supported" in raised


def _growth_drops_plans(ctx):
    small = torch.zeros(16, device=ctx.device)
    ccl.all_reduce(ctx, _filled(ctx, small, 1))                 # plain: staged through the input buffer
    before = len(workspace(ctx).plans)
    big = torch.zeros(1 << 16, device=ctx.device)
    ccl.all_reduce(ctx, _filled(ctx, big, 1))                   # the input buffer grows: plans dropped
    after = len(workspace(ctx).plans)
    ccl.all_reduce(ctx, _filled(ctx, small, 2))                 # recorded afresh on the new buffer
    return before, after, small.cpu().clone(), big[:4].cpu().clone()


def test_a_growing_buffer_drops_every_plan(pool2):
    for before, after, small, big in pool2.run(_growth_drops_plans):
        assert before == 1 and after == 1  # the big call's plan only
        assert torch.all(small == 4) and torch.all(big == 2)


def _grown_inside_a_heap_scope(ctx):
    n = 1 << 14
    x = torch.ones(8, device=ctx.device)
    ccl.all_reduce(ctx, x)                                      # the workspace, made outside any scope
    with ctx.heap_scope():
        ccl.all_reduce(ctx, torch.ones(n, device=ctx.device))   # its input buffer grows inside the scope
    ccl.all_reduce(ctx, _filled(ctx, x, 1))                     # a replay must not use the freed buffer
    user = ctx.full((n,), 7.0)                                  # memory the scope gave back, reused
    big = torch.ones(n, device=ctx.device)
    ccl.all_reduce(ctx, big)                                    # stages its input: not into `user`
    return float(user.min()), float(user.max()), float(big.min()), float(x.min())


def test_a_buffer_that_grew_inside_a_heap_scope_is_let_go_with_the_scope(pool2):
    """The scope frees what was allocated inside it, also a buffer of an older resource that grew
    there: the buffer lets go of that memory (and its plans), so nothing writes to it afterwards."""
    for user_min, user_max, big, x in pool2.run(_grown_inside_a_heap_scope):
        assert (user_min, user_max) == (7.0, 7.0), "the collectives' buffer overwrote a user tensor"
        assert big == 2.0 and x == 2.0


def _debug_records_nothing(ctx):
    x = ctx.zeros(32)
    for step in range(2):
        ccl.all_reduce(ctx, _filled(ctx, x, step))
    return len(workspace(ctx).plans), x.cpu().clone()


def test_the_debug_mode_records_no_plan():
    for plans, x in get_pool(2, TRIDENT_DEBUG="1").run(_debug_records_nothing):
        assert plans == 0 and torch.all(x == 2)


def _growth_in_capture(ctx):
    import trident.runtime.resources as resources

    x = torch.zeros(16, device=ctx.device)
    ccl.all_reduce(ctx, _filled(ctx, x, 1))            # the buffers for 16 elements exist now
    real = resources._capturing
    resources._capturing = lambda _ctx: True           # as if the stream were being captured
    try:
        ccl.all_reduce(ctx, _filled(ctx, x, 2))        # same sizes: no growth, fine while capturing
        try:
            ccl.all_reduce(ctx, torch.zeros(1 << 16, device=ctx.device))
            refused = ""
        except Exception as exc:  # noqa: BLE001  (the type is checked below)
            refused = f"{type(exc).__name__}: {exc}"
    finally:
        resources._capturing = real
    return float(x[0]), refused


def test_a_buffer_never_grows_inside_cuda_graph_capture(pool2):
    """Growing would free memory that captured work uses: the call is refused with what to do."""
    for value, refused in pool2.run(_growth_in_capture):
        assert value == 4
        assert refused.startswith("TridentError") and "once before capturing" in refused
