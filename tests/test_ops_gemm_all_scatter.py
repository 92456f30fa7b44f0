"""trident.ops.gemm_all_scatter: every pattern against torch at 2 and 4 ranks.

Each task runs inside the ranks: fresh random A and B shards (seeded the same on every rank, so
every rank can build the full reference), C poisoned with NaN before each call, two calls on the
same buffers with different B (a stale flag would leave the first result or NaNs), fp16, bf16
and fp32, ragged shapes and several tile configs (descriptor and pointer paths).
"""


import pytest
import torch

from tests.helpers import SMALL, TALL, assert_gemm_errors, assert_refused, relative_error
from trident.ops import MatmulConfig
from trident.testing import refusals

FUSED = ("bulk_synchronous", "producer_consumer", "fused_sequential", "workgroup_specialized")
# (dtype, M, N_local, K, config): ragged against the blocks; the first two take the TMA path
# (16-byte aligned rows), the others the pointer path.
CASES = [
    (torch.float16, 33, 24, 40, SMALL),
    (torch.bfloat16, 40, 16, 24, TALL),
    (torch.float32, 21, 13, 19, None),
    # 20 tiles: each of the simulator's 2 communication programs acquires two chunks of flags
    (torch.float16, 80, 64, 16, SMALL),
]


def _inputs(ctx, dtype, M, n, K, seed):
    gen = torch.Generator().manual_seed(seed)
    A = torch.randn(M, K, generator=gen).to(dtype)
    B = torch.randn(K, n * ctx.world_size, generator=gen).to(dtype)
    mine = B[:, ctx.rank * n:(ctx.rank + 1) * n].contiguous()
    return A.to(ctx.device), mine.to(ctx.device), A.double() @ B.double()



def _pattern_body(ctx, patterns, cases):
    import trident

    errors = []
    if "baseline" in patterns and ctx.device.type == "cuda" and torch.cuda.device_count() < ctx.world_size:
        return None  # NCCL cannot place two ranks on one GPU: the baseline needs a GPU per rank
    for pattern in patterns:
        for i, (dtype, M, n, K, cfg) in enumerate(cases):
            C = ctx.empty(M, n * ctx.world_size, dtype=dtype)
            for call in range(2):  # the same C, flags and workspace; different B each time
                A, B, want = _inputs(ctx, dtype, M, n, K, seed=100 * i + call)
                C.fill_(float("nan"))
                ctx.barrier()  # no peer stores into C before it is poisoned
                trident.ops.gemm_all_scatter(ctx, A, B, C, pattern=pattern, config=cfg)
                ctx.barrier()
                errors.append((pattern, dtype, call, relative_error(C, want)))
    return errors


@pytest.mark.parametrize("pattern", FUSED + ("baseline",))
def test_pattern_matches_torch(pool, pattern):
    assert_gemm_errors(pool.run(_pattern_body, (pattern,), CASES), 2 * len(CASES))


def test_patterns_in_turn_share_buffers_and_epochs(pool2):
    """Every pattern (and auto) one after another on the same workspace: the epoch is shared."""
    case = [(torch.float16, 24, 16, 32, MatmulConfig(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=1,
                                                     num_warps=4, num_stages=1))]
    assert_gemm_errors(pool2.run(_pattern_body, FUSED + FUSED[::-1] + ("auto",), case), 2 * (2 * len(FUSED) + 1))


def _trace_body(ctx, pattern):
    import trident
    import trident.trace

    A, B, want = _inputs(ctx, torch.float16, 32, 16, 16, seed=3)
    C = ctx.empty(32, 16 * ctx.world_size, dtype=torch.float16)
    trace = trident.trace.Trace(ctx, capacity=256)
    cfg = MatmulConfig(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=1, num_warps=4, num_stages=1)
    ctx.barrier()
    trident.ops.gemm_all_scatter(ctx, A, B, C, pattern=pattern, config=cfg, trace=trace)
    ctx.barrier()
    kinds = [e.kind_name for e in trace.events() if e.rank == ctx.rank]
    return relative_error(C, want), {k: kinds.count(k) for k in ("compute", "comm", "wait")}


@pytest.mark.parametrize("pattern,waits", [("bulk_synchronous", 0), ("producer_consumer", 2),
                                           ("fused_sequential", 0), ("workgroup_specialized", 2)])
def test_trace_records_every_tile(pool2, pattern, waits):
    tiles = 2  # 32 x 16 in 16 x 16 tiles
    for err, counts in pool2.run(_trace_body, pattern):
        assert err < 5e-3
        assert counts["compute"] == tiles
        assert counts["comm"] == tiles * (2 if pattern == "fused_sequential" else 1)  # fused also stores locally
        assert counts["wait"] == waits


