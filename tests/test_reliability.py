"""What a demanding user broke (reliability, round 2): each test pins one bug so it stays fixed."""

import math

import pytest
import torch
import triton
import triton.language as tl

import trident
from tests.conftest import POOL_KWARGS
from tests.helpers import wait_for_one_kernel
from trident.testing import RankPool

# -- heap exhaustion inside a collective leaves nothing pointing at freed memory ---------------


def _exhaustion_body(ctx):
    small = ctx.full((1000,), 1.0)
    trident.ccl.all_reduce(ctx, small)  # the workspace now holds a 1000-float staging area
    big = torch.ones(200_000)  # plain tensor: staged through a workspace buffer that must grow
    try:
        trident.ccl.all_reduce(ctx, big.to(ctx.device))
        raised = "no error"
    except trident.HeapExhaustedError as exc:
        raised = str(exc)
    y = ctx.full((1000,), 42.0)  # may land where the failed growth freed the old buffer
    again = ctx.full((1000,), float(ctx.rank))
    trident.ccl.all_reduce(ctx, again.clone())  # a plain tensor: goes through the staging buffer
    trident.ccl.all_reduce(ctx, again)
    # The same for a fused op's internal buffer (gemm_reduce_scatter's slots for peers' partials).
    w, dev = ctx.world_size, ctx.device
    A, B = torch.ones(8 * w, 16, device=dev), torch.ones(16, 32, device=dev)
    C = torch.empty(8, 32, device=dev)
    trident.ops.gemm_reduce_scatter(ctx, A, B, C, pattern="fused_sequential")
    try:
        big_a, big_b = torch.ones(256 * w, 16, device=dev), torch.ones(16, 1024, device=dev)
        trident.ops.gemm_reduce_scatter(ctx, big_a, big_b, torch.empty(256, 1024, device=dev),
                                        pattern="fused_sequential")
        fused_raised = "no error"
    except trident.HeapExhaustedError as exc:
        fused_raised = str(exc)
    z = ctx.full((2000,), -3.0)
    trident.ops.gemm_reduce_scatter(ctx, A, B, C, pattern="fused_sequential")
    ctx.barrier()
    return raised, y.tolist(), again.tolist(), fused_raised, z.tolist(), C.tolist()


@pytest.fixture(scope="module")
def own_pool():
    """Two ranks of this module's own, with a 1 MiB heap: the heap-exhaustion test fills it, and the last
    test of the module (a collective whose peer never arrives) leaves them out of step. One pool for both
    (each used to start and close one); closed when the module ends."""
    pool = RankPool(2, **dict(POOL_KWARGS, heap_size=1 << 20))
    yield pool
    pool.close()


def test_heap_exhaustion_in_a_collective_leaves_no_dangling_buffer(own_pool):
    results = own_pool.run(_exhaustion_body)
    for raised, y, again, fused_raised, z, C in results:
        assert "heap" in raised.lower() and "bytes" in raised, raised
        assert "trident all_reduce needs its 'input' staging buffer to grow" in raised, raised  # not ctx.empty(...)
        assert y == [42.0] * 1000  # the user's tensor was not overwritten by the workspace
        assert again == [float(sum(range(2)))] * 1000
        assert "heap" in fused_raised.lower() and "bytes" in fused_raised, fused_raised
        assert "trident gemm_reduce_scatter needs its partial-sum slots to grow" in fused_raised, fused_raised
        assert z == [-3.0] * 2000  # nor by the fused op's slots
        assert C == [[32.0] * 32] * 8  # 16 ones summed over 2 ranks


# -- the debug mode reports a peer that is not a rank --------------------------------------------


