"""Message passing with release/acquire, bounded waits, the device barrier and CUDA-graph capture."""

import threading
import time

import torch
import triton
import triton.language as tl

import trident
from tests.helpers import capture_graph, run_graph_test


@triton.jit
def ring_kernel(data_ptr, inbox_ptr, flags_ptr, out_ptr, n, rank, world_size, heap_bases, BLOCK: tl.constexpr):
    """Program p sends tile p to the right neighbour and releases flag p there; then acquires its own flag p."""
    tile = tl.program_id(0)
    offs = tile * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    right = (rank + 1) % world_size
    trident.put(data_ptr + offs, inbox_ptr + offs, rank, right, heap_bases, mask=mask)
    trident.signal(flags_ptr + tile, 1, rank, right, heap_bases)
    trident.wait(flags_ptr + tile, 1, rank, rank, heap_bases)
    tl.store(out_ptr + offs, tl.load(inbox_ptr + offs, mask=mask) * 3, mask=mask)


def _ring_body(ctx):
    n, block = 300, 64
    data = ctx.as_symmetric(torch.arange(n, dtype=torch.float32) + 1000 * ctx.rank)
    inbox, out = ctx.zeros(n), ctx.zeros(n)
    flags = ctx.zeros(triton.cdiv(n, block), dtype=torch.int32)
    ctx.barrier()
    ring_kernel[(triton.cdiv(n, block),)](data, inbox, flags, out, n, ctx.rank, ctx.world_size, ctx.heap_bases,
                                          BLOCK=block)
    ctx.barrier()
    left = (ctx.rank - 1) % ctx.world_size
    return torch.equal(out.cpu(), (torch.arange(n, dtype=torch.float32) + 1000 * left) * 3)


def test_ring_release_acquire(pool):
    assert all(pool.run(_ring_body))


@triton.jit
def epoch_kernel(value_ptr, slots_ptr, count_ptr, epoch, rank, world_size, heap_bases):
    """All-to-one with monotonic epochs: flags are never reset, each round waits for `>= epoch`."""
    trident.store(slots_ptr + rank, tl.load(value_ptr) + epoch, rank, 0, heap_bases)
    trident.signal(count_ptr, 1, rank, 0, heap_bases, op="add")
    if rank == 0:
        seen = trident.wait(count_ptr, epoch * world_size, rank, rank, heap_bases, cmp="ge")
        tl.store(value_ptr + 1, seen)


def _epoch_body(ctx, rounds):
    value = ctx.as_symmetric(torch.tensor([10 * ctx.rank, -1], dtype=torch.int64))
    slots = ctx.full((ctx.world_size,), -1, dtype=torch.int64)
    count = ctx.zeros(1, dtype=torch.int64)
    ctx.barrier()
    seen = []
    for epoch in range(1, rounds + 1):
        epoch_kernel[(1,)](value, slots, count, epoch, ctx.rank, ctx.world_size, ctx.heap_bases)
        if ctx.rank == 0:  # rank 0's wait has returned: every rank's store of this round is visible
            seen.append((slots.tolist(), int(value[1])))
        ctx.barrier()
    return seen


def test_all_to_one_with_epochs(pool):
    rounds = 3
    results = pool.run(_epoch_body, rounds)
    world = len(results)
    for epoch, (slots, count) in enumerate(results[0], start=1):
        assert slots == [10 * r + epoch for r in range(world)]
        assert count >= epoch * world
    assert all(r == [] for r in results[1:])


@triton.jit
def signal_peers_kernel(data_ptr, words_ptr, out_ptr, rank, world_size, heap_bases, WORLD_BLOCK: tl.constexpr):
    """Every peer gets this rank's value in slot ``rank`` of its data, then one release of word ``rank``
    to all of them; then wait for every peer's word here and read their values."""
    peers = tl.arange(0, WORLD_BLOCK)
    is_peer = (peers < world_size) & (peers != rank)
    trident.store(data_ptr + rank + peers * 0, 100 + rank + peers * 0, rank, peers, heap_bases, mask=is_peer)
    trident.signal_peers(words_ptr + rank, 7, rank, world_size, heap_bases, WORLD_BLOCK)
    trident.wait(words_ptr + peers, 7, rank, rank, heap_bases, mask=is_peer)
    tl.store(out_ptr + peers, tl.load(data_ptr + peers, mask=peers < world_size), mask=peers < world_size)


