"""trident.ops.all_gather_gemm and gemm_reduce_scatter: every pattern against torch at 2 and 4 ranks.

As for gemm_all_scatter: inputs seeded the same on every rank (so every rank builds the full
reference), C poisoned with NaN before each call, two calls on the same buffers with different
inputs (a stale flag or slot would leave the first result or NaNs), fp16, bf16 and fp32,
shapes ragged against the tiles (rows per rank not a multiple of BLOCK_M, so shards' tiles
are cut short), descriptor and pointer paths.
"""


import pytest
import torch

from tests.helpers import SMALL, TALL, assert_gemm_errors, assert_refused, relative_error
from trident.ops import MatmulConfig
from trident.testing import refusals

FUSED = ("bulk_synchronous", "fused_sequential", "workgroup_specialized")
# (dtype, rows per rank m, N, K, config); fp16/bf16 rows are 16-byte aligned (TMA where used).
CASES = [
    (torch.float16, 11, 24, 40, SMALL),
    (torch.bfloat16, 20, 16, 24, TALL),
    (torch.float32, 7, 13, 19, None),
]



def _agg_call(ctx, pattern, dtype, m, N, K, cfg, seed, symmetric):
    import trident

    gen = torch.Generator().manual_seed(seed)
    A = torch.randn(ctx.world_size * m, K, generator=gen).to(dtype)
    B = torch.randn(K, N, generator=gen).to(dtype) + ctx.rank  # each rank its own B
    mine = A[ctx.rank * m:(ctx.rank + 1) * m].to(ctx.device)
    A_local = ctx.as_symmetric(mine) if symmetric else mine
    C = torch.full((ctx.world_size * m, N), float("nan"), dtype=dtype, device=ctx.device)
    trident.ops.all_gather_gemm(ctx, A_local, B.to(ctx.device), C, pattern=pattern, config=cfg)
    return relative_error(C, A.double() @ B.double())


def _grs_call(ctx, pattern, dtype, m, N, K, cfg, seed):
    import trident

    gen = torch.Generator().manual_seed(seed)
    w = ctx.world_size
    A = torch.randn(w * m, w * K, generator=gen).to(dtype)  # the whole A and B; rank r has K-shard r
    B = torch.randn(w * K, N, generator=gen).to(dtype)
    ks = slice(ctx.rank * K, (ctx.rank + 1) * K)
    C = torch.full((m, N), float("nan"), dtype=dtype, device=ctx.device)
    trident.ops.gemm_reduce_scatter(ctx, A[:, ks].contiguous().to(ctx.device), B[ks].contiguous().to(ctx.device),
                                    C, pattern=pattern, config=cfg)
    want = (A.double() @ B.double())[ctx.rank * m:(ctx.rank + 1) * m]
    return relative_error(C, want)


def _body(ctx, op, patterns, cases):
    if "baseline" in patterns and ctx.device.type == "cuda" and torch.cuda.device_count() < ctx.world_size:
        return None  # NCCL cannot place two ranks on one GPU: the baseline needs a GPU per rank
    errors = []
    for pattern in patterns:
        for i, (dtype, m, N, K, cfg) in enumerate(cases):
            for call in range(2):  # the same flags, slots and workspace; new inputs each time
                if op == "all_gather_gemm":  # a heap A_local the first time, a plain one (staged) the second
                    err = _agg_call(ctx, pattern, dtype, m, N, K, cfg, 100 * i + call, symmetric=call == 0)
                else:
                    err = _grs_call(ctx, pattern, dtype, m, N, K, cfg, 100 * i + call)
                errors.append((pattern, dtype, call, err))
    return errors


@pytest.mark.parametrize("op", ["all_gather_gemm", "gemm_reduce_scatter"])
@pytest.mark.parametrize("pattern", FUSED + ("baseline",))
def test_pattern_matches_torch(pool, op, pattern):
    assert_gemm_errors(pool.run(_body, op, (pattern,), CASES), 2 * len(CASES), op)


@pytest.mark.parametrize("op", ["all_gather_gemm", "gemm_reduce_scatter"])
def test_one_rank_every_fused_pattern_is_the_gemm(op):
    """Alone, a rank's own partial is all of C (gemm_reduce_scatter adds no peer's slot): A @ B."""
    from tests.conftest import get_pool

    assert_gemm_errors(get_pool(1).run(_body, op, FUSED, CASES[:2]), 2 * 2 * len(FUSED), op)


