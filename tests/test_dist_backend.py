"""The torch.distributed backend "trident": ``dist.new_group(ranks, backend="trident")``.

Every collective trident runs is checked against a reference computed from every rank's input;
ops it does not run go to the fallback group (gloo in the simulator, NCCL on GPUs) and must be
right too. Each task destroys its torch groups before it ends (the pool frees the task's heap,
the slots reserved for torch groups included).
"""

import contextlib
import pathlib

import torch
import torch.distributed as dist

import trident
from tests.conftest import get_pool

SLOT = 1 << 20  # each slot's workspace: small heaps in the test pools


def _collective(name):
    """torch >= 2.13 names (all_gather_single, reduce_scatter_single) with the older ones as fallback."""
    new = {"all_gather": "all_gather_single", "reduce_scatter": "reduce_scatter_single"}[name]
    old = {"all_gather": "all_gather_into_tensor", "reduce_scatter": "reduce_scatter_tensor"}[name]
    return getattr(dist, new, None) or getattr(dist, old)


def _destroy(*groups):
    for g in groups:
        if g is not None and g != dist.GroupMember.NON_GROUP_MEMBER:
            dist.destroy_process_group(g)


@contextlib.contextmanager
def _world_group(ctx):
    """A trident torch group of the whole world (its slots reserved first), destroyed at the end."""
    import trident

    trident.dist_backend.reserve(ctx, groups=2, group_bytes=SLOT)
    g = dist.new_group(list(range(ctx.world_size)), backend="trident")
    try:
        yield g
    finally:
        _destroy(g)


def _in_world_group(ctx, body):
    """``body(ctx, g)``, ``g`` a trident group of the whole world (:func:`_world_group`); returns the
    group's counts of the calls trident ran and those it left to the fallback."""
    with _world_group(ctx) as g:
        body(ctx, g)
        return dict(g.counts)


def _counts(body) -> dict:
    """Run ``body(ctx, g)`` in a world group on two ranks (:func:`_in_world_group`); both ranks must
    count the same calls: returns the counts."""
    first, second = get_pool(2).run(_in_world_group, body)
    assert first == second, (first, second)
    return first


def _value(rank, n, dtype, salt=0):
    return (torch.arange(n, dtype=torch.float64) * (rank + 1) + salt + 3 * rank).to(dtype)


def _collectives_body(ctx, g):
    import trident

    w, r, dev = ctx.world_size, ctx.rank, ctx.device
    assert isinstance(g, trident.dist_backend.TridentProcessGroup), type(g)
    for dtype in (torch.float32, torch.int32):
        for op, fold in ((dist.ReduceOp.SUM, torch.stack), (dist.ReduceOp.MAX, torch.stack),
                         (dist.ReduceOp.MIN, torch.stack)):
            t = _value(r, 37, dtype).to(dev)
            dist.all_reduce(t, op=op, group=g)
            every = fold([_value(p, 37, dtype) for p in range(w)])
            want = {dist.ReduceOp.SUM: every.sum(0), dist.ReduceOp.MAX: every.max(0).values,
                    dist.ReduceOp.MIN: every.min(0).values}[op].to(dtype)
            assert torch.equal(t.cpu(), want), (dtype, op)
    out = torch.empty(w * 24, device=dev)
    _collective("all_gather")(out, _value(r, 24, torch.float32).to(dev), group=g)
    assert torch.equal(out.cpu(), torch.cat([_value(p, 24, torch.float32) for p in range(w)]))
    out = torch.empty(5, 3, device=dev)
    _collective("reduce_scatter")(out, _value(r, w * 15, torch.float32).view(w * 5, 3).to(dev), group=g)
    total = sum(_value(p, w * 15, torch.float32) for p in range(w)).view(w * 5, 3)
    assert torch.allclose(out.cpu(), total[r * 5:(r + 1) * 5])
    out = torch.empty(w * 4, 2, device=dev)
    dist.all_to_all_single(out, _value(r, w * 8, torch.float32).view(w * 4, 2).to(dev), group=g)
    want = torch.cat([_value(p, w * 8, torch.float32).view(w * 4, 2)[r * 4:(r + 1) * 4] for p in range(w)])
    assert torch.equal(out.cpu(), want)
    t = _value(r, 10, torch.float32).to(dev)
    dist.broadcast(t, src=w - 1, group=g)
    assert torch.equal(t.cpu(), _value(w - 1, 10, torch.float32))
    dist.barrier(group=g)
    work = dist.all_reduce(torch.ones(4, device=dev), group=g, async_op=True)
    work.wait()


