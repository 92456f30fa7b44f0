"""Property-based tests run inside the ranks: every rank draws the same examples (derandomized)."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.int32, torch.int64,
          torch.uint8, torch.bool]
shapes = st.lists(st.integers(0, 9), min_size=0, max_size=4).map(tuple)


def _creation_properties_body(ctx):
    checked = []

    # derandomize: the same examples on every rank, so the collective allocations stay in step
    @settings(max_examples=60, deadline=None, derandomize=True, database=None)
    @given(shape=shapes, dtype=st.sampled_from(DTYPES), fill=st.integers(-3, 3), transpose=st.booleans())
    def check(shape, dtype, fill, transpose):
        before = ctx.memory_stats()["allocated_bytes"]
        zeros, full = ctx.zeros(shape, dtype=dtype), ctx.full(shape, fill, dtype=dtype)
        assert torch.equal(zeros.cpu(), torch.zeros(shape, dtype=dtype))
        assert torch.equal(full.cpu(), torch.full(shape, fill, dtype=dtype))
        source = torch.full(shape, fill, dtype=dtype)
        if transpose and len(shape) >= 2:
            source = source.transpose(0, 1)  # non-contiguous
        copy = ctx.as_symmetric(source)
        assert copy.shape == source.shape and torch.equal(copy.cpu(), source)
        for t in (zeros, full, copy):
            assert ctx.is_symmetric(t)
        offsets = ctx.broadcast([ctx.heap_offset(t) for t in (zeros, full, copy)], src=0)
        assert offsets == [ctx.heap_offset(t) for t in (zeros, full, copy)]  # symmetric
        ctx.broadcast(copy, src=ctx.world_size - 1)  # in place, also for empty and transposed tensors
        assert torch.equal(copy.cpu(), source)
        ctx.free(zeros, full, copy)
        assert ctx.memory_stats()["allocated_bytes"] == before
        checked.append(shape)

    check()
    return len(checked)


def test_creation_symmetry_and_broadcast_over_random_shapes_and_dtypes(pool):
    counts = pool.run(_creation_properties_body)
    assert counts[0] > 20 and len(set(counts)) == 1


def _broadcast_non_contiguous_body(ctx):
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6) * (ctx.rank + 1)
    plain = base.clone().t()  # a non-contiguous torch tensor, not on the heap
    ctx.broadcast(plain, src=1)
    heap = ctx.as_symmetric(base)[:, ::2]  # a non-contiguous view of a heap tensor
    ctx.broadcast(heap, src=0)
    return plain.tolist(), heap.tolist()


def test_broadcast_of_non_contiguous_tensors(pool2):
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    for plain, heap in pool2.run(_broadcast_non_contiguous_body):
        assert plain == (base * 2).t().tolist()
        assert heap == base[:, ::2].tolist()

