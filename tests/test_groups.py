"""Process groups: ``ctx.new_group(ranks)`` and ``ctx.groups_from_mesh(mesh, dim)``.

Pinned here (4 ranks): two groups of two in both pairings, a strided group in a scrambled order
(group rank i is ``ranks[i]``), a group of one, a rank in two groups using both in turn, the device
API through ``g.heap_bases``, groups from a DeviceMesh, the world's collectives still right after
groups ran, and refusals: ranks that differ between callers, a rank out of range, a group used
a group too small for a call (and the group still works).
"""

import pytest
import torch
import triton
import triton.language as tl

import trident
from trident import ccl

#: Each group's heap region in these tests (the pools' heaps are 64 MiB; the default is 16 MiB).
WS = 1 << 20


def _reduce_in(ctx, g, value):
    x = torch.full((300,), float(value), device=ctx.device)
    ccl.all_reduce(ctx, x, group=g)
    return float(x[0])


def _pairings(ctx):
    r = ctx.rank
    results = {}
    for name, pairs in (("neighbours", [[0, 1], [2, 3]]), ("strided", [[0, 2], [1, 3]])):
        groups = [ctx.new_group(p, workspace_bytes=WS) for p in pairs]        # collective: every rank makes both
        mine = [g for g in groups if g is not None]
        assert len(mine) == 1 and mine[0].world_size == 2
        results[name] = (_reduce_in(ctx, mine[0], 10 ** r), mine[0].ranks, mine[0].rank)
    return results


def test_two_groups_of_two_in_both_pairings(pool4):
    for r, results in enumerate(pool4.run(_pairings)):
        for name, pairs in (("neighbours", [[0, 1], [2, 3]]), ("strided", [[0, 2], [1, 3]])):
            total, ranks, rank = results[name]
            pair = next(p for p in pairs if r in p)
            assert total == sum(10 ** p for p in pair) and list(ranks) == pair and rank == pair.index(r)


def _scrambled(ctx):
    g = ctx.new_group([3, 0, 2], workspace_bytes=WS)  # group ranks: world 3 -> 0, world 0 -> 1, world 2 -> 2
    if g is None:
        return None
    out = torch.empty(3 * 5, device=ctx.device)
    ccl.all_gather(ctx, out, torch.full((5,), float(ctx.rank), device=ctx.device), group=g)
    x = torch.full((7,), float(ctx.rank), device=ctx.device)
    ccl.broadcast(ctx, x, src=0, group=g)  # group rank 0 is world rank 3
    return g.rank, out.view(3, 5)[:, 0].tolist(), float(x[0])


def test_a_strided_group_in_any_order_follows_its_ranks_order(pool4):
    results = pool4.run(_scrambled)
    assert results[1] is None
    for world, group_rank in ((3, 0), (0, 1), (2, 2)):
        rank, gathered, broadcast = results[world]
        assert rank == group_rank and gathered == [3.0, 0.0, 2.0] and broadcast == 3.0


def _alone_and_twice(ctx):
    alone = ctx.new_group([ctx.world_size - 1], workspace_bytes=WS)
    big = ctx.new_group([0, 2, 3], workspace_bytes=WS)
    small = ctx.new_group([0, 1], workspace_bytes=WS)
    got = {}
    if alone is not None:
        got["alone"] = _reduce_in(ctx, alone, 5)
    for step in range(2):  # rank 0 uses both of its groups in turn
        if big is not None:
            got[f"big{step}"] = _reduce_in(ctx, big, ctx.rank + step)
        if small is not None:
            got[f"small{step}"] = _reduce_in(ctx, small, ctx.rank + 10 * step)
    world = torch.full((64,), float(ctx.rank), device=ctx.device)
    ccl.all_reduce(ctx, world)  # the world's collectives are untouched by the groups'
    got["world"] = float(world[0])
    return got