def test_every_collective_runs_on_trident_and_matches_torch():
    assert _counts(_collectives_body) == {"trident": 11, "fallback": 0}


def _work_reuse_body(ctx, g):
    from trident.runtime import host_staging

    made = []
    init = host_staging.CompletedWork.__init__
    host_staging.CompletedWork.__init__ = lambda self, result: (made.append(1), init(self, result))[1]
    try:
        t = ctx.ones(8)
        for _ in range(4):  # torch drops each Work after wait(): the group's spare serves them all
            dist.all_reduce(t, group=g)
        synchronous = len(made)
        kept = [dist.all_reduce(torch.full((2,), float(i), device=ctx.device), group=g, async_op=True)
                for i in range(3)]  # held by the caller: each its own Work, its own result
    finally:
        host_staging.CompletedWork.__init__ = init
    w = ctx.world_size
    assert float(t[0]) == w ** 4
    assert len({id(k) for k in kept}) == 3
    assert [float(k.result()[0][0]) for k in kept] == [0.0, w * 1.0, w * 2.0]
    return synchronous


def test_a_work_nothing_holds_is_reused_and_a_held_one_is_not():
    results = get_pool(2).run(_in_world_group_returning, _work_reuse_body)
    assert results == [0, 0], results  # the group's spare Work served the four synchronous calls


def _in_world_group_returning(ctx, body):
    with _world_group(ctx) as g:
        return body(ctx, g)


