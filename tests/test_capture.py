"""CUDA-graph capture misuse (issue 34, findings 3 and 4): refused before the stream is touched, and
a graph's buffers are never freed under it.

* A cold call (its workspace not made yet), ``ctx.barrier()``/``ctx.check()`` and ``g.barrier()``
  inside capture raise a :class:`TridentError` saying to make the call once before capturing,
  before anything allocates, synchronizes or launches (on the GPU: and torch's CUDA random
  generator still works afterwards).
* A buffer a call used inside capture, grown later by a larger eager call, keeps its old memory
  (``memory_stats()["kept_for_graphs_bytes"]``): a replay never writes into a later user tensor.

The simulator has no CUDA graphs: its tests fake capture (``resources._capturing``), as
tests/test_call_cache.py does; the tests named ``*_on_the_gpu`` really capture and skip there.
"""

import contextlib

import pytest
import torch

import trident
from tests.conftest import get_pool
from trident import ccl
from trident.ccl.collectives import INPUT_STAGE
from trident.ccl.workspace import workspace

on_gpu = pytest.mark.skipif(trident.platform.SIMULATOR, reason="real CUDA-graph capture needs the cuda backend")


@contextlib.contextmanager
def _fake_capture():
    """As if this rank's current stream were being captured into a CUDA graph."""
    import trident.runtime.resources as resources

    real = resources._capturing
    resources._capturing = lambda _team: True
    try:
        yield
    finally:
        resources._capturing = real


def _refusal(call) -> str:
    try:
        call()
    except Exception as exc:  # noqa: BLE001  (the type is checked by the test)
        return f"{type(exc).__name__}: {exc}"
    return "no error"


def _cold_calls_in_capture(ctx):
    g = ctx.new_group(list(range(ctx.world_size)))  # its own resources: its first collective is cold
    x = torch.ones(64, device=ctx.device)
    digest, stats = ctx.heap_digest, ctx.memory_stats()
    with _fake_capture():
        refused = {
            "cold all_reduce": _refusal(lambda: ccl.all_reduce(ctx, x, group=g)),
            "ctx.barrier": _refusal(ctx.barrier),
            "ctx.check": _refusal(ctx.check),
            "g.barrier": _refusal(g.barrier),
        }
    untouched = ctx.heap_digest == digest and ctx.memory_stats() == stats  # nothing was allocated
    ccl.all_reduce(ctx, x, group=g)  # the same call, eager: works, nothing was left half made
    ctx.barrier()
    ctx.destroy_group(g)
    return refused, untouched, x.tolist()


def test_a_cold_call_and_host_barriers_inside_capture_are_refused_before_anything_runs(pool2):
    for rank, (refused, untouched, x) in enumerate(pool2.run(_cold_calls_in_capture)):
        for what, message in refused.items():
            assert message.startswith("TridentError") and f"rank {rank}" in message, (what, message)
            assert "once before capturing" in message, (what, message)
        assert "ccl.workspace" in refused["cold all_reduce"]
        assert "device_barrier" in refused["ctx.barrier"]
        assert untouched, "a refused call allocated heap memory"
        assert x == [2.0] * 64


def _host_splits_in_capture(ctx):
    w = ctx.world_size
    inp, out = ctx.ones(4 * w), torch.empty(4 * w, device=ctx.device)
    ccl.all_to_all_v(ctx, out, inp, [4] * w, [4] * w)  # eager: the call is kept, and its replay refills the table
    with _fake_capture():
        message = _refusal(lambda: ccl.all_to_all_v(ctx, out, inp, [4] * w, [4] * w))
    out.zero_()
    ccl.all_to_all_v(ctx, out, inp, [4] * w, [4] * w)  # eager again: works
    ctx.barrier()
    ctx.free(inp)
    return message, out.tolist()


def test_all_to_all_v_with_host_split_sizes_is_refused_inside_capture(pool2):
    """A graph would read the page-locked buffer the table is uploaded from at every replay, after
    later calls refilled it: host split sizes inside capture are refused, even for a kept call."""
    for rank, (message, out) in enumerate(pool2.run(_host_splits_in_capture)):
        assert message.startswith("TridentError") and f"rank {rank}" in message, message
        assert "device tensors" in message, message
        assert out == [1.0] * 8