def _signal_peers_body(ctx):
    data = ctx.full((ctx.world_size,), -1, dtype=torch.int64)
    words = ctx.zeros(ctx.world_size, dtype=torch.int64)
    out = ctx.zeros(ctx.world_size, dtype=torch.int64)
    ctx.barrier()
    signal_peers_kernel[(1,)](data, words, out, ctx.rank, ctx.world_size, ctx.heap_bases,
                              WORLD_BLOCK=triton.next_power_of_2(ctx.world_size))
    ctx.barrier()
    return out.tolist(), words.tolist()


def test_signal_peers_releases_to_every_other_rank_and_not_to_itself(pool):
    results = pool.run(_signal_peers_body)
    world = len(results)
    for rank, (seen, words) in enumerate(results):
        assert seen == [100 + r if r != rank else -1 for r in range(world)]
        assert words == [7 if r != rank else 0 for r in range(world)]  # its own word untouched


@triton.jit
def block_wait_kernel(flags_ptr, out_ptr, n, rank, heap_bases, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    seen = trident.wait(flags_ptr + offs, 2, rank, rank, heap_bases, cmp="ge", mask=offs < n)
    tl.store(out_ptr + offs, seen, mask=offs < n)


@triton.jit
def block_signal_kernel(flags_ptr, n, rank, world_size, heap_bases, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    for peer in range(world_size):
        trident.signal(flags_ptr + offs, 1, rank, peer, heap_bases, op="add", mask=offs < n)


def _block_wait_body(ctx):
    n = 5  # flags in a block of 8: the 3 lanes past n must be ignored by the wait
    flags = ctx.zeros(8, dtype=torch.int32)
    flags[n:] = -100
    out = ctx.zeros(8, dtype=torch.int32)
    ctx.barrier()
    block_signal_kernel[(1,)](flags, n, ctx.rank, ctx.world_size, ctx.heap_bases, BLOCK=8)
    block_wait_kernel[(1,)](flags, out, n, ctx.rank, ctx.heap_bases, BLOCK=8)
    ctx.barrier()
    return out.tolist()[:n], flags.tolist()


def test_wait_on_a_masked_block_of_flags(pool):
    results = pool.run(_block_wait_body)
    world = len(results)
    for seen, flags in results:
        assert all(s >= 2 for s in seen)
        assert flags == [world] * 5 + [-100] * 3


@triton.jit
def gated_wait_kernel(flags_ptr, gate_ptr, n, rank, heap_bases, BLOCK: tl.constexpr):
    """The MoE combine's pattern: a block mask and a scalar comparison of a loaded value."""
    offs = tl.arange(0, BLOCK)
    trident.wait(flags_ptr + offs, 2, rank, rank, heap_bases, cmp="ge", mask=(offs < n) & (tl.load(gate_ptr) <= 1))


def _gated_wait_body(ctx):
    flags = ctx.zeros(8, dtype=torch.int32)
    flags[:5] = 2
    gate = ctx.zeros(1, dtype=torch.int32)
    gated_wait_kernel[(1,)](flags, gate, 5, ctx.rank, ctx.heap_bases, BLOCK=8)
    ctx.barrier()
    if not ctx.platform.simulator:
        return "bool"
    import numpy as np
    from triton.runtime import interpreter

    three = interpreter.TensorHandle(np.array([3], dtype=np.int32), tl.int32)
    cmp = interpreter.InterpreterBuilder().create_icmpSLE(three, three)
    return f"{cmp.data.dtype}/{cmp.dtype}"


def test_a_mask_made_with_a_scalar_comparison(pool2):
    """A scalar comparison broadcast into a block mask stays bool in the simulator (Triton 3.9's
    interpreter refuses an int32 mask: "mask has unsupported dtype"); lanes past n are not waited on."""
    for got in pool2.run(_gated_wait_body):
        assert got in ("bool", "bool/int1"), got


@triton.jit
def lonely_wait_kernel(flag_ptr, rank, heap_bases):
    trident.wait(flag_ptr, 7, rank, rank, heap_bases)


def _timeout_body(ctx):
    ctx.wait_timeout = 0.5
    flag = ctx.zeros(4, dtype=torch.int32)
    offset = flag.data_ptr() + 8 - ctx.heap_bases_host[ctx.rank]
    start = time.monotonic()
    try:
        lonely_wait_kernel[(1,)](flag[2:], ctx.rank, ctx.heap_bases)  # nobody ever sets it
        ctx.check()
        message = "no error"
    except Exception as exc:  # the simulator raises in the launch, a GPU in check()
        message = str(exc)
    elapsed = time.monotonic() - start
    ctx.wait_timeout = 20
    return message, offset, elapsed


def test_a_wait_nobody_answers_ends_with_an_error_naming_rank_and_flag(pool2):
    for rank, (message, offset, elapsed) in enumerate(pool2.run(_timeout_body)):
        assert f"rank {rank}: trident.wait timed out" in message, message
        assert f"heap offset {offset:#x}" in message and "waited for 7, last saw 0" in message
        assert elapsed < 15


@triton.jit
def same_launch_kernel(flag_ptr, rank, heap_bases):
    # Program 0 waits for program 1 of the SAME launch: fine on a GPU, impossible in the simulator.
    if tl.program_id(0) == 0:
        trident.wait(flag_ptr, 1, rank, rank, heap_bases)
    else:
        trident.signal(flag_ptr, 1, rank, rank, heap_bases)


def _same_launch_body(ctx):
    ctx.wait_timeout = 0.5
    flag = ctx.zeros(1, dtype=torch.int32)
    try:
        same_launch_kernel[(2,)](flag, ctx.rank, ctx.heap_bases)
        ctx.check()
        outcome = f"ok {flag.item()}"
    except Exception as exc:
        outcome = str(exc)
    ctx.wait_timeout = 20
    return ctx.backend, outcome


def test_waiting_on_a_later_program_of_the_same_launch(pool2):
    for backend, outcome in pool2.run(_same_launch_body):
        if backend == "sim":
            assert "timed out" in outcome and "one after another" in outcome, outcome
        else:
            assert outcome == "ok 1", outcome


def _abort_body(ctx):
    ctx.wait_timeout = 60
    flag = ctx.zeros(1, dtype=torch.int32)
    timer = threading.Timer(0.5, ctx.abort)
    start = time.monotonic()
    timer.start()
    try:
        lonely_wait_kernel[(1,)](flag, ctx.rank, ctx.heap_bases)
        ctx.check()
        message = "no error"
    except Exception as exc:
        message = str(exc)
    timer.join()
    ctx.wait_timeout = 20
    return message, time.monotonic() - start


def test_abort_ends_a_spinning_wait(pool2):
    for message, elapsed in pool2.run(_abort_body):
        assert "was aborted by the host" in message, message
        assert elapsed < 30


@triton.jit
def write_peers_kernel(buf_ptr, value_ptr, rank, world_size, heap_bases):
    for peer in range(world_size):
        trident.store(buf_ptr + rank, tl.load(value_ptr), rank, peer, heap_bases)


@triton.jit
def sum_kernel(buf_ptr, out_ptr, world_size):
    offs = tl.arange(0, 64)
    tl.store(out_ptr, tl.sum(tl.load(buf_ptr + offs, mask=offs < world_size, other=0), axis=0))


def _device_barrier_body(ctx, rounds):
    buf = ctx.zeros(ctx.world_size, dtype=torch.int64)
    value = ctx.zeros(1, dtype=torch.int64)
    out = ctx.zeros(1, dtype=torch.int64)
    ctx.barrier()
    sums = []
    for r in range(rounds):
        value.fill_(r * 100 + ctx.rank)
        write_peers_kernel[(1,)](buf, value, ctx.rank, ctx.world_size, ctx.heap_bases)
        ctx.device_barrier()  # every rank's stores into my buf have landed
        sum_kernel[(1,)](buf, out, ctx.world_size)
        ctx.device_barrier()  # nobody overwrites buf for the next round before I have summed it
        sums.append(out.item())
    return sums


def test_device_barrier_orders_rounds(pool):
    rounds = 4
    results = pool.run(_device_barrier_body, rounds)
    world = len(results)
    want = [sum(r * 100 + q for q in range(world)) for r in range(rounds)]
    assert results == [want] * world


def _graph_body(ctx, replays):
    if ctx.backend != "cuda":
        return "skipped"
    buf = ctx.zeros(ctx.world_size, dtype=torch.int64)
    value = ctx.zeros(1, dtype=torch.int64)
    out = ctx.zeros(1, dtype=torch.int64)
    ctx.barrier()

    def step():
        write_peers_kernel[(1,)](buf, value, ctx.rank, ctx.world_size, ctx.heap_bases)
        ctx.device_barrier()
        sum_kernel[(1,)](buf, out, ctx.world_size)
        ctx.device_barrier()

    step()  # compile outside the capture
    ctx.barrier()
    graph = capture_graph(step)
    ctx.barrier()
    sums = []
    for r in range(replays):
        value.fill_(r * 10 + ctx.rank)
        torch.cuda.synchronize()
        graph.replay()
        torch.cuda.synchronize()
        sums.append(out.item())
    ctx.barrier()
    return sums


def test_device_barrier_inside_a_cuda_graph(pool):
    results = run_graph_test(pool, _graph_body, 3)
    world = len(results)
    assert results == [[sum(r * 10 + q for q in range(world)) for r in range(3)]] * world