def _fallback_body(ctx, g):
    w, r, dev = ctx.world_size, ctx.rank, ctx.device
    parts = [torch.empty(6, device=dev) for _ in range(w)]
    dist.all_gather(parts, _value(r, 6, torch.float32).to(dev), group=g)  # a list: not trident's
    assert all(torch.equal(p.cpu(), _value(q, 6, torch.float32)) for q, p in enumerate(parts))
    # Unequal splits: rank r sends q + 1 rows to rank q.
    in_splits = [q + 1 for q in range(w)]
    out_splits = [r + 1] * w
    inp = torch.full((sum(in_splits), 2), float(r), device=dev)
    out = torch.empty(sum(out_splits), 2, device=dev)
    dist.all_to_all_single(out, inp, out_splits, in_splits, group=g)
    assert torch.equal(out.cpu(), torch.cat([torch.full((r + 1, 2), float(p)) for p in range(w)]))
    t = torch.full((3,), float(r + 2), device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.PRODUCT, group=g)  # not sum / max / min
    assert torch.equal(t.cpu(), torch.full((3,), float(torch.arange(2, w + 2).prod())))
    big = torch.ones(SLOT // 4 + 1, dtype=torch.uint8, device=dev)  # past a quarter of the slot
    dist.all_reduce(big, group=g)
    assert int(big.cpu().min()) == w


def test_what_trident_does_not_run_falls_back_and_is_right():
    assert _counts(_fallback_body) == {"trident": 0, "fallback": 4}


def _host_staged_body(ctx, g):
    """What gloo cannot do on CUDA tensors (ranks sharing a GPU) goes through host copies. On a GPU
    without NCCL the group stages CUDA tensors by itself; the simulator's tensors live on the host,
    so there every tensor is staged, to run the same path."""
    from trident.runtime.host_staging import CompletedWork, HostStaged

    w, r, dev = ctx.world_size, ctx.rank, ctx.device
    if ctx.platform.simulator:
        g.fallback = HostStaged(g.fallback, stage=lambda t: True)
    elif not ctx.platform.nccl_usable:
        assert isinstance(g.fallback, HostStaged)
    staged = isinstance(g.fallback, HostStaged)
    # Point to point: a ring.
    got = torch.empty(5, device=dev)
    if r % 2 == 0:
        dist.send(_value(r, 5, torch.float32).to(dev), (r + 1) % w, group=g)
        dist.recv(got, (r - 1) % w, group=g)
    else:
        dist.recv(got, (r - 1) % w, group=g)
        dist.send(_value(r, 5, torch.float32).to(dev), (r + 1) % w, group=g)
    assert torch.equal(got.cpu(), _value((r - 1) % w, 5, torch.float32))
    # gather / scatter to and from rank 0.
    parts = [torch.empty(4, device=dev) for _ in range(w)] if r == 0 else None
    dist.gather(_value(r, 4, torch.float32).to(dev), parts, dst=0, group=g)
    if r == 0:
        assert all(torch.equal(p.cpu(), _value(q, 4, torch.float32)) for q, p in enumerate(parts))
    mine = torch.empty(3, device=dev)
    dist.scatter(mine, [_value(q, 3, torch.float32, salt=7).to(dev) for q in range(w)] if r == 0 else None,
                 src=0, group=g)
    assert torch.equal(mine.cpu(), _value(r, 3, torch.float32, salt=7))
    # An async call's Work is already done.
    work = dist.all_reduce(torch.full((2,), 2.0, device=dev), op=dist.ReduceOp.PRODUCT, group=g, async_op=True)
    assert work.wait() and (not staged or isinstance(work, CompletedWork) or work.is_completed())
    # DistributedDataParallel on the group: parameters broadcast from rank 0, gradients averaged.
    torch.manual_seed(1 + r)  # different initial weights: DDP must make them equal
    model = torch.nn.Linear(4, 2).to(dev)
    ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=g)
    ddp(torch.randn(3, 4, device=dev)).sum().backward()
    weights = [torch.empty_like(model.weight) for _ in range(w)]
    dist.all_gather(weights, model.weight.detach(), group=g)
    grads = [torch.empty_like(model.weight) for _ in range(w)]
    dist.all_gather(grads, model.weight.grad, group=g)
    assert all(torch.equal(x, weights[0]) for x in weights) and all(torch.equal(x, grads[0]) for x in grads)
    assert staged or torch.cuda.is_available()  # the simulator always stages here


def test_what_gloo_cannot_run_on_gpu_tensors_goes_through_the_host():
    """send/recv, gather, scatter and DistributedDataParallel on a trident torch group whose fallback is
    gloo (ranks sharing a GPU: issue 34, where gloo failed with "writev ... Bad address")."""
    counts = _counts(_host_staged_body)
    assert counts["fallback"] >= 6, counts


def _ddp_body(ctx, g):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)).to(ctx.device)
    batches = [torch.randn(5, 8, generator=torch.Generator().manual_seed(100 + p)) for p in range(ctx.world_size)]
    targets = [torch.randn(5, 4, generator=torch.Generator().manual_seed(200 + p)) for p in range(ctx.world_size)]
    # The reference: the gradient of the mean loss over every rank's batch, on one rank.
    torch.nn.functional.mse_loss(model(torch.cat(batches).to(ctx.device)), torch.cat(targets).to(ctx.device)
                                 ).backward()
    want = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    # DDP-style: this rank's batch, then every gradient all-reduced over the trident group and averaged.
    loss = torch.nn.functional.mse_loss(model(batches[ctx.rank].to(ctx.device)), targets[ctx.rank].to(ctx.device))
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad, group=g)
        p.grad /= dist.get_world_size(g)
    for got, ref in zip((p.grad for p in model.parameters()), want):
        assert torch.allclose(got, ref, atol=1e-6, rtol=1e-5), (got - ref).abs().max()