@triton.jit
def _next_rank_kernel(x_ptr, rank, heap_bases, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    trident.store(x_ptr + offs, offs + 1, rank, rank + 1, heap_bases)  # no `% world_size`


def _bad_peer_body(ctx):
    x = ctx.zeros(8, dtype=torch.int32)
    ctx.barrier()
    message = "no error"
    if ctx.rank == ctx.world_size - 1:  # only the last rank's `rank + 1` is no rank
        try:
            _next_rank_kernel[(1,)](x, ctx.rank, ctx.heap_bases, BLOCK=8)
            ctx.check()
        except Exception as exc:  # the simulator raises in the launch, a GPU in check()
            message = str(exc)
    else:
        _next_rank_kernel[(1,)](x, ctx.rank, ctx.heap_bases, BLOCK=8)
    ctx.barrier()
    return message, x.tolist()


def test_debug_mode_names_a_peer_that_is_not_a_rank(debug_pool):
    results = debug_pool.run(_bad_peer_body)
    last = len(results) - 1
    message, x = results[last]
    assert f"rank {last}: access to peer {last + 1}, which is not a rank" in message, message
    assert f"world size {len(results)}" in message and "% world_size" in message, message
    assert x == [1, 2, 3, 4, 5, 6, 7, 8]  # rank last - 1 wrote it
    assert results[0][1] == [0] * 8  # nobody may write rank 0's: the last rank's `rank + 1` reached nothing


# -- broadcast of an object stays in step ------------------------------------------------------


class _Unpicklable:
    def __reduce__(self):
        raise TypeError("this object refuses to be pickled")


def _broadcast_unpicklable_body(ctx):
    try:
        ctx.broadcast(_Unpicklable() if ctx.rank == 0 else None)
        first = "no error"
    except ValueError as exc:
        first = str(exc)
    second = ctx.broadcast("hello" if ctx.rank == 0 else None)  # the next call gets the new value
    return first, second


def test_broadcast_of_an_unpicklable_object_fails_on_every_rank_and_stays_in_step(pool2):
    for first, second in pool2.run(_broadcast_unpicklable_body):
        assert "rank 0 could not pickle its value" in first and "refuses to be pickled" in first, first
        assert second == "hello"


def _broadcast_tensor_vs_none_body(ctx):
    value = ctx.full((4,), 7.0) if ctx.rank == 0 else None
    try:
        ctx.broadcast(value)
        return "no error"
    except trident.DivergenceError as exc:
        return str(exc)


def test_broadcast_of_a_tensor_against_none_is_a_clear_error_everywhere(pool2):
    for message in pool2.run(_broadcast_tensor_vs_none_body):
        assert "needs a tensor on every rank" in message and "rank 0: a tensor" in message, message
        assert "rank 1: not a tensor" in message, message


# -- timeouts: a wait must end ------------------------------------------------------------------


def _timeout_setter_body(ctx):
    messages = trident.testing.refusals({
        "inf": lambda: setattr(ctx, "wait_timeout", math.inf),
        "bool": lambda: setattr(ctx, "wait_timeout", True),
        "none": lambda: setattr(ctx, "wait_timeout", None),
        "nan": lambda: setattr(ctx, "wait_timeout", math.nan),
    })
    ctx.wait_timeout = 20.0
    return messages


def test_wait_timeout_refuses_infinite_and_non_numbers(pool2):
    messages = pool2.run(_timeout_setter_body)[0]
    assert "too large" in messages["inf"] and "a wait must end" in messages["inf"], messages
    for name in ("bool", "none", "nan"):
        assert "positive number of seconds" in messages[name], messages


@pytest.mark.parametrize("value", ["inf", "1e400"])
def test_timeout_environment_variable_refuses_infinity(monkeypatch, value):
    from trident.runtime.context import _seconds

    monkeypatch.setenv("TRIDENT_TIMEOUT", value)
    with pytest.raises(ValueError, match="too large"):
        _seconds("timeout", None, "TRIDENT_TIMEOUT")


# -- ranks that disagree on WORLD_SIZE say so at once, not at the timeout ------------------------


def test_ranks_disagreeing_on_world_size_fail_fast_even_with_a_long_timeout():
    import subprocess
    import sys
    import time

    from tests.test_host_api import _INIT, REPO, _env, _last_line
    from trident.runtime.rendezvous import free_port

    port, procs, start = str(free_port()), [], time.monotonic()
    for rank, world in [(0, 2), (1, 3)]:
        env = _env(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=port, TRIDENT_TIMEOUT="120")
        procs.append(subprocess.Popen([sys.executable, "-c", _INIT], cwd=REPO, env=env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    try:
        errors = [p.communicate(timeout=100)[1] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert time.monotonic() - start < 40, "a rank waited for the timeout instead of noticing the disagreement"
    for rank, err in enumerate(errors):
        last = _last_line(err)
        assert f"rank {rank}:" in last and "WORLD_SIZE" in last, f"rank {rank}: {last}"


# -- the simulator raises trident's own errors, not Triton's wrapped ones ------------------------


def _caught_timeout_body(ctx):
    flag = ctx.zeros(1, dtype=torch.int32)
    ctx.barrier()
    ctx.wait_timeout = 0.2
    try:
        wait_for_one_kernel[(1,)](flag, ctx.rank, ctx.heap_bases)
        ctx.check()
        caught = "no error"
    except trident.RankTimeoutError as exc:
        caught = f"{type(exc).__name__}: {exc}"
    finally:
        ctx.wait_timeout = 20.0
    ctx.barrier()
    return caught


def test_a_wait_that_gives_up_is_caught_as_rank_timeout_error(pool2):
    for rank, caught in enumerate(pool2.run(_caught_timeout_body)):
        assert caught.startswith(f"RankTimeoutError: rank {rank}: trident.wait timed out"), caught
        assert "\\\\" not in caught and "InterpreterError" not in caught, caught  # not repr()-escaped


# -- collectives refuse what they would get wrong -------------------------------------------------


def _collective_refusals_body(ctx):
    w = ctx.world_size
    x = ctx.ones(4 * w)
    rows = torch.ones(4 * w, 2, device=ctx.device)
    return trident.testing.refusals({
        "bare int op": lambda: trident.ccl.all_reduce(ctx, ctx.ones(8), op=3),
        "complex": lambda: trident.ccl.all_gather(ctx, torch.zeros(2 * w, dtype=torch.complex64, device=ctx.device),
                                                  torch.zeros(2, dtype=torch.complex64, device=ctx.device)),
        "in-place all_to_all": lambda: trident.ccl.all_to_all(ctx, x, x),
        "float splits": lambda: trident.ccl.all_to_all_v(ctx, torch.empty(4 * w, 2, device=ctx.device),
                                                         ctx.as_symmetric(rows), [4.5] * w, [4.0] * w),
    })


def test_collectives_refuse_bare_int_ops_complex_aliasing_and_float_splits(pool2):
    messages = pool2.run(_collective_refusals_body)[0]
    assert "op=3 is not supported" in messages["bare int op"], messages
    assert "complex" in messages["complex"] and "view_as_real" in messages["complex"], messages
    assert "share memory" in messages["in-place all_to_all"], messages
    assert "integer row counts" in messages["float splits"], messages


# -- a collective whose peer never arrives gives up after wait_timeout, not a multiple of it ---------


def _peer_never_arrives(ctx):
    import time

    x = torch.ones(256, device=ctx.device)
    trident.ccl.all_reduce(ctx, x)  # warm: no host barrier (workspace) left in the timed call
    ctx.barrier()
    elapsed, raised = None, ""
    if ctx.rank == 0:
        ctx.wait_timeout = 2.0
        start = time.monotonic()
        try:
            trident.ccl.all_reduce(ctx, x)  # rank 1 never calls it
            ctx.check()
        except trident.RankTimeoutError as exc:
            raised = str(exc)
        elapsed = time.monotonic() - start
    ctx.all_gather_object("rank 0 gave up", None)  # rank 1 waits here meanwhile
    return elapsed, raised


def test_a_collective_whose_peer_never_arrives_gives_up_after_one_wait_timeout(own_pool):
    """Two waits in a row each waited the whole timeout on the GPU (2 x 3 s), and the simulator's
    waits read the clock only every 256 interpreted polls (5.6 s for 2 s). The module's own ranks (the
    timed-out call leaves them out of step): this test stays the last of the module to use them."""
    (elapsed, raised), _ = own_pool.run(_peer_never_arrives)
    assert "timed out after 2 s" in raised and "rank 0" in raised, raised
    assert 2.0 <= elapsed < 3.5, f"gave up after {elapsed:.1f} s with wait_timeout = 2 s"
