"""The symmetric allocator: unit tests of SymmetricAllocator, then its use by the ranks of a job."""

import gc
import itertools
import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import trident
from trident import layout
from trident.dist_backend import INIT_SLOTS, init_bytes
from trident.runtime.allocator import SymmetricAllocator

# -- unit tests (no processes) ---------------------------------------------------------------------


def _live(alloc):
    return [(b.offset, b.size) for b in alloc.live_blocks()]


def _state(alloc):
    return (_live(alloc), alloc.free_bytes, alloc.allocated_bytes, alloc.largest_free_block, alloc.digest,
            alloc.ops, alloc.last_op, alloc.peak)


def test_alignment_and_sizes():
    alloc = SymmetricAllocator(1024, 1 << 16, 256)
    blocks = [alloc.allocate(n, f"b{n}") for n in (1, 256, 257, 0, 1000, 255, 512)]
    assert [(b.offset, b.size) for b in blocks] == [
        (1024, 256), (1280, 256), (1536, 512), (2048, 256), (2304, 1024), (3328, 256), (3584, 512)]
    assert all(b.offset % 256 == 0 and b.size % 256 == 0 for b in blocks)
    assert alloc.allocated_bytes == 256 * 3 + 512 * 2 + 1024 + 256
    assert alloc.free_bytes == (1 << 16) - 1024 - alloc.allocated_bytes
    other = SymmetricAllocator(4096, 8192, 1024)
    assert [other.allocate(n, "x").offset for n in (1, 1025, 1)] == [4096, 5120, 7168]
    with pytest.raises(ValueError, match="negative"):
        alloc.allocate(-1, "neg")
    for start, end, align in [(100, 1000, 256), (1024, 1024, 256), (2048, 1024, 256)]:
        with pytest.raises(ValueError, match="bad heap range"):
            SymmetricAllocator(start, end, align)


def test_first_fit_reuses_the_lowest_hole():
    alloc = SymmetricAllocator(0, 256 * 100, 256)
    a, b, c, d, e = (alloc.allocate(n, name) for n, name in [(256, "a"), (512, "b"), (256, "c"), (768, "d"),
                                                                (256, "e")])
    assert [x.offset for x in (a, b, c, d, e)] == [0, 256, 768, 1024, 1792]
    alloc.free(b.offset)
    alloc.free(d.offset)
    # 700 bytes do not fit in b's 512-byte hole: first fit takes d's hole, not the tail
    assert alloc.allocate(700, "f").offset == d.offset
    # small blocks go to the lowest hole, consuming it front to back
    assert alloc.allocate(100, "g").offset == b.offset
    assert alloc.allocate(200, "h").offset == b.offset + 256
    # no hole left: the tail
    assert alloc.allocate(1, "i").offset == e.offset + 256
    alloc.free(a.offset)
    assert alloc.allocate(256, "j").offset == a.offset
    with pytest.raises(trident.HeapExhaustedError):
        alloc.allocate(256 * 100, "too big")


@pytest.mark.parametrize("order", list(itertools.permutations(range(3))), ids=lambda o: "".join(map(str, o)))
@pytest.mark.parametrize("guard_before", [False, True])
def test_free_merges_neighbours(order, guard_before):
    alloc = SymmetricAllocator(512, 256 * 64, 256)
    before = alloc.allocate(256, "guard before") if guard_before else None
    blocks = [alloc.allocate(size, f"n{i}") for i, size in enumerate((256, 512, 768))]
    after = alloc.allocate(256, "guard after")
    first = blocks[0].offset
    assert [b.offset for b in blocks] == [first, first + 256, first + 768]
    for i in order:
        alloc.free(blocks[i].offset)
    # one allocation of the three neighbours' whole range fits exactly where they were
    whole = alloc.allocate(256 + 512 + 768, "whole")
    assert whole.offset == first
    alloc.free(whole.offset)
    alloc.free(after.offset)
    if before is not None:
        alloc.free(before.offset)
    # everything merged back into a single free range
    assert alloc.free_bytes == alloc.largest_free_block == 256 * 64 - 512
    assert alloc.allocate(256 * 64 - 512, "everything").offset == 512


def test_double_free_and_unknown_offset():
    alloc = SymmetricAllocator(256, 256 * 16, 256)
    a = alloc.allocate(300, "a")
    alloc.allocate(10, "b")
    alloc.free(a.offset)
    state = _state(alloc)
    with pytest.raises(ValueError, match="double free") as info:
        alloc.free(a.offset)
    assert hex(a.offset) in str(info.value)
    for bad in (a.offset + 256, 0, 256 * 16, 999):
        with pytest.raises(ValueError, match="no live allocation"):
            alloc.free(bad)
    assert _state(alloc) == state