def test_ddp_style_gradient_all_reduce():
    assert _counts(_ddp_body) == {"trident": 4, "fallback": 0}


def _mesh_body(ctx):
    from torch.distributed.device_mesh import init_device_mesh

    import trident

    trident.dist_backend.reserve(ctx, groups=2, group_bytes=SLOT)
    device_type = "cpu" if ctx.platform.simulator else "cuda"
    mesh = init_device_mesh(device_type, (2, 2), mesh_dim_names=("dp", "tp"),
                            backend_override={"dp": "trident", "tp": "trident"})
    dp, tp = mesh.get_group("dp"), mesh.get_group("tp")
    try:
        out = {}
        for name, g in (("dp", dp), ("tp", tp)):
            assert isinstance(g, trident.dist_backend.TridentProcessGroup), type(g)
            t = torch.full((16,), float(ctx.rank), device=ctx.device)
            dist.all_reduce(t, group=g)
            out[name] = (dist.get_process_group_ranks(g), float(t[0]))
        return out
    finally:
        _destroy(dp, tp)


def test_device_mesh_dimensions_on_trident_groups():
    """A 2 x 2 DeviceMesh whose two dimensions both use the trident backend: each rank is in two groups."""
    results = get_pool(4).run(_mesh_body)
    mesh = torch.arange(4).view(2, 2)
    for rank, got in enumerate(results):
        row, col = divmod(rank, 2)
        assert got["tp"] == (mesh[row].tolist(), float(mesh[row].sum()))
        assert got["dp"] == (mesh[:, col].tolist(), float(mesh[:, col].sum()))


def _strided_groups_body(ctx):
    import trident

    trident.dist_backend.reserve(ctx, groups=1, group_bytes=SLOT)
    # Disjoint groups may share a slot index: each member's slot is its own memory.
    evens, odds = dist.new_group([0, 2], backend="trident"), dist.new_group([1, 3], backend="trident")
    mine = evens if ctx.rank % 2 == 0 else odds
    try:
        t = torch.full((8,), float(ctx.rank + 1), device=ctx.device)
        dist.all_reduce(t, group=mine)
        return float(t[0]), mine.group.ranks
    finally:
        _destroy(evens, odds)


def test_strided_groups_share_a_slot_index():
    results = get_pool(4).run(_strided_groups_body)
    assert results == [(4.0, (0, 2)), (6.0, (1, 3)), (4.0, (0, 2)), (6.0, (1, 3))]


def _exhausted_body(ctx):
    import trident

    trident.dist_backend.reserve(ctx, groups=1, group_bytes=SLOT)
    first = dist.new_group([0, 1], backend="trident")
    try:
        dist.new_group([0, 1], backend="trident")
        message = "accepted"
    except trident.TridentError as exc:
        message = str(exc)
    _destroy(first)
    again = dist.new_group([0, 1], backend="trident")  # the destroyed group gave its slot back
    t = torch.ones(4, device=ctx.device)
    dist.all_reduce(t, group=again)
    _destroy(again)
    return message, float(t[0])


def test_running_out_of_slots_names_the_parameter():
    message, total = get_pool(2).run(_exhausted_body)[0]
    assert "no heap slot is free" in message and "groups=" in message and "reserve" in message, message
    assert total == 2.0