def _bad_input_body(ctx):
    import trident

    gas = trident.ops.gemm_all_scatter
    w, dev = ctx.world_size, ctx.device
    A, B, C = ctx.zeros(8, 4), ctx.zeros(4, 3), ctx.zeros(8, 3 * w)
    calls = {
        "pattern": lambda: gas(ctx, A, B, C, pattern="ring"),
        "dtype": lambda: gas(ctx, A.int(), B.int(), C.int()),
        "mixed": lambda: gas(ctx, A, B.half(), C),
        "k": lambda: gas(ctx, A, ctx.zeros(5, 3), C),
        "n": lambda: gas(ctx, A, B, ctx.zeros(8, 3 * w + 1)),
        "contiguous": lambda: gas(ctx, ctx.zeros(4, 8).t(), B, C),
        "heap": lambda: gas(ctx, A, B, torch.zeros(8, 3 * w, device=dev)),
        "config": lambda: gas(ctx, A, B, C, config=MatmulConfig(BLOCK_M=24)),
        "tail": lambda: gas(ctx, A, B, C, config=MatmulConfig(tail_n=32)),
        "dims": lambda: gas(ctx, A[0], B, C),
        "device": lambda: gas(ctx, A.to("meta"), B, C),
    }
    return refusals(calls)


def test_bad_input_is_refused_before_anything_runs(pool2):
    expected = {"pattern": "pattern='ring' is not one of", "dtype": "dtype torch.int32",
                "mixed": "must share one dtype", "k": "K mismatch", "n": "N must be divisible by world_size",
                "contiguous": "must be contiguous",
                "heap": "C must be a symmetric tensor", "config": "BLOCK_M=24 must be a power of two",
                "tail": "tiles with a tail of columns are the matmul's only", "dims": "must be 2-D",
                "device": "is on meta"}
    for m in pool2.run(_bad_input_body):
        assert_refused(m, expected)


def test_auto_takes_the_first_measured_rule_that_applies_else_baseline():
    from trident.ops.fused.call import table_choice
    from trident.ops.tensor_parallel.gemm_all_scatter import AUTO_TABLE

    table = {("H200", 8): [(1 << 40, "fused_sequential"), (1 << 30, "producer_consumer")],
             ("H100", 4): [(0, "workgroup_specialized")]}
    assert table_choice(table, "NVIDIA H200", 8, 1 << 41) == "fused_sequential"
    assert table_choice(table, "NVIDIA H200", 8, 1 << 35) == "producer_consumer"
    assert table_choice(table, "NVIDIA H200", 8, 1 << 20) == "baseline"   # small: the fused paths lose
    assert table_choice(table, "NVIDIA H200", 4, 1 << 41) == "baseline"   # not measured at this size
    assert table_choice(table, "NVIDIA H100 80GB HBM3", 4, 1) == "workgroup_specialized"
    assert all(p in ("bulk_synchronous", "producer_consumer", "fused_sequential", "workgroup_specialized")
               for rules in AUTO_TABLE.values() for _, p in rules)
    from trident.ops import OPS
    from trident.platform import Platform

    one_h200 = Platform("cuda", torch.device("cuda", 0), 132, "NVIDIA H200", 1, 1)
    eight_h200 = Platform("cuda", torch.device("cuda", 0), 132, "NVIDIA H200", 8, 8)
    assert OPS["gemm_all_scatter"].choose(one_h200, 4096 ** 3) == "bulk_synchronous"  # measured: gas_1.json
    assert OPS["gemm_all_scatter"].choose(eight_h200, 4096 ** 3) == "baseline"  # nothing measured across GPUs


def test_default_comm_programs_follow_the_peers_each_tile_goes_to():
    from trident.ops import OPS
    from trident.platform import Platform

    def gpu(world_size):
        return Platform("cuda", torch.device("cuda", 0), 132, "NVIDIA H200", 8, world_size)

    gpu_defaults = [OPS["gemm_all_scatter"].comm_programs(gpu(w)) for w in (1, 2, 4, 8)]
    assert gpu_defaults == [1, 3, 7, 16]
    assert OPS["gemm_all_scatter"].comm_programs(Platform("sim", torch.device("cpu"), 4, "cpu", 0, 8)) == 2


def test_one_rank_every_pattern_is_the_gemm():
    """At one rank there is nobody to send to: every pattern must still produce A @ B (the
    communication side waits for each tile's flag, and reads nothing back)."""
    from tests.conftest import get_pool

    assert_gemm_errors(get_pool(1).run(_pattern_body, FUSED, CASES[:2]), 2 * 2 * len(FUSED))
