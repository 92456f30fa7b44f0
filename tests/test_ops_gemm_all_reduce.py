"""trident.ops.gemm_all_reduce: every pattern against torch at 1, 2, 3 and 4 ranks.

As for the other fused ops: inputs seeded the same on every rank (so every rank builds the full
reference, the sum over ranks of A_r @ B_r), C poisoned with NaN before each call, two calls on
the same buffers with different inputs (a stale flag or slot would leave the first result or
NaNs), A on the heap the first time and a plain tensor the second, fp16, bf16 and fp32, shapes
ragged against the tiles (M = 1, N not a multiple of BLOCK_N), descriptor and pointer paths.
"""


import pytest
import torch

from tests.conftest import get_pool
from tests.helpers import SMALL, TALL, assert_gemm_errors, assert_refused, relative_error
from trident.ops import MatmulConfig
from trident.testing import refusals

FUSED = ("bulk_synchronous", "fused_sequential", "workgroup_specialized")
# (dtype, M, N, K per rank, config); fp16/bf16 rows are 16-byte aligned (TMA where used).
CASES = [
    (torch.float16, 1, 24, 40, SMALL),  # decode: one row
    (torch.bfloat16, 20, 40, 24, TALL),
    (torch.float32, 7, 13, 19, None),
]



def _gar_call(ctx, pattern, dtype, M, N, K, cfg, seed, symmetric):
    from trident.ops.tensor_parallel.gemm_all_reduce import gemm_all_reduce

    gen = torch.Generator().manual_seed(seed)
    w = ctx.world_size
    A = torch.randn(M, w * K, generator=gen).to(dtype)  # the whole A and B; rank r has K-shard r
    B = torch.randn(w * K, N, generator=gen).to(dtype)
    ks = slice(ctx.rank * K, (ctx.rank + 1) * K)
    mine = A[:, ks].contiguous().to(ctx.device)
    A_local = ctx.as_symmetric(mine) if symmetric else mine
    C = torch.full((M, N), float("nan"), dtype=dtype, device=ctx.device)
    gemm_all_reduce(ctx, A_local, B[ks].contiguous().to(ctx.device), C, pattern=pattern, config=cfg)
    return relative_error(C, A.double() @ B.double())


def _body(ctx, patterns, cases):
    if "baseline" in patterns and ctx.platform.ranks_share_gpus:
        return None  # NCCL cannot place two ranks on one GPU: the baseline needs a GPU per rank
    errors = []
    for pattern in patterns:
        for i, (dtype, M, N, K, cfg) in enumerate(cases):
            for call in range(2):  # the same flags, slots and workspace; new inputs each time
                err = _gar_call(ctx, pattern, dtype, M, N, K, cfg, 100 * i + call, symmetric=call == 0)
                errors.append((pattern, dtype, call, err))
    return errors


@pytest.fixture(params=[2, 3, 4], ids=["2ranks", "3ranks", "4ranks"])
def pool234(request):
    return get_pool(request.param)


@pytest.mark.parametrize("pattern", FUSED + ("baseline",))
def test_pattern_matches_torch(pool234, pattern):
    assert_gemm_errors(pool234.run(_body, (pattern,), CASES), 2 * len(CASES))


def test_one_rank_every_pattern_is_the_gemm():
    """At one rank there is nobody to send to: every pattern must still produce A @ B."""
    assert_gemm_errors(get_pool(1).run(_body, FUSED, CASES[:2]), 2 * 2 * len(FUSED))


def _in_turn_body(ctx):
    import trident

    errors = _body(ctx, FUSED + FUSED[::-1] + ("auto",), [(torch.float16, 8, 16, 32, SMALL)])
    # gemm_reduce_scatter in between: one sync block and epoch count for every fused op
    w = ctx.world_size
    A = torch.randn(4 * w, 16, dtype=torch.float16, device=ctx.device)
    B = torch.randn(16, 16, dtype=torch.float16, device=ctx.device)
    C = torch.empty(4, 16, dtype=torch.float16, device=ctx.device)
    trident.ops.gemm_reduce_scatter(ctx, A, B, C, pattern="workgroup_specialized", config=SMALL)
    errors += _body(ctx, ("workgroup_specialized", "fused_sequential"), [(torch.float16, 3, 16, 16, SMALL)])
    return errors


def test_patterns_in_turn_and_with_gemm_reduce_scatter(pool2):
    """Every pattern (and auto) one after another, with another fused op in between."""
    assert_gemm_errors(pool2.run(_in_turn_body), 2 * (2 * len(FUSED) + 1) + 2 * 2)


def test_auto_runs_baseline_where_nccl_runs_else_the_shared_gpu_pattern():
    from trident.ops.tensor_parallel.gemm_all_reduce import AUTO_TABLE, GEMM_ALL_REDUCE, PATTERNS
    from trident.platform import Platform

    assert PATTERNS == ("bulk_synchronous", "fused_sequential", "workgroup_specialized", "baseline", "auto")
    assert AUTO_TABLE == {}
    gpu_per_rank = Platform("cuda", torch.device("cuda", 0), 132, "NVIDIA H200", 8, 8)
    shared = Platform("cuda", torch.device("cuda", 0), 132, "NVIDIA H200", 1, 4)
    assert GEMM_ALL_REDUCE.choose(gpu_per_rank, 256 * 8192 * 1024) == "baseline"
    assert GEMM_ALL_REDUCE.choose(shared, 1) == "fused_sequential"
    assert GEMM_ALL_REDUCE.comm_programs(Platform("sim", torch.device("cpu"), 4, "cpu", 0, 8)) == 2


