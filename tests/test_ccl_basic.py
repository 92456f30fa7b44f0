"""Every collective once, at 2, 3 and 4 ranks, against torch references (the broad suite is test_ccl.py)."""

import pytest
import torch

import trident
from tests.conftest import get_pool
from trident.testing import refusals


def _collectives_body(ctx):
    w, r = ctx.world_size, ctx.rank
    got = {}
    for alg in ("one_shot", "two_shot"):
        x = ctx.full((3000,), float(r + 1))
        trident.ccl.all_reduce(ctx, x, algorithm=alg)
        got[f"sum {alg}"] = bool(torch.all(x == sum(range(1, w + 1))))
        y = torch.full((77,), float(r), dtype=torch.bfloat16, device=ctx.device)  # plain tensor: staged
        trident.ccl.all_reduce(ctx, y, op="max", algorithm=alg)
        got[f"max {alg}"] = bool(torch.all(y == w - 1))
    g = torch.empty(w * 50, device=ctx.device)
    trident.ccl.all_gather(ctx, g, torch.arange(50.0, device=ctx.device) + 100 * r)
    got["all_gather"] = torch.equal(g.cpu(), torch.cat([torch.arange(50.0) + 100 * p for p in range(w)]))
    rs = torch.empty(10, device=ctx.device)
    trident.ccl.reduce_scatter(ctx, rs, torch.arange(10.0 * w, device=ctx.device))
    got["reduce_scatter"] = torch.equal(rs.cpu(), (torch.arange(10.0 * w) * w)[r * 10:(r + 1) * 10])
    a = torch.arange(w * 3.0, device=ctx.device) + 1000 * r
    o = torch.empty_like(a)
    trident.ccl.all_to_all(ctx, o, a)
    got["all_to_all"] = torch.equal(o.cpu(), torch.cat([torch.arange(w * 3.0)[r * 3:(r + 1) * 3] + 1000 * p
                                                        for p in range(w)]))
    sends = [[(p + q) % 3 for q in range(w)] for p in range(w)]  # rows rank p sends to rank q
    buf = ctx.zeros(3 * w, 2, dtype=torch.int64)
    inp = buf[:sum(sends[r])]
    inp.copy_(torch.arange(inp.numel()).reshape(-1, 2) + 100 * r)
    out = torch.empty(sum(sends[p][r] for p in range(w)), 2, dtype=torch.int64, device=ctx.device)
    trident.ccl.all_to_all_v(ctx, out, inp, [sends[p][r] for p in range(w)], sends[r])
    want = torch.cat([(torch.arange(2 * sum(sends[p])).reshape(-1, 2) + 100 * p).split(sends[p])[r]
                      for p in range(w)])
    got["all_to_all_v"] = torch.equal(out.cpu(), want)
    b = torch.full((5,), float(r), device=ctx.device)
    trident.ccl.broadcast(ctx, b, src=w - 1)
    got["broadcast"] = bool(torch.all(b == w - 1))
    return got


@pytest.mark.parametrize("world", [2, 3, 4])
def test_every_collective_matches_torch(world):
    for got in get_pool(world).run(_collectives_body):
        assert all(got.values()), got


def _bad_input_body(ctx):
    plain = torch.zeros(2, device=ctx.device)
    calls = (lambda: trident.ccl.all_reduce(ctx, ctx.zeros(8), op="prod"),
             lambda: trident.ccl.all_reduce(ctx, ctx.zeros(8), algorithm="ring"),
             lambda: trident.ccl.all_gather(ctx, torch.empty(3, device=ctx.device), ctx.zeros(8)),
             lambda: trident.ccl.all_reduce(ctx, ctx.zeros(4, 4).t()),
             lambda: trident.ccl.all_to_all_v(ctx, plain, plain.clone(), [1, 1], [1, 1]))
    bad_dtypes = (torch.bool, torch.uint16, torch.uint32, torch.float8_e4m3fn)
    calls += tuple(lambda d=d: trident.ccl.all_reduce(ctx, ctx.zeros(8, dtype=d)) for d in bad_dtypes)
    calls += (lambda: trident.ccl.reduce_scatter(ctx, ctx.zeros(4, dtype=torch.bool),
                                                 ctx.zeros(4 * ctx.world_size, dtype=torch.bool)),)
    return refusals(dict(enumerate(calls)))


def test_bad_input_is_refused_with_a_clear_message(pool2):
    for rank, m in enumerate(pool2.run(_bad_input_body)):
        assert "op='prod' is not supported" in m[0]
        assert "algorithm='ring'" in m[1]
        assert "out has 3 elements, expected world_size x inp" in m[2]
        assert "must be contiguous" in m[3]
        assert "must lie on the heap" in m[4]
        for i, (what, dtype) in enumerate([("all_reduce", "torch.bool"), ("all_reduce", "torch.uint16"),
                                           ("all_reduce", "torch.uint32"), ("all_reduce", "torch.float8_e4m3fn"),
                                           ("reduce_scatter", "torch.bool")], start=5):
            assert m[i].startswith(f"rank {rank}: {what}: reductions do not support dtype {dtype}; expected"), m[i]
