import trident


def _neighbour(ctx, n):
    x = ctx.full((n,), float(ctx.rank))
    ctx.barrier()
    return ctx.peer_view(x, (ctx.rank + 1) % ctx.world_size).tolist()


def test_pool_runs_on_every_rank(pool):
    results = pool.run(_neighbour, 3)
    world = len(results)
    assert results == [[float((r + 1) % world)] * 3 for r in range(world)]


def _fail_on_rank_1(ctx):
    if ctx.rank == 1:
        raise ValueError("boom on purpose")
    return ctx.rank


def test_pool_reports_the_failing_rank_and_recovers(pool2):
    try:
        pool2.run(_fail_on_rank_1)
    except trident.testing.RankFailure as exc:
        assert "rank 1" in str(exc) and "boom on purpose" in str(exc)
    else:
        raise AssertionError("the failure was not reported")
    assert pool2.run(_neighbour, 1) == [[1.0], [0.0]]
