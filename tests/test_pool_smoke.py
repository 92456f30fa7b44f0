import pytest

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


REFUSED = ("--- rank 3 ---\nTraceback ...\ntrident.errors.ContextRefusedError: rank 3: CUDA refused a context on GPU 0 "
           "(busy or unavailable): the MPS daemon ...\n")
LATE = "--- rank {r} ---\nTraceback ...\ntrident.errors.RankTimeoutError: rank {r}: heap handle exchange timed out\n"


def test_a_start_refused_a_context_is_retried_and_other_failures_are_not(monkeypatch):
    from trident import testing

    assert testing.refused_only("start-up failed on 4 rank(s):\n" + "".join(LATE.format(r=r) for r in range(3))
                                + REFUSED)
    assert not testing.refused_only("start-up failed on 3 rank(s):\n" + "".join(LATE.format(r=r) for r in range(3)))
    assert not testing.refused_only("start-up failed on 2 rank(s):\n" + REFUSED
                                    + "--- rank 0 ---\nValueError: heap_size=-1 must be positive\n")

    attempts = []

    def start_once(self, timeout, failures):
        attempts.append(timeout)
        if len(attempts) <= failures:
            raise testing.RankFailure("start-up failed on 1 rank(s):\n" + REFUSED)

    monkeypatch.setattr(testing, "REFUSED_PAUSE_S", 0.0)
    pool = testing.RankPool(4)
    monkeypatch.setattr(testing.RankPool, "_start_once", lambda self, t: start_once(self, t, 2))
    with pytest.warns(RuntimeWarning, match="refused a rank a context") as caught:
        pool._start(5.0)  # refused twice, then started
    assert len(attempts) == 3
    assert len(caught) == 2
    assert all(f"attempt {n} of {testing.START_ATTEMPTS})" in str(w.message) for n, w in zip((2, 3), caught))
    attempts.clear()
    monkeypatch.setattr(testing.RankPool, "_start_once", lambda self, t: start_once(self, t, 99))
    try:
        with pytest.warns(RuntimeWarning, match="refused a rank a context"):
            pool._start(5.0)
    except testing.RankFailure as exc:
        assert "ContextRefusedError" in str(exc)
    else:
        raise AssertionError("a start refused every time was not reported")
    assert len(attempts) == testing.START_ATTEMPTS


def test_cuda_refusing_a_context_gets_a_clear_error(monkeypatch):
    from trident.backends.cuda import refused_context

    busy = RuntimeError("CUDA error: CUDA-capable device(s) is/are busy or unavailable")
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", "/tmp/trident-mps-x/pipe")
    error = refused_context(busy, 3, 0)
    assert isinstance(error, trident.ContextRefusedError) and isinstance(error, trident.BackendUnavailableError)
    assert "rank 3" in str(error) and "GPU 0" in str(error) and "/tmp/trident-mps-x/pipe" in str(error)
    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY")
    assert "exclusive compute mode" in str(refused_context(busy, 1, 0))
    assert refused_context(RuntimeError("CUDA error: out of memory"), 1, 0) is None