def _slot_freed_by_its_scope_body(ctx):
    import trident

    with ctx.heap_scope():
        trident.dist_backend.reserve(ctx, groups=1, group_bytes=SLOT)
        pg = dist.new_group([0, 1], backend="trident")
        t = torch.ones(64, device=ctx.device)
        dist.all_reduce(t, group=pg)  # on trident, in the slot the scope frees
    victim = ctx.full((2 * SLOT // 4,), 7.0)  # the user's next allocation: the slot's memory
    ctx.barrier()
    t = torch.ones(64, device=ctx.device)
    dist.all_reduce(t, group=pg)
    dist.barrier(group=pg)
    ctx.barrier()
    intact, counts = bool(torch.all(victim == 7.0)), dict(pg.counts)
    _destroy(pg)
    ctx.free(victim)
    return intact, float(t[0]), counts, pg.group._released


def test_a_torch_group_whose_slot_its_heap_scope_freed_runs_on_its_fallback():
    for intact, total, counts, why in get_pool(2).run(_slot_freed_by_its_scope_body):
        assert intact, "the torch group wrote into memory a later allocation owns"
        assert total == 2.0 and counts == {"trident": 1, "fallback": 2}, counts  # the all_reduce and barrier
        assert "heap_scope() in which trident.dist_backend.reserve() made its heap slots has ended" in why


def _unreserved_body(ctx):
    import trident

    try:
        dist.new_group([0, 1], backend="trident")
    except trident.TridentError as exc:
        return str(exc)
    return "accepted"


def test_without_slots_the_error_says_what_to_call():
    from tests.conftest import POOL_KWARGS
    from trident.testing import RankPool

    pool = RankPool(2, **{**POOL_KWARGS, "dist_groups": 0})  # init kept no slots
    try:
        message = pool.run(_unreserved_body)[0]
    finally:
        pool.close()
    assert "trident.init(dist_groups=N)" in message and "trident.dist_backend.reserve(ctx" in message, message


def _right_after_init_body(ctx):
    region = ctx.reserved_region(trident.dist_backend.NAME)  # what trident.init kept for torch groups
    g = dist.new_group(list(range(ctx.world_size)), backend="trident")  # no reserve: init's slots
    t = torch.full((8,), float(ctx.rank + 1), device=ctx.device)
    dist.all_reduce(t, group=g)
    _destroy(g)
    return float(t[0]), trident.dist_backend.slots_in(ctx.heap_size, region)[0], region.offset, ctx.heap_size


def test_a_trident_group_works_right_after_init():
    # A pool of its own (an env entry makes it distinct): no test before it called reserve there.
    for total, count, offset, heap_size in get_pool(2, TRIDENT_TEST_POOL="fresh").run(_right_after_init_body):
        assert total == 3.0
        assert count == 4 and heap_size - offset < heap_size // 8  # the top 1/16 of the heap, and a little


def test_import_registers_nothing_and_init_registers_both():
    """``import trident`` registers nothing with torch; ``trident.init`` (here: the two functions it
    calls) registers the custom ops and the torch.distributed backend."""
    import subprocess
    import sys

    code = ("import torch, torch.distributed as dist, trident\n"
            "seen = lambda: ('TRIDENT' in dist.Backend._plugins, hasattr(torch.ops.trident, 'all_reduce'))\n"
            "print(*seen())\n"
            "trident.torch_ops.register(); trident.dist_backend.register(); trident.torch_ops.register()\n"
            "print(*seen())\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["False", "False", "True", "True"], run.stdout


def _bench_body(ctx, out):
    from trident.bench import dist_backend

    args = dist_backend.parse_args(["--max-bytes", "1K", "--no-progress", "--out", out])
    dist_backend.sim_sizes(args)
    args.repeats = 3
    record = dist_backend.run(ctx, args)
    files = dist_backend.report(record, out) if ctx.rank == 0 else []
    return record, files


def test_dispatch_cost_benchmark_writes_its_record(tmp_path):
    from trident.bench import harness

    record, files = get_pool(2).run(_bench_body, str(tmp_path))[0]
    harness.validate(record)
    ways = {row["way"] for row in record["rows"]}
    assert {"torch.distributed (trident backend)", "trident.ccl", "dispatch alone (trident.ccl stubbed)"} <= ways
    assert all(row["dispatch_us"] > 0 for row in record["rows"] if row["way"].startswith("dispatch alone"))
    assert files and all(pathlib.Path(f).exists() for f in files)