def _growth_after_capture(ctx, captured):
    """A call of 256 floats (inside capture when ``captured``), then an eager call that grows its
    staging buffer, then user tensors: returns the kept bytes and whether a user tensor overlaps
    the memory the first call used."""
    with ctx.heap_scope():
        small = torch.ones(256, device=ctx.device)  # a plain tensor: staged through the workspace
        ccl.all_reduce(ctx, small)  # eager first: the buffers exist before the capture
        stage = workspace(ctx)._buffers[INPUT_STAGE].tensor
        lo, hi = stage.data_ptr(), stage.data_ptr() + stage.numel()
        with _fake_capture() if captured else contextlib.nullcontext():
            ccl.all_reduce(ctx, small)  # what a graph would replay: it writes into [lo, hi)
        ccl.all_reduce(ctx, torch.ones(1 << 16, device=ctx.device))  # eager, larger: the buffer grows
        kept = ctx.memory_stats()["kept_for_graphs_bytes"]
        users = [ctx.full((256,), 7.0) for _ in range(8)]
        overlaps = any(u.data_ptr() < hi and lo < u.data_ptr() + u.nbytes for u in users)
    after = ctx.memory_stats()["kept_for_graphs_bytes"]  # the scope freed what it made, kept memory too
    return kept, overlaps, after


def test_a_buffer_a_capture_used_is_kept_when_an_eager_call_grows_it(pool2):
    for kept, overlaps, after in pool2.run(_growth_after_capture, True):
        assert kept >= 256 * 4 and not overlaps and after == 0
    for kept, overlaps, after in pool2.run(_growth_after_capture, False):  # the control: freed, reused
        assert kept == 0 and overlaps and after == 0


# -- on the GPU: real capture ----------------------------------------------------------------------


def _cold_capture_on_the_gpu(ctx):
    g = ctx.new_group(list(range(ctx.world_size)))
    x = torch.ones(256, device=ctx.device)
    refused = {}
    for what, call in (("cold all_reduce", lambda: ccl.all_reduce(ctx, x, group=g)), ("ctx.barrier", ctx.barrier)):
        refused[what] = _refusal(lambda call=call: _capture(torch.cuda.CUDAGraph(), call))
    rng = torch.randn(4, device=ctx.device).shape == (4,)  # torch's CUDA generator still works
    ccl.all_reduce(ctx, x, group=g)
    ctx.barrier()
    ctx.destroy_group(g)
    return refused, rng, x.tolist()


def _capture(graph, call):
    with torch.cuda.graph(graph):
        call()


@on_gpu
def test_a_cold_capture_is_refused_and_torch_rng_still_works_on_the_gpu():
    for refused, rng, x in get_pool(2).run(_cold_capture_on_the_gpu):
        for what, message in refused.items():
            assert message.startswith("TridentError") and "once before capturing" in message, (what, message)
        assert rng and x == [2.0] * 256


def _replay_after_growth_on_the_gpu(ctx):
    with ctx.heap_scope():
        x = torch.empty(256, device=ctx.device)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            x.fill_(1.0)
            ccl.all_reduce(ctx, x)  # warm-up: the buffers exist
        torch.cuda.current_stream().wait_stream(side)
        ctx.barrier()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            ccl.all_reduce(ctx, x)
        ccl.all_reduce(ctx, torch.ones(1 << 20, device=ctx.device))  # 4 MiB, eager: the staging buffer grows
        users = [ctx.full((1 << 16,), 7.0) for _ in range(4)]  # where the old buffer would have been freed
        ctx.barrier()
        results = []
        for i in range(3):
            x.fill_(float(ctx.rank + i))
            graph.replay()
            ctx.barrier()
            results.append(x[0].item())
        intact = all(bool(torch.all(u == 7.0)) for u in users)
        del graph
        ctx.barrier()
        return intact, results, ctx.memory_stats()["kept_for_graphs_bytes"]


@on_gpu
def test_a_graph_replayed_after_its_buffer_grew_leaves_user_tensors_intact_on_the_gpu():
    for intact, results, kept in get_pool(2).run(_replay_after_growth_on_the_gpu):
        assert intact, "a graph replay wrote into a user tensor"
        assert results == [1.0 + 2 * i for i in range(3)] and kept > 0
