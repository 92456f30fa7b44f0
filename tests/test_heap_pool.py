"""Zero copy from torch: tensors made inside ``ctx.heap_allocations()`` live on the symmetric heap.

On both backends: they are heap tensors at the same offset on every rank, collectives use them in
place (no staging), they go back to the heap when dropped, ranks that allocate differently are
told at the next barrier and nothing is overwritten. On a GPU also: the results of torch ops (not
only factories) and a CUDA graph's outputs lie on the heap, and a pool that runs out raises
HeapExhaustedError naming the block.
"""

import pytest
import torch

import trident
from trident.errors import DivergenceError, HeapExhaustedError, TridentError


def _collective_in_place(ctx):
    with ctx.heap_allocations():
        x = torch.full((300,), float(ctx.rank + 1), device=ctx.device)
        y = torch.randn(7, 5, generator=torch.Generator().manual_seed(3)).to(ctx.device) if ctx.platform.simulator \
            else torch.randn(7, 5, device=ctx.device)
        if not ctx.platform.simulator:
            z = x * 2  # any op's output, on a GPU
            assert ctx.is_symmetric(z), "a torch op's output inside the block is on the heap"
    offsets = ctx.all_gather_object("offsets", (ctx.heap_offset(x),))
    assert ctx.is_symmetric(x) and len(set(offsets)) == 1, offsets
    trident.ccl.all_reduce(ctx, x)
    assert torch.equal(x.cpu(), torch.full((300,), float(sum(range(1, ctx.world_size + 1)))))
    (entry,) = ctx.call_cache.entries("all_reduce")  # the call just made
    staged = [s for s in entry.steps if type(s).__name__ == "_Copy" or getattr(s, "constexprs", {}).get("STAGE")]
    assert not staged, "a heap tensor made inside heap_allocations is used in place"
    out = torch.ops.trident.all_reduce(x, "sum", ctx.group_name)  # the custom op reads it in place too
    assert torch.equal(out.cpu(), x.cpu() * ctx.world_size)
    held = ctx.memory_stats()["allocated_bytes"]
    del x, y, out
    if not ctx.platform.simulator:
        del z
        torch.cuda.synchronize()
        return True  # freed tensors go back to the pool (torch's caching), not to the heap at once
    return held - ctx.memory_stats()["allocated_bytes"] >= (300 + 35) * 4  # dropped: back to the heap


def test_tensors_made_inside_are_symmetric_used_in_place_and_given_back(pool2):
    assert all(pool2.run(_collective_in_place))


def _diverging(ctx):
    trident.ccl.all_reduce(ctx, ctx.ones(256))  # the collectives' workspace exists before ranks diverge
    kept = []
    with ctx.heap_allocations():
        guard = torch.full((64,), 7.0, device=ctx.device)
        if ctx.rank == 1:
            kept.append(torch.zeros(1000, device=ctx.device))  # rank 1 allocates one more tensor (kept alive)
        x = torch.full((256,), float(ctx.rank + 1), device=ctx.device)
    offsets = ctx.all_gather_object("offsets", ctx.heap_offset(x))
    trident.ccl.all_reduce(ctx, x)  # collectives find each rank's copy wherever it lies
    result = (offsets, bool(torch.equal(x.cpu(), torch.full((256,), float(sum(range(1, ctx.world_size + 1)))))),
              bool(torch.equal(guard.cpu(), torch.full((64,), 7.0))))
    with pytest.raises(DivergenceError, match="out of step"):
        ctx.barrier()
    return result


def test_ranks_that_allocate_differently_are_told_and_nothing_is_overwritten():
    from tests.conftest import get_pool

    for offsets, right, untouched in get_pool(2).run(_diverging):
        assert offsets[0] != offsets[1], offsets
        assert right and untouched


def _scope_free_and_errors(ctx):
    with ctx.heap_scope():
        with ctx.heap_allocations():
            kept = torch.ones(128, device=ctx.device)
        tmp = ctx.zeros(64)
        del tmp
    assert ctx.is_symmetric(kept) and float(kept.sum()) == 128  # the scope freed ctx.zeros, not the segment
    with pytest.raises(ValueError, match="made inside ctx.heap_allocations"):
        ctx.free(kept)
    if ctx.platform.simulator:
        with pytest.raises(TridentError, match="the simulator has none"):
            ctx.mem_pool  # noqa: B018
    with pytest.raises(HeapExhaustedError, match="heap_allocations"):
        with ctx.heap_allocations():
            torch.empty(2 * ctx.heap_size, dtype=torch.uint8, device=ctx.device)
    return True


def test_a_scope_keeps_pool_segments_and_misuse_is_refused(pool2):
    assert all(pool2.run(_scope_free_and_errors))


def _after_close(ctx):
    with trident.init(heap_size=16 << 20) as inner:
        with inner.heap_allocations():
            alive = torch.arange(100, dtype=torch.float32, device=inner.device)
    # closed: the tensor still reads its values; dropping it later is safe
    total = float(alive.sum())
    del alive
    return total


def test_a_tensor_made_inside_outlives_its_closed_context_safely(pool2):
    assert pool2.run(_after_close) == [4950.0, 4950.0]


def _graph_outputs(ctx):
    x = torch.randn(64, 64, device=ctx.device)
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up on the capture stream: cuBLAS makes its workspace for it now
        y = x @ x
    with torch.cuda.graph(graph, pool=ctx.mem_pool.id, stream=stream):
        y = x @ x
    graph.replay()
    torch.cuda.synchronize()
    return ctx.is_symmetric(y) and torch.allclose(y, x @ x)


@pytest.mark.skipif(trident.config.BACKEND == "sim", reason="CUDA graphs and torch.cuda.MemPool: GPU only")
def test_a_cuda_graphs_outputs_lie_on_the_heap(pool2):
    assert all(pool2.run(_graph_outputs))


def _growth_after_diverging(ctx):
    trident.ccl.all_reduce(ctx, ctx.ones(256))  # the collectives' workspace, in step
    guard = ctx.full((1024,), 7.0)
    if ctx.rank == 1:
        ctx.zeros(1000)  # rank 1 makes one more heap tensor
    big = torch.ones(1 << 16, device=ctx.device)  # plain: staged, in a buffer that must grow now
    with pytest.raises(DivergenceError, match="out of step"):
        trident.ccl.all_reduce(ctx, big)
    untouched = torch.equal(guard.cpu(), torch.full((1024,), 7.0)) and torch.equal(big.cpu(), torch.ones(1 << 16))
    return bool(untouched)


def test_a_buffer_that_must_grow_after_ranks_diverged_is_refused_before_any_write(pool2):
    assert all(pool2.run(_growth_after_diverging))