def test_exhaustion_message_and_recovery():
    heap = 1 << 20
    alloc = SymmetricAllocator(65536, heap, 256)
    alloc.allocate(4000, "first")
    state = _state(alloc)
    free = heap - 65536 - 4096
    assert alloc.free_bytes == free
    with pytest.raises(trident.HeapExhaustedError) as info:
        alloc.allocate(2_000_000, "ctx.empty(big)")
    message = str(info.value)
    assert isinstance(info.value, MemoryError) and isinstance(info.value, trident.TridentError)
    for number in (2_000_000, free, heap):
        assert str(number) in message, (number, message)
    assert "ctx.empty(big)" in message
    assert _state(alloc) == state  # unchanged
    # fragmentation: enough free bytes in total, but no range large enough
    holes = [alloc.allocate(256 * 100, f"h{i}") for i in range(3)]
    alloc.allocate(heap - 65536 - 4096 - 3 * 25600, "rest")
    for h in holes[::2]:
        alloc.free(h.offset)
    assert alloc.free_bytes == 2 * 25600 and alloc.largest_free_block == 25600
    state = _state(alloc)
    with pytest.raises(trident.HeapExhaustedError) as info:
        alloc.allocate(30000, "fragmented")
    assert "30000" in str(info.value) and "51200" in str(info.value) and "25600" in str(info.value)
    assert _state(alloc) == state
    # still usable
    assert alloc.allocate(25600, "fits").offset == holes[0].offset
    assert alloc.allocate(25600, "fits").offset == holes[2].offset
    assert alloc.free_bytes == 0
    with pytest.raises(trident.HeapExhaustedError):
        alloc.allocate(0, "nothing left, not even one unit")


def test_queries_and_digest():
    alloc = SymmetricAllocator(256, 256 * 8, 256)
    assert alloc.ops == 0 and alloc.peak == 0 and alloc.live_blocks() == []
    empty_digest = alloc.digest
    a = alloc.allocate(600, "a")
    b = alloc.allocate(1, "b")
    assert alloc.block_at(a.offset) == a and alloc.block_at(a.offset + 256) is None
    assert alloc.block_containing(a.offset + 767) == a
    assert alloc.block_containing(b.offset) == b and alloc.block_containing(b.offset + 256) is None
    assert alloc.block_containing(0) is None
    d2 = alloc.digest
    alloc.free(a.offset)
    assert alloc.peak == 1024 and alloc.allocated_bytes == 256 and alloc.ops == 3
    assert len({empty_digest, d2, alloc.digest}) == 3
    # the digest covers what was allocated, not only the sizes
    x, y = SymmetricAllocator(256, 4096, 256), SymmetricAllocator(256, 4096, 256)
    x.allocate(10, "zeros (10,)")
    y.allocate(10, "ones (10,)")
    assert x.digest != y.digest


# -- property test ------------------------------------------------------------------------------------

_START, _END, _ALIGN = 256, 256 * 48, 256

_ops = st.lists(st.one_of(st.tuples(st.just("alloc"), st.integers(0, 256 * 14)),
                          st.tuples(st.just("free"), st.integers(0, 10_000))), max_size=60)


def _expected_offset(live, size):
    """First fit over the gaps between live blocks (what a fully merged free list gives)."""
    cursor = _START
    for offset, block_size in sorted(live):
        if offset - cursor >= size:
            return cursor
        cursor = offset + block_size
    return cursor if _END - cursor >= size else None