def _bad_input_body(ctx):
    from trident.ops.tensor_parallel.gemm_all_reduce import gemm_all_reduce as gar

    dev = ctx.device
    A, B = ctx.zeros(4, 8), ctx.zeros(8, 3)
    calls = {
        "pattern": lambda: gar(ctx, A, B, torch.zeros(4, 3, device=dev), pattern="producer_consumer"),
        "k": lambda: gar(ctx, A, ctx.zeros(5, 3), torch.zeros(4, 3, device=dev)),
        "c": lambda: gar(ctx, A, B, torch.zeros(4 * ctx.world_size, 3, device=dev)),
        "dtype": lambda: gar(ctx, A, B.half(), torch.zeros(4, 3, device=dev)),
        "comm": lambda: gar(ctx, A, B, torch.zeros(4, 3, device=dev), comm_programs=0),
        "contiguous": lambda: gar(ctx, ctx.zeros(8, 4).t(), B, torch.zeros(4, 3, device=dev)),
        "config": lambda: gar(ctx, A, B, torch.zeros(4, 3, device=dev), config=MatmulConfig(BLOCK_K=8)),
        "int": lambda: gar(ctx, A.int(), B.int(), torch.zeros(4, 3, device=dev).int()),
    }
    return refusals(calls)


def test_bad_input_is_refused_before_anything_runs(pool2):
    expected = {"pattern": "pattern='producer_consumer' is not one of", "k": "K mismatch",
                "c": "expected (M, N) = (4, 3)", "dtype": "must share one dtype",
                "comm": "comm_programs=0 must be a positive int", "contiguous": "must be contiguous",
                "config": "BLOCK_K=8 must be a power of two", "int": "dtype torch.int32"}
    for rank, m in enumerate(pool2.run(_bad_input_body)):
        assert_refused(m, expected, prefix=f"rank {rank}: gemm_all_reduce")


def _zero_body(ctx):
    from trident.ops.tensor_parallel.gemm_all_reduce import gemm_all_reduce

    out = {}
    for pattern in FUSED:
        C = torch.full((2, 3), 7.0, device=ctx.device)
        gemm_all_reduce(ctx, torch.zeros(2, 0, device=ctx.device), torch.zeros(0, 3, device=ctx.device), C,
                        pattern=pattern)
        out[f"{pattern} k=0"] = C.abs().max().item()
    C = torch.empty(0, 3, device=ctx.device)
    gemm_all_reduce(ctx, torch.zeros(0, 4, device=ctx.device), torch.zeros(4, 3, device=ctx.device), C,
                    pattern="fused_sequential")
    out["m=0"] = tuple(C.shape)
    return out


def test_empty_sizes(pool2):
    for out in pool2.run(_zero_body):
        assert out == {**{f"{p} k=0": 0.0 for p in FUSED}, "m=0": (0, 3)}


def test_many_tiles_per_program(pool4):
    """15 tiles: each of the simulator's 2 reducer programs and each GEMM program takes several."""
    case = [(torch.float16, 48, 80, 16, SMALL)]
    assert_gemm_errors(pool4.run(_body, ("fused_sequential", "workgroup_specialized"), case), 2 * 2)


def _trace_body(ctx, pattern):
    import trident.trace
    from trident.ops.tensor_parallel.gemm_all_reduce import gemm_all_reduce

    trace = trident.trace.Trace(ctx, capacity=512)
    M, N, K = 16, 32, 16
    C = torch.empty(M, N, dtype=torch.float16, device=ctx.device)
    gemm_all_reduce(ctx, torch.randn(M, K, dtype=torch.float16, device=ctx.device),
                    torch.randn(K, N, dtype=torch.float16, device=ctx.device), C, pattern=pattern, config=SMALL,
                    trace=trace)
    ctx.barrier()
    kinds = [e.kind_name for e in trace.events() if e.rank == ctx.rank]
    return {k: kinds.count(k) for k in ("compute", "comm", "wait")}


@pytest.mark.parametrize("pattern,want", [
    # 16 x 32 in 16 x 16 tiles: 2 tiles, each pushed to every rank (one comm event per tile).
    ("bulk_synchronous", {"compute": 2, "comm": 1, "wait": 0}),  # the all-reduce: one span
    ("fused_sequential", {"compute": 2, "comm": 2, "wait": 0}),
    ("workgroup_specialized", {"compute": 4, "comm": 2, "wait": 2}),  # + 2 reduced tiles
])
def test_trace_records_every_tile(pool2, pattern, want):
    for counts in pool2.run(_trace_body, pattern):
        assert counts == want