def test_a_group_of_one_and_a_rank_in_two_groups(pool4):
    results = pool4.run(_alone_and_twice)
    assert results[3]["alone"] == 5 and "alone" not in results[0]
    for r in (0, 2, 3):
        assert results[r]["big0"] == 0 + 2 + 3 and results[r]["big1"] == 5 + 3
    for r in (0, 1):
        assert results[r]["small0"] == 1 and results[r]["small1"] == 21
    assert all(res["world"] == 6 for res in results)


@triton.jit
def _read_next_member(x_ptr, out_ptr, n, rank, world_size, heap_bases, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    peer = (rank + 1) % world_size
    tl.store(out_ptr + offs, trident.load(x_ptr + offs, rank, peer, heap_bases, mask=offs < n), mask=offs < n)


def _device_api(ctx):
    g = ctx.new_group([2, 0], workspace_bytes=WS)
    x = ctx.full((16,), float(ctx.rank))
    ctx.barrier()
    got = None
    if g is not None:
        out = torch.empty(16, device=ctx.device)
        _read_next_member[(1,)](x, out, 16, g.rank, g.world_size, g.heap_bases, BLOCK=16)
        got = float(out[0])
    ctx.barrier()
    return got


def test_the_device_api_through_a_groups_heap_bases(pool4):
    results = pool4.run(_device_api)
    assert results[2] == 0.0 and results[0] == 2.0 and results[1] is None and results[3] is None


def _mesh(ctx):
    from torch.distributed.device_mesh import DeviceMesh

    mesh = DeviceMesh(ctx.device.type, torch.arange(4).view(2, 2), mesh_dim_names=("dp", "tp"),
                      _init_backend=False)
    tp, dp = ctx.groups_from_mesh(mesh, "tp", workspace_bytes=WS), ctx.groups_from_mesh(mesh, 0, workspace_bytes=WS)
    return list(tp.ranks), list(dp.ranks), _reduce_in(ctx, tp, ctx.rank), _reduce_in(ctx, dp, ctx.rank)


def test_groups_from_a_device_mesh(pool4):
    for r, (tp, dp, tp_sum, dp_sum) in enumerate(pool4.run(_mesh)):
        assert tp == [2 * (r // 2), 2 * (r // 2) + 1] and dp == [r % 2, r % 2 + 2]
        assert tp_sum == sum(tp) and dp_sum == sum(dp)


def _refusals(ctx):
    errors = {}
    for name, call in (("differ", lambda: ctx.new_group([0, 1] if ctx.rank == 0 else [0, 2], workspace_bytes=WS)),
                       ("range", lambda: ctx.new_group([0, ctx.world_size], workspace_bytes=WS))):
        try:
            call()
        except ValueError as exc:
            errors[name] = str(exc)
    g = ctx.new_group([0, 1], workspace_bytes=48 << 10)  # the sync words fit, 64 KiB buffers do not
    if g is not None:
        try:
            ccl.all_reduce(ctx, torch.ones(1 << 14, device=ctx.device), group=g)  # 64 KiB: more than the region
        except trident.HeapExhaustedError as exc:
            errors["small"] = str(exc)
        ccl.all_reduce(ctx, torch.ones(64, device=ctx.device), group=g)  # what fits still works
    return errors


def test_bad_groups_are_refused_with_what_to_do(pool4):
    results = pool4.run(_refusals)
    for errors in results:
        assert "every rank must pass the same ranks" in errors["differ"]
        assert "must be distinct ranks of the world" in errors["range"]
    for r in (0, 1):
        assert "workspace_bytes" in results[r]["small"]


def _foreign_group(ctx):
    g = ctx.new_group([0, 1], workspace_bytes=WS)
    if g is None:
        return ""
    with pytest.raises(ValueError, match="not a group of this context"):
        ccl.all_reduce(ctx, torch.ones(4, device=ctx.device), group=object())
    return "ok"


def test_something_that_is_not_a_group_is_refused(pool2):
    assert pool2.run(_foreign_group) == ["ok", "ok"]


def _custom_ops_in_a_group(ctx):
    g = ctx.new_group([1, 3], workspace_bytes=WS)
    if g is None:
        return None
    x = torch.full((8,), float(ctx.rank), device=ctx.device)
    summed = torch.ops.trident.all_reduce(x, "sum", g.group_name)
    gathered = torch.ops.trident.all_gather(x, g.group_name)
    dev = ctx.device
    fused = torch.ops.trident.gemm_all_reduce(torch.full((2, 4), float(ctx.rank), device=dev),
                                              torch.ones(4, 3, device=dev), g.group_name)
    return float(summed[0]), gathered[::8].tolist(), float(fused[0, 0])


def test_custom_ops_take_a_groups_name(pool4):
    results = pool4.run(_custom_ops_in_a_group)
    assert results[0] is None and results[2] is None
    for r in (1, 3):
        total, gathered, fused = results[r]
        assert total == 4 and gathered == [1.0, 3.0] and fused == 4 * (1 + 3)


def _mat(seed, *shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _relative(got, want) -> float:
    """Largest error relative to the largest reference element (fp32 GEMMs run as TF32 on GPUs)."""
    return float((got.cpu() - want).abs().max() / want.abs().max())


def _fused_ops_in_groups(ctx):
    """Every fused op in both groups of [[0, 2], [3, 1]] at once, against torch (by group rank)."""
    from trident import ops

    groups = [ctx.new_group(p, workspace_bytes=WS) for p in ([0, 2], [3, 1])]
    g = next(x for x in groups if x is not None)
    w, gr, dev = g.world_size, g.rank, ctx.device
    A = [_mat(10 + p, 8, 16) for p in range(w)]
    B = [_mat(20 + p, 16, 6) for p in range(w)]
    total = sum(a @ b for a, b in zip(A, B, strict=True))
    errors = {}
    for pattern in ("bulk_synchronous", "fused_sequential", "workgroup_specialized"):
        C = torch.empty(8, 6, device=dev)
        ops.gemm_all_reduce(ctx, A[gr].to(dev), B[gr].to(dev), C, pattern=pattern, group=g)
        errors[f"gemm_all_reduce {pattern}"] = _relative(C, total)
        C = torch.empty(8 // w, 6, device=dev)
        ops.gemm_reduce_scatter(ctx, A[gr].to(dev), B[gr].to(dev), C, pattern=pattern, group=g)
        errors[f"gemm_reduce_scatter {pattern}"] = _relative(C, total[gr * 4:(gr + 1) * 4])
        C = torch.empty(w * 8, 6, device=dev)
        ops.all_gather_gemm(ctx, A[gr].to(dev), B[0].to(dev), C, pattern=pattern, group=g)
        errors[f"all_gather_gemm {pattern}"] = _relative(C, torch.cat(A) @ B[0])
        C = g.empty(8 * 6 * w, dtype=torch.float32).view(8, 6 * w)  # symmetric within the group
        ops.gemm_all_scatter(ctx, A[0].to(dev), B[gr].to(dev), C, pattern=pattern, group=g)
        errors[f"gemm_all_scatter {pattern}"] = _relative(C, A[0] @ torch.cat(B, dim=1))
        g.free(C)
    x = [_mat(30 + p, 5, 16) for p in range(w)]
    out, h = ops.all_reduce_rmsnorm(ctx, x[gr].to(dev), torch.ones(16, device=dev), group=g)
    want = sum(x)
    errors["all_reduce_rmsnorm"] = _relative(h, want)
    ctx.barrier()
    return errors


def test_every_fused_op_runs_in_groups_side_by_side(pool4):
    for errors in pool4.run(_fused_ops_in_groups):
        bad = {name: err for name, err in errors.items() if not err < 5e-3}  # TF32 on GPUs: ~1e-3
        assert not bad, bad