def _check_invariants(alloc):
    live = _live(alloc)
    for (o1, s1), (o2, _) in itertools.pairwise(live):
        assert o1 + s1 <= o2, f"blocks overlap: {live}"
    for offset, size in live:
        assert _START <= offset and offset + size <= _END, live
        assert offset % _ALIGN == 0 and size % _ALIGN == 0 and size > 0
    assert alloc.allocated_bytes == sum(s for _, s in live)
    assert alloc.free_bytes + alloc.allocated_bytes == _END - _START
    assert alloc.peak >= alloc.allocated_bytes
    assert alloc.largest_free_block <= alloc.free_bytes


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=_ops, data=st.data())
def test_random_sequences(ops, data):
    a = SymmetricAllocator(_START, _END, _ALIGN)
    b = SymmetricAllocator(_START, _END, _ALIGN)
    for i, (kind, n) in enumerate(ops):
        if kind == "alloc":
            size = -(-max(n, 1) // _ALIGN) * _ALIGN
            expected = _expected_offset(_live(a), size)
            results = []
            for alloc in (a, b):
                before = _state(alloc)
                try:
                    results.append(alloc.allocate(n, f"op{i}"))
                except trident.HeapExhaustedError as exc:
                    assert _state(alloc) == before
                    assert str(n) in str(exc)
                    results.append(None)
            assert results[0] == results[1]
            if expected is None:
                assert results[0] is None
            else:
                assert results[0] is not None and (results[0].offset, results[0].size) == (expected, size)
        else:
            live = _live(a)
            if not live:
                continue
            offset = live[n % len(live)][0]
            assert a.free(offset) == b.free(offset)
        _check_invariants(a)
        assert _state(a) == _state(b)
    # free what is left in any order: the heap merges back into one range
    for offset, _ in data.draw(st.permutations(_live(a))):
        a.free(offset)
        _check_invariants(a)
    assert a.free_bytes == a.largest_free_block == _END - _START
    assert a.allocate(_END - _START, "all").offset == _START


# -- in the ranks --------------------------------------------------------------------------------------


def _offset(ctx, t):
    return t.data_ptr() - ctx.heap_bases_host[ctx.rank]


# (what, size in bytes) or ("free", index of an earlier allocation)
_SEQUENCE = [("zeros", 10), ("empty", 1000), ("ones", 72), ("free", 1), ("zeros", 100), ("empty", 5000),
             ("free", 0), ("free", 2), ("full", 64), ("empty", 300), ("free", 4), ("zeros", 4096)]


def _sequence_body(ctx):
    assert ctx.memory_stats()["num_allocations"] == 0, "the pool should start each task with an empty heap"
    tensors, offsets = [], []
    for what, n in _SEQUENCE:
        if what == "free":
            ctx.free(tensors[n])
            tensors.append(None)
            continue
        if what == "zeros":
            t = ctx.zeros(n // 4)
        elif what == "ones":
            t = ctx.ones(n // 8, dtype=torch.float64)
        elif what == "full":
            t = ctx.full((n // 4,), 1.0)
        else:
            t = ctx.empty(n, dtype=torch.uint8)
        tensors.append(t)
        offsets.append(_offset(ctx, t))
    ctx.barrier()  # in step: no DivergenceError
    return offsets, ctx.memory_stats()


def test_same_sequence_same_offsets(pool):
    results = pool.run(_sequence_body)
    offsets, stats = results[0]
    assert all(r == results[0] for r in results), results
    # the offsets are exactly what the allocator gives for that sequence
    ref = SymmetricAllocator(layout.CONTROL_BYTES, stats["heap_size"], layout.ALLOC_ALIGN)
    blocks, expected = [], []
    for what, n in _SEQUENCE:
        if what == "free":
            ref.free(blocks[n].offset)
            blocks.append(None)
        else:
            blocks.append(ref.allocate(n, what))
            expected.append(blocks[-1].offset)
    assert offsets == expected
    assert offsets[0] == layout.CONTROL_BYTES
    assert stats["allocated_bytes"] == ref.allocated_bytes and stats["num_allocations"] == len(ref.live_blocks())


def _stats_body(ctx):
    snapshots = [ctx.memory_stats()]
    a = ctx.empty(1000, dtype=torch.uint8)  # 1024 bytes
    b = ctx.zeros(10)  # 40 -> 256 bytes
    snapshots.append(ctx.memory_stats())
    ctx.free(a)
    snapshots.append(ctx.memory_stats())
    ctx.free(b)
    snapshots.append(ctx.memory_stats())
    return ctx.heap_size, snapshots


def test_memory_stats(pool2):
    for heap_size, (s0, s1, s2, s3) in pool2.run(_stats_body):
        # The allocator has the heap between the control block and the torch group slots init keeps at the top.
        usable = heap_size - init_bytes(heap_size, INIT_SLOTS) - layout.CONTROL_BYTES
        for s in (s0, s1, s2, s3):
            assert s["heap_size"] == heap_size and s["reserved_bytes"] == heap_size - usable
            assert s["free_bytes"] + s["allocated_bytes"] == usable
        assert (s0["allocated_bytes"], s0["num_allocations"], s0["largest_free_block"]) == (0, 0, usable)
        assert (s1["allocated_bytes"], s1["num_allocations"], s1["largest_free_block"]) == (1280, 2, usable - 1280)
        assert s1["peak_allocated_bytes"] >= 1280
        # a's hole (1024 bytes) is smaller than the tail
        assert (s2["allocated_bytes"], s2["num_allocations"], s2["largest_free_block"]) == (256, 1, usable - 1280)
        assert s2["peak_allocated_bytes"] == s1["peak_allocated_bytes"]
        assert (s3["allocated_bytes"], s3["num_allocations"], s3["largest_free_block"]) == (0, 0, usable)


def _exhaustion_body(ctx):
    keep = ctx.zeros(100)
    before = ctx.memory_stats()
    request = 2 * ctx.heap_size
    with pytest.raises(trident.HeapExhaustedError) as info:
        ctx.empty(request, dtype=torch.uint8)
    message = str(info.value)
    assert ctx.memory_stats() == before
    # enough bytes in total but no range large enough
    big = ctx.empty(before["free_bytes"] // 2, dtype=torch.uint8)
    guard = ctx.zeros(1)
    ctx.free(big)
    mid = ctx.memory_stats()
    with pytest.raises(trident.HeapExhaustedError) as info2:
        ctx.empty(mid["largest_free_block"] + 1, dtype=torch.uint8)
    assert ctx.memory_stats() == mid
    # the heap is still usable, in step, and the data intact
    after = ctx.full((10,), 3.0)
    assert ctx.is_symmetric(after) and after.tolist() == [3.0] * 10 and keep.sum().item() == 0
    ctx.barrier()
    ctx.free(guard, after)
    return message, before, str(info2.value), mid, ctx.heap_size


def test_heap_exhaustion_in_the_ranks(pool2):
    for message, before, message2, mid, heap_size in pool2.run(_exhaustion_body):
        assert "exhausted" in message
        allocatable = heap_size - init_bytes(heap_size, INIT_SLOTS)  # the top is kept for torch groups
        for number in (2 * heap_size, before["free_bytes"], allocatable):
            assert str(number) in message, (number, message)
        for number in (mid["largest_free_block"] + 1, mid["free_bytes"], allocatable, mid["largest_free_block"]):
            assert str(number) in message2, (number, message2)


def _free_errors_body(ctx):
    x = ctx.zeros(8)
    y = ctx.ones(2, 3)
    stats = ctx.memory_stats()
    messages = {}
    with pytest.raises(ValueError, match="no allocation starts at heap offset") as info:
        ctx.free(x[1:])
    messages["x[1:]"] = str(info.value)
    with pytest.raises(ValueError, match="into the allocation") as info:
        ctx.free(y[1])
    messages["y[1]"] = str(info.value)
    with pytest.raises(trident.NotSymmetricError) as info:
        ctx.free(torch.zeros(8))
    messages["torch.zeros"] = str(info.value)
    with pytest.raises(trident.NotSymmetricError):
        ctx.free(x + 1)
    with pytest.raises(trident.NotSymmetricError):
        ctx.free("x")
    assert ctx.memory_stats() == stats  # nothing was freed
    ctx.free(x.view(2, 4))  # a view starting where the allocation starts frees it
    with pytest.raises(ValueError, match="already freed") as info:
        ctx.free(x)
    messages["double"] = str(info.value)
    ctx.free(y)
    ctx.barrier()
    return messages, _offset(ctx, x), _offset(ctx, y)


def test_free_errors(pool2):
    for rank, (messages, x_off, y_off) in enumerate(pool2.run(_free_errors_body)):
        assert f"{x_off + 4:#x}" in messages["x[1:]"] and "4 bytes into the allocation" in messages["x[1:]"]
        assert f"{x_off:#x}" in messages["x[1:]"]
        assert f"{y_off + 12:#x}" in messages["y[1]"] and "12 bytes into" in messages["y[1]"]
        assert "symmetric" in messages["torch.zeros"]
        assert f"{x_off:#x}" in messages["double"]
        assert all(m.startswith(f"rank {rank}:") for m in messages.values()), messages


def _reuse_body(ctx):
    a = ctx.zeros(100)  # 400 -> 512 bytes
    guard = ctx.zeros(1)
    a_off = _offset(ctx, a)
    a.fill_(7.0)
    ctx.free(a)
    big = ctx.empty(1000)  # 4000 bytes: does not fit in a's hole
    small = ctx.ones(50)  # 200 bytes: goes into a's hole
    again = ctx.zeros(16)  # the rest of the hole (256 bytes)
    return a_off, _offset(ctx, guard), _offset(ctx, big), _offset(ctx, small), _offset(ctx, again), small.tolist()


def test_freed_block_is_reused(pool2):
    results = pool2.run(_reuse_body)
    assert results[0] == results[1]
    a_off, guard_off, big_off, small_off, again_off, small_values = results[0]
    assert small_off == a_off and again_off == a_off + 256
    assert guard_off == a_off + 512 and big_off > guard_off
    assert small_values == [1.0] * 50


# -- divergence -------------------------------------------------------------------------------------------


def _heap_mappings():
    with open("/proc/self/maps") as f:
        return [line for line in f if f"trident-u{os.getuid()}-p" in line]


def _diverge_then_close(rank):
    """Rank 1 makes an allocation rank 0 does not: the barrier must catch it; then close() after the caught
    divergence must release the heap, and a new context in step must work (both divergence tests below)."""
    import warnings

    ctx = trident.init(heap_size=1 << 24)
    ctx.zeros(4)
    extra = ctx.zeros(8) if rank == 1 else None  # an allocation the other rank does not make
    message = None
    try:
        ctx.barrier()
    except trident.DivergenceError as exc:
        message = str(exc)
    if extra is not None:
        ctx.free(extra)  # does not bring the ranks back into step: the digest is of the history
    mapped = len(_heap_mappings())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            ctx.close()
            closed = "no error"
        except Exception as exc:
            closed = f"{type(exc).__name__}: {exc}"
    del extra
    gc.collect()
    after = len(_heap_mappings())
    with trident.init(heap_size=1 << 24) as again:  # the way back: a new context, in step
        again.zeros(4)
        again.barrier()
    return message, (closed, [str(w.message) for w in caught], repr(ctx), mapped, after)


@pytest.fixture(scope="module")
def diverged():
    """The two ranks of :func:`_diverge_then_close`: one job for both tests (each used to start its own)."""
    return trident.spawn(_diverge_then_close, 2, timeout=120)


def test_divergence_is_caught_at_the_barrier(diverged):
    results = [message for message, _ in diverged]
    assert len(results) == 2
    for rank, message in enumerate(results):
        assert message is not None, f"rank {rank} passed the barrier"
        assert message.startswith(f"rank {rank}:") and "out of step at barrier" in message
        assert "rank 0: " in message and "rank 1: " in message
        assert "after 1 heap operations" in message and "after 2 heap operations" in message
        assert "shape=(8,)" in message  # rank 1's last operation
        # both ranks report the same states
        assert message.split(":", 1)[1] == results[0].split(":", 1)[1]


@pytest.mark.skipif(not trident.platform.SIMULATOR, reason="counts the simulator's /dev/shm heap mappings")
def test_close_after_a_caught_divergence_releases_and_only_warns(diverged):
    """close() used to raise DivergenceError again; it must release the heap and every mapping."""
    for rank, (_, (closed, caught, state, mapped, after)) in enumerate(diverged):
        assert closed == "no error", closed
        assert len(caught) == 1 and caught[0].startswith(f"rank {rank}:") and "closing anyway" in caught[0], caught
        assert state.endswith("closed>") and mapped > 0 and after == 0, (state, mapped, after)


def _diverge_in_debug_mode(ctx):
    assert ctx.debug
    # in step: allocations and frees pass their checks
    t = ctx.zeros(4)
    ctx.free(t)
    raised_at = None
    message = None
    try:
        raised_at = "extra"
        if ctx.rank == 1:
            ctx.zeros(4)  # the extra allocation
        raised_at = "next"
        ctx.zeros(8)
        raised_at = None
    except trident.DivergenceError as exc:
        message = str(exc)
    return raised_at, message


def test_divergence_is_caught_at_the_allocation_in_debug_mode(debug_pool):
    (where0, msg0), (where1, msg1) = debug_pool.run(_diverge_in_debug_mode)
    # rank 1 fails at its extra allocation, rank 0 at its next one: they compare digests there
    assert where1 == "extra" and where0 == "next"
    assert msg1.startswith("rank 1:") and msg0.startswith("rank 0:")
    assert "allocation check (ctx.zeros(shape=(4,)" in msg1
    assert "allocation check (ctx.zeros(shape=(8,)" in msg0
    for msg in (msg0, msg1):
        assert "rank 0: " in msg and "rank 1: " in msg and "out of step" in msg
