"""How groups end (trident/runtime/group_life.py), and the checks on their use.

Pinned here: a group made inside a ``heap_scope`` refuses use after it instead of writing into
the user's next allocation; every group method after ``close()`` raises ContextClosedError, and
close() lets go of the heap at once (no cycle left for the garbage collector), with a trident torch
group too; ``ctx.destroy_group`` gives a region back (and new_group's exhaustion names itself);
members' allocations out of step are caught by ``g.barrier()`` and, in debug mode, at the
allocation; bad arguments to new_group are refused on every rank; two threads launching at once
in the simulator are refused clearly.
"""

import gc
import threading
import time

import pytest
import torch
import torch.distributed as dist

import trident
from tests.helpers import wait_for_one_kernel
from trident import ccl
from trident.backends import interpreter_fixups
from trident.testing import refusals

WS = 1 << 20  # each group's workspace (the pools' heaps are 64 MiB)


def _sum_in(ctx, g, n=300):
    x = torch.full((n,), float(ctx.rank + 1), device=ctx.device)
    ccl.all_reduce(ctx, x, group=g)
    return float(x[0])


def _use_after_scope(ctx):
    with ctx.heap_scope():
        g = ctx.new_group([0, 1], workspace_bytes=WS)
        before = _sum_in(ctx, g)  # its workspace lives in the region the scope frees
    victim = ctx.full((WS // 4,), 7.0)  # the user's next allocation: the memory the group had
    ctx.barrier()
    x = torch.ones(300, device=ctx.device)
    messages = refusals({"all_reduce": lambda: ccl.all_reduce(ctx, x, group=g), "barrier": g.barrier,
                         "zeros": lambda: g.zeros(4), "device_barrier": g.device_barrier})
    ctx.barrier()
    intact = bool(torch.all(victim == 7.0))
    ctx.free(victim)
    return before, messages, intact


def test_a_group_made_in_a_heap_scope_refuses_use_after_it_and_leaves_later_memory_alone(pool2):
    for before, messages, intact in pool2.run(_use_after_scope):
        assert before == 3.0
        assert intact, "the group wrote into memory a later allocation owns"
        for name, message in messages.items():
            assert "heap_scope() it was made in has ended" in message and "-g" in message, (name, message)


def _after_close(ctx):
    def mapped():
        with open("/proc/self/maps") as f:  # the simulator's heaps stay mapped until their memory is freed
            return sum("trident-" in line for line in f)

    gc.disable()  # close() must let go by itself, not through the garbage collector
    try:
        before = mapped()
        c = trident.init(heap_size=16 << 20)
        trident.dist_backend.reserve(c, groups=1, group_bytes=WS)
        g = c.new_group([0, 1], workspace_bytes=WS)
        pg = dist.new_group([0, 1], backend="trident")
        sums = [_sum_in(c, g)]
        x = torch.ones(64)
        dist.all_reduce(x, group=pg)
        sums.append(float(x[0]))
        assert pg.counts["trident"] == 1
        c.close()
        messages = refusals({"g.barrier": g.barrier, "g.empty": lambda: g.empty(4), "g.zeros": lambda: g.zeros(4),
                             "g.device_barrier": g.device_barrier, "g.resource": lambda: g.resource("k", list),
                             "all_reduce": lambda: ccl.all_reduce(c, x, group=g),
                             "dist.barrier": lambda: dist.barrier(group=pg),
                             "dist.all_reduce": lambda: dist.all_reduce(x, group=pg)})
        kinds = {name: type(e).__name__ for name, e in _raised(g, pg).items()}
        dist.destroy_process_group(pg)
        return sums, messages, kinds, before, mapped()
    finally:
        gc.enable()


def _raised(g, pg) -> dict:
    """The exception types behind two of the refusals (refusals() keeps only the text)."""
    out = {}
    for name, call in (("g.barrier", g.barrier), ("dist.barrier", lambda: dist.barrier(group=pg))):
        try:
            call()
        except Exception as exc:
            out[name] = exc
    return out


@pytest.mark.skipif(not trident.platform.SIMULATOR, reason="counts the simulator's heap mappings; CPU tensors")
def test_every_group_use_after_close_is_refused_and_close_releases_the_heap_at_once(pool2):
    for sums, messages, kinds, before, after in pool2.run(_after_close):
        assert sums == [3.0, 2.0]
        for name, message in messages.items():
            assert "context is closed" in message, (name, message)
        assert kinds == {"g.barrier": "ContextClosedError", "dist.barrier": "ContextClosedError"}
        assert after == before, f"{after - before} heap mappings outlive the closed context"


def _destroy_and_reuse(ctx):
    free0 = ctx.memory_stats()["allocated_bytes"]
    for _ in range(12):  # 12 regions of 8 MiB would not fit the 64 MiB heap without destroy_group
        g = ctx.new_group([1, 3], workspace_bytes=8 << 20)
        if g is not None:
            assert _sum_in(ctx, g) == 6.0
        ctx.destroy_group(g)
    same = ctx.memory_stats()["allocated_bytes"] == free0
    g = ctx.new_group([1, 3], workspace_bytes=WS)
    stats = ctx.memory_stats()  # what new_group's exhaustion reports (nothing below allocates)
    later = refusals({"all_none": lambda: ctx.destroy_group(None),
                      "member_none": lambda: ctx.destroy_group(g if ctx.rank == 1 else None),
                      "huge": lambda: ctx.new_group([0, 1], workspace_bytes=ctx.heap_size)})
    ctx.destroy_group(g)
    used = refusals({"after": lambda: _sum_in(ctx, g)}) if g is not None else {}
    again = refusals({"again": lambda: ctx.destroy_group(g)})
    return same, later, used, again, stats


def test_destroy_group_gives_the_region_back_and_the_group_refuses_use(pool4):
    for r, (same, later, used, again, stats) in enumerate(pool4.run(_destroy_and_reuse)):
        assert same
        assert "one live group" in later["all_none"], later
        assert "members [1, 3]" in later["member_none"] and "exactly they pass the group" in later["member_none"]
        huge = later["huge"]
        assert "new_group(ranks=[0, 1], workspace_bytes=67108864)" in huge and "destroy_group" in huge, huge
        assert "ctx.zeros" not in huge
        assert (f"only {stats['free_bytes']} bytes of the heap are free (largest free range "
                f"{stats['largest_free_block']}; heap {stats['heap_size']} bytes)") in huge, huge
        if r in (1, 3):
            assert "destroyed with ctx.destroy_group" in used["after"], used
        assert "one live group" in again["again"], again


def _diverge(ctx):
    g = ctx.new_group([3, 2], workspace_bytes=WS)
    if g is None:
        return None
    a = g.zeros(4)
    if ctx.rank == 2:
        g.zeros(4)  # an extra allocation on one member only
    with pytest.raises(trident.DivergenceError) as info:
        g.barrier()
    g.free(a)
    return str(info.value)


def test_group_barrier_catches_members_allocations_out_of_step(pool4):
    results = pool4.run(_diverge)
    assert results[0] is None and results[1] is None
    for message in results[2:]:
        assert "rank 2 (group rank 1 of [3, 2])" in message and "rank 3 (group rank 0 of [3, 2])" in message
        assert "out of step at g.barrier()" in message


def _diverge_at_allocation(ctx):
    g = ctx.new_group([0, 1], workspace_bytes=WS)
    with pytest.raises(trident.DivergenceError) as info:
        g.zeros(4 if ctx.rank == 0 else 100)
    return str(info.value)


def test_debug_mode_catches_a_groups_allocations_out_of_step_at_the_allocation(debug_pool):
    for message in debug_pool.run(_diverge_at_allocation):
        assert "allocation check (g.empty" in message and "rank 1 (group rank 1 of [0, 1])" in message


def _bad_arguments(ctx):
    g = ctx.new_group([0, 1], workspace_bytes=WS)
    world = ctx.zeros(4)
    return refusals({
        "float": lambda: ctx.new_group([0, 1.5]), "string": lambda: ctx.new_group("01"),
        "negative": lambda: ctx.new_group([0, 1], workspace_bytes=-1),
        "one_rank": lambda: ctx.new_group([0, 1.5] if ctx.rank == 1 else [0, 1], workspace_bytes=WS),
        "free_world": lambda: g.free(world) if g is not None else None,
        "full": lambda: g.zeros(2 * WS) if g is not None else None})


def test_bad_new_group_arguments_are_refused_on_every_rank(pool4):
    for r, m in enumerate(pool4.run(_bad_arguments)):
        assert "ranks=[0, 1.5] must be a sequence of int world ranks" in m["float"]
        assert "ranks='01'" in m["string"]
        assert "workspace_bytes=-1 must be >= 0" in m["negative"]
        assert m["one_rank"].startswith(f"rank {r}: new_group: rank 1: ranks=[0, 1.5]"), m["one_rank"]
        if r < 2:
            assert "not in the group's region" in m["free_world"], m["free_world"]
            assert f"rank {r} (group rank {r} of [0, 1])" in m["full"], m["full"]


def _group_error_text(ctx):
    """An error inside a group names this rank's world rank, with its group rank beside it."""
    g = ctx.new_group([1, 0], workspace_bytes=WS)
    try:
        ccl.all_reduce(ctx, torch.zeros(4, dtype=torch.bool, device=ctx.device), group=g)
        return ""
    except ValueError as exc:
        return str(exc)
    finally:
        ctx.destroy_group(g)


def test_errors_inside_a_group_name_the_world_rank_and_the_group_rank(pool2):
    for rank, message in enumerate(pool2.run(_group_error_text)):
        assert message.startswith(f"rank {rank} (group rank {1 - rank} of [1, 0]): all_reduce"), message


def _two_threads(ctx):
    flag = ctx.zeros(1, dtype=torch.int32)
    ctx.barrier()
    errors = []
    first = threading.Thread(target=lambda: wait_for_one_kernel[(1,)](flag, ctx.rank, ctx.heap_bases))
    first.start()
    deadline = time.monotonic() + 30
    while interpreter_fixups._running[0] is None and time.monotonic() < deadline:
        time.sleep(0.01)  # until the first thread's kernel runs (it spins on the flag)
    try:
        wait_for_one_kernel[(1,)](flag, ctx.rank, ctx.heap_bases)
    except trident.TridentError as exc:
        errors.append(str(exc))
    flag.fill_(1)
    first.join(30)
    wait_for_one_kernel[(1,)](flag, ctx.rank, ctx.heap_bases)  # one at a time works again
    return errors, first.is_alive()


def _simulator(ctx):
    return ctx.platform.simulator


def test_the_simulator_refuses_launches_from_two_threads_at_once_clearly(pool2):
    if pool2.run(_simulator) != [True, True]:
        pytest.skip("the simulator's limit")
    for errors, hung in pool2.run(_two_threads):
        assert not hung
        assert len(errors) == 1 and "cannot run kernels from two threads of one process at once" in errors[0]