@pytest.mark.parametrize("world_size", [1, 2])
def test_all_gather_gemm_deals_out_its_first_rounds_of_tiles_and_claims_the_rest(world_size):
    """workgroup_specialized on several rounds of tiles (the simulator's 4 programs, 2 of them gathering
    at 2 ranks): 9 tiles per rank, 4 dealt out statically alone, 16 of 18 at 2 ranks, the rest claimed;
    every tile is computed (C starts as NaN)."""
    from tests.conftest import get_pool

    case = [(torch.float16, 40, 48, 16, SMALL)]  # 3 row blocks per rank x 3 column blocks
    errors = get_pool(world_size).run(_body, "all_gather_gemm", ("workgroup_specialized",), case)
    assert_gemm_errors(errors, 2, "all_gather_gemm")


def test_every_fused_pattern_declares_the_bytes_it_moves_beyond_its_gemm():
    """The machinery budget the benchmarks measure against (docs/tensor-parallel-ops.md): every
    pattern of every op declares its bytes (torch's baseline none), the fused ones nothing at one
    rank, and the figures are the table's."""
    from trident.ops import OPS

    M, N, K, e = 4096, 2048, 1024, 2
    for spec in OPS.values():
        for world in (1, 2, 8):
            for pattern in spec.patterns:
                extra = spec.extra_bytes(pattern, (M, N, K), world, e)
                assert (extra is None) == (pattern == "baseline"), (spec.name, pattern)
                assert extra is None or extra >= 0
        assert spec.extra_bytes("fused_sequential", (M, N, K), 1, e) == 0, spec.name
    budget = {name: OPS[name].extra_bytes for name in OPS}
    assert budget["all_gather_gemm"]("bulk_synchronous", (M, N, K), 1, e) == 2 * M * K * e  # A gathered
    assert budget["all_gather_gemm"]("workgroup_specialized", (M, N, K), 8, e) == 2 * 7 * (M // 8) * K * e
    assert budget["gemm_reduce_scatter"]("bulk_synchronous", (M, N, K), 1, e) == 2 * M * N * e
    assert budget["gemm_reduce_scatter"]("workgroup_specialized", (M, N, K), 4, e) == 5 * (M // 4) * N * e
    assert budget["gemm_all_reduce"]("fused_sequential", (M, N, K), 2, e) == 3 * M * N * e
    assert budget["gemm_all_scatter"]("fused_sequential", (M, N, K), 8, e) == 7 * M * (N // 8) * e
    assert budget["gemm_all_scatter"]("producer_consumer", (M, N, K), 1, e) == 0  # nothing read back alone


@pytest.mark.parametrize("op", ["all_gather_gemm", "gemm_reduce_scatter"])
def test_patterns_in_turn_and_with_gemm_all_scatter(pool2, op):
    """Every pattern (and auto) one after another, then gemm_all_scatter: one epoch count for all."""
    case = [(torch.float16, 8, 16, 32, SMALL)]
    assert_gemm_errors(pool2.run(_body, op, FUSED + FUSED[::-1] + ("auto",), case), 2 * (2 * len(FUSED) + 1), op)


def _staged_chunks_body(ctx, pattern):
    from trident.ops.fused.sync import STAGE_CHUNK

    m, K = 33, 2 * STAGE_CHUNK // 33 + 7  # a plain A_local of two whole staging chunks and part of a third
    assert 2 * STAGE_CHUNK < m * K < 3 * STAGE_CHUNK
    return [(pattern, torch.float16, seed,
             _agg_call(ctx, pattern, torch.float16, m, 8, K, SMALL, seed, symmetric=False)) for seed in range(2)]


@pytest.mark.parametrize("pattern", ["fused_sequential", "workgroup_specialized"])
def test_all_gather_gemm_stages_a_plain_a_local_of_several_chunks_in_its_kernel(pool2, pattern):
    """The kernel copies a plain A_local onto the heap in three claimed chunks, the last one partial: a
    chunk left uncopied leaves the last call's rows in the stage (two calls, new data each). An
    announcement before the last chunk is not caught here: the simulator's waits poll too slowly."""
    assert_gemm_errors(pool2.run(_staged_chunks_body, pattern), 2, "all_gather_gemm")


def _staged_ahead_body(ctx, pattern, limit):
    import trident.ops.tensor_parallel.all_gather_gemm as agg

    agg.STAGE_IN_KERNEL_MAX_BYTES, default = limit, agg.STAGE_IN_KERNEL_MAX_BYTES
    ctx.call_cache.clear()  # a call recorded under the other limit would be replayed
    try:
        errors = [(pattern, torch.float16, seed, _agg_call(ctx, pattern, torch.float16, 20, 16, 24, SMALL, seed,
                                                           symmetric=False)) for seed in range(2)]
    finally:
        agg.STAGE_IN_KERNEL_MAX_BYTES = default
    (entry,) = ctx.call_cache.entries("all_gather_gemm")
    copies = sum(type(step).__name__ == "_Copy" for step in entry.steps)
    ctx.call_cache.clear()
    return errors, copies


@pytest.mark.parametrize("pattern", ["fused_sequential", "workgroup_specialized"])
def test_all_gather_gemm_stages_a_large_plain_a_local_with_a_copy_ahead_of_its_kernel(pool2, pattern):
    """Past STAGE_IN_KERNEL_MAX_BYTES a plain A_local is copied onto the heap ahead of the kernel (one
    recorded copy); within it the kernel stages it (no copy)."""
    for limit, want in ((0, 1), (1 << 20, 0)):
        results = pool2.run(_staged_ahead_body, pattern, limit)
        assert_gemm_errors([errors for errors, _ in results], 2, "all_gather_gemm", limit)
        assert [copies for _, copies in results] == [want] * 2, limit


def _mixed_body(ctx):
    import trident

    errs = []
    for i in range(3):
        errs.append(_grs_call(ctx, "workgroup_specialized", torch.float16, 8, 16, 16, SMALL, seed=i))
        errs.append(_agg_call(ctx, "workgroup_specialized", torch.float16, 8, 16, 16, SMALL, i, True))
        A = torch.randn(16, 16, dtype=torch.float16, device=ctx.device)
        B = torch.randn(16, 8, dtype=torch.float16, device=ctx.device)
        C = ctx.empty(16, 8 * ctx.world_size, dtype=torch.float16)
        trident.ops.gemm_all_scatter(ctx, A, B, C, pattern="workgroup_specialized", config=SMALL)
        ctx.barrier()
        mine = C[:, ctx.rank * 8:(ctx.rank + 1) * 8]
        errs.append(relative_error(mine, A.cpu().double() @ B.cpu().double()))
    return errs


def test_the_three_ops_interleaved_share_flags_and_epochs(pool2):
    for errs in pool2.run(_mixed_body):
        assert len(errs) == 9
        assert max(errs) < 5e-3, errs


def _trace_body(ctx, op, pattern):
    import trident
    import trident.trace

    trace = trident.trace.Trace(ctx, capacity=512)
    m, N, K = 16, 32, 16
    if op == "all_gather_gemm":
        A_local = ctx.randn(m, K, dtype=torch.float16)
        C = torch.empty(ctx.world_size * m, N, dtype=torch.float16, device=ctx.device)
        trident.ops.all_gather_gemm(ctx, A_local, torch.randn(K, N, dtype=torch.float16, device=ctx.device), C,
                                    pattern=pattern, config=SMALL, trace=trace)
    else:
        C = torch.empty(m, N, dtype=torch.float16, device=ctx.device)
        trident.ops.gemm_reduce_scatter(ctx, torch.randn(ctx.world_size * m, K, dtype=torch.float16,
                                                         device=ctx.device),
                                        torch.randn(K, N, dtype=torch.float16, device=ctx.device), C,
                                        pattern=pattern, config=SMALL, trace=trace)
    ctx.barrier()
    kinds = [e.kind_name for e in trace.events() if e.rank == ctx.rank]
    return {k: kinds.count(k) for k in ("compute", "comm", "wait")}


@pytest.mark.parametrize("op,pattern,want", [
    # 16 x 32 per shard in 16 x 16 tiles: 2 tiles a shard, 2 shards at 2 ranks.
    ("all_gather_gemm", "bulk_synchronous", {"compute": 4, "comm": 1, "wait": 0}),  # the all-gather: one span
    ("all_gather_gemm", "fused_sequential", {"compute": 4, "comm": 0, "wait": 0}),
    # The peer's row block gathered, its 2 tiles waited for; my own rows read in place.
    ("all_gather_gemm", "workgroup_specialized", {"compute": 4, "comm": 1, "wait": 2}),
    ("gemm_reduce_scatter", "bulk_synchronous", {"compute": 4, "comm": 1, "wait": 0}),  # the whole 32 x 32
    ("gemm_reduce_scatter", "fused_sequential", {"compute": 4, "comm": 4, "wait": 0}),
    ("gemm_reduce_scatter", "workgroup_specialized", {"compute": 6, "comm": 4, "wait": 2}),  # + 2 reduced tiles
])
def test_trace_records_every_tile(pool2, op, pattern, want):
    for counts in pool2.run(_trace_body, op, pattern):
        assert counts == want


def _bad_input_body(ctx):
    import trident

    agg, grs = trident.ops.all_gather_gemm, trident.ops.gemm_reduce_scatter
    w, dev = ctx.world_size, ctx.device
    A, B = ctx.zeros(4, 8), ctx.zeros(8, 3)
    calls = {
        "agg pattern": lambda: agg(ctx, A, B, torch.zeros(4 * w, 3, device=dev), pattern="producer_consumer"),
        "agg k": lambda: agg(ctx, A, ctx.zeros(5, 3), torch.zeros(4 * w, 3, device=dev)),
        "agg c": lambda: agg(ctx, A, B, torch.zeros(4, 3, device=dev)),
        "agg dtype": lambda: agg(ctx, A, B.half(), torch.zeros(4 * w, 3, device=dev)),
        "agg comm": lambda: agg(ctx, A, B, torch.zeros(4 * w, 3, device=dev), comm_programs=0),
        "grs rows": lambda: grs(ctx, ctx.zeros(4 * w + 1, 8), B, torch.zeros(4, 3, device=dev)),
        "grs c": lambda: grs(ctx, ctx.zeros(4 * w, 8), B, torch.zeros(4 * w, 3, device=dev)),
        "grs contiguous": lambda: grs(ctx, ctx.zeros(8, 4 * w).t(), B, torch.zeros(4, 3, device=dev)),
        "grs config": lambda: grs(ctx, ctx.zeros(4 * w, 8), B, torch.zeros(4, 3, device=dev),
                                  config=MatmulConfig(BLOCK_K=8)),
        "grs int": lambda: grs(ctx, ctx.zeros(4 * w, 8).int(), B.int(), torch.zeros(4, 3, device=dev).int()),
    }
    return refusals(calls)


def test_bad_input_is_refused_before_anything_runs(pool2):
    expected = {"agg pattern": "pattern='producer_consumer' is not one of", "agg k": "K mismatch",
                "agg c": "expected (world_size * A_local rows, N)", "agg dtype": "must share one dtype",
                "agg comm": "comm_programs=0 must be a positive int", "grs rows": "M must be divisible by world_size",
                "grs c": "expected (M / world_size, N)", "grs contiguous": "must be contiguous",
                "grs config": "BLOCK_K=8 must be a power of two", "grs int": "dtype torch.int32"}
    for rank, m in enumerate(pool2.run(_bad_input_body)):
        assert_refused(m, expected, prefix=f"rank {rank}:")


def _zero_body(ctx):
    import trident

    out = {}
    C = torch.full((2 * ctx.world_size, 3), 7.0, device=ctx.device)
    trident.ops.all_gather_gemm(ctx, ctx.zeros(2, 0), torch.zeros(0, 3, device=ctx.device), C,
                                pattern="fused_sequential")
    out["agg k=0"] = C.abs().max().item()
    C = torch.full((2, 3), 7.0, device=ctx.device)
    trident.ops.gemm_reduce_scatter(ctx, torch.zeros(2 * ctx.world_size, 0, device=ctx.device),
                                    torch.zeros(0, 3, device=ctx.device), C, pattern="workgroup_specialized")
    out["grs k=0"] = C.abs().max().item()
    C = torch.empty(0, 3, device=ctx.device)
    trident.ops.gemm_reduce_scatter(ctx, torch.zeros(0, 4, device=ctx.device), torch.zeros(4, 3, device=ctx.device),
                                    C, pattern="fused_sequential")
    out["grs m=0"] = tuple(C.shape)
    return out


def test_empty_sizes(pool2):
    for out in pool2.run(_zero_body):
        assert out == {"agg k=0": 0.0, "grs k=0": 0.0, "grs m=0": (0, 3)}
