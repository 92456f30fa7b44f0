"""Property-based tests run inside the ranks: every rank draws the same examples (derandomized)."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.int32, torch.int64,
          torch.uint8, torch.bool]
shapes = st.lists(st.integers(0, 9), min_size=0, max_size=4).map(tuple)


def _creation_properties_body(ctx):
    checked = []

    # derandomize: the same examples on every rank, so the collective allocations stay in step
    @settings(max_examples=60, deadline=None, derandomize=True, database=None)
    @given(shape=shapes, dtype=st.sampled_from(DTYPES), fill=st.integers(-3, 3), transpose=st.booleans())
    def check(shape, dtype, fill, transpose):
        before = ctx.memory_stats()["allocated_bytes"]
        zeros, full = ctx.zeros(shape, dtype=dtype), ctx.full(shape, fill, dtype=dtype)
        assert torch.equal(zeros.cpu(), torch.zeros(shape, dtype=dtype))
        assert torch.equal(full.cpu(), torch.full(shape, fill, dtype=dtype))
        source = torch.full(shape, fill, dtype=dtype)
        if transpose and len(shape) >= 2:
            source = source.transpose(0, 1)  # non-contiguous
        copy = ctx.as_symmetric(source)
        assert copy.shape == source.shape and torch.equal(copy.cpu(), source)
        for t in (zeros, full, copy):
            assert ctx.is_symmetric(t)
        offsets = ctx.broadcast([ctx.heap_offset(t) for t in (zeros, full, copy)], src=0)
        assert offsets == [ctx.heap_offset(t) for t in (zeros, full, copy)]  # symmetric
        ctx.broadcast(copy, src=ctx.world_size - 1)  # in place, also for empty and transposed tensors
        assert torch.equal(copy.cpu(), source)
        ctx.free(zeros, full, copy)
        assert ctx.memory_stats()["allocated_bytes"] == before
        checked.append(shape)

    check()
    return len(checked)


def test_creation_symmetry_and_broadcast_over_random_shapes_and_dtypes(pool):
    counts = pool.run(_creation_properties_body)
    assert counts[0] > 20 and len(set(counts)) == 1


def _broadcast_non_contiguous_body(ctx):
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6) * (ctx.rank + 1)
    plain = base.clone().t()  # a non-contiguous torch tensor, not on the heap
    ctx.broadcast(plain, src=1)
    heap = ctx.as_symmetric(base)[:, ::2]  # a non-contiguous view of a heap tensor
    ctx.broadcast(heap, src=0)
    return plain.tolist(), heap.tolist()


def test_broadcast_of_non_contiguous_tensors(pool2):
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    for plain, heap in pool2.run(_broadcast_non_contiguous_body):
        assert plain == (base * 2).t().tolist()
        assert heap == base[:, ::2].tolist()



def _fused_ops_properties_body(ctx):
    import trident
    from trident.ops import MatmulConfig

    checked = []
    ops = ("gemm_all_scatter", "all_gather_gemm", "gemm_reduce_scatter")
    fused = ("bulk_synchronous", "fused_sequential", "workgroup_specialized")

    @settings(max_examples=24, deadline=None, derandomize=True, database=None)
    @given(op=st.sampled_from(ops), pattern=st.sampled_from(fused), rows=st.integers(1, 40), n=st.integers(1, 24),
           k=st.integers(1, 40), dtype=st.sampled_from([torch.float16, torch.float32]),
           block=st.sampled_from([16, 32]), seed=st.integers(0, 1000))
    def check(op, pattern, rows, n, k, dtype, block, seed):
        w = ctx.world_size
        cfg = MatmulConfig(BLOCK_M=block, BLOCK_N=16, BLOCK_K=block, GROUP_M=2, num_warps=4, num_stages=1)
        gen = torch.Generator().manual_seed(seed)
        if op == "gemm_all_scatter":  # A rows x k, every rank's B n columns
            A, B = torch.randn(rows, k, generator=gen).to(dtype), torch.randn(k, n * w, generator=gen).to(dtype)
            C = ctx.full((rows, n * w), float("nan"), dtype=dtype)
            ctx.barrier()
            trident.ops.gemm_all_scatter(ctx, A.to(ctx.device), B[:, ctx.rank * n:(ctx.rank + 1) * n].contiguous()
                                         .to(ctx.device), C, pattern=pattern, config=cfg)
            ctx.barrier()
            want = A.double() @ B.double()
        elif op == "all_gather_gemm":  # every rank's A rows x k, my B k x n
            A, B = torch.randn(rows * w, k, generator=gen).to(dtype), torch.randn(k, n, generator=gen).to(dtype)
            C = torch.full((rows * w, n), float("nan"), dtype=dtype, device=ctx.device)
            trident.ops.all_gather_gemm(ctx, A[ctx.rank * rows:(ctx.rank + 1) * rows].to(ctx.device),
                                        B.to(ctx.device), C, pattern=pattern, config=cfg)
            want = A.double() @ B.double()
        else:  # every rank's A (rows*w x k) and B (k x n), summed; my rows kept
            A, B = torch.randn(w, rows * w, k, generator=gen).to(dtype), torch.randn(w, k, n, generator=gen).to(dtype)
            C = torch.full((rows, n), float("nan"), dtype=dtype, device=ctx.device)
            trident.ops.gemm_reduce_scatter(ctx, A[ctx.rank].to(ctx.device), B[ctx.rank].to(ctx.device), C,
                                            pattern=pattern, config=cfg)
            want = torch.bmm(A.double(), B.double()).sum(0)[ctx.rank * rows:(ctx.rank + 1) * rows]
        got = C.cpu().double()
        assert torch.isfinite(got).all(), (op, pattern, rows, n, k)
        err = float((got - want).norm() / want.norm().clamp_min(1e-12))
        assert err < 5e-3, (op, pattern, rows, n, k, dtype, block, err)
        if op == "gemm_all_scatter":
            ctx.free(C)
        checked.append(op)

    check()
    return len(checked)


def test_fused_ops_match_torch_over_random_shapes(pool2):
    """Random ragged shapes (1 row, 1 column, K below one block, ...) for every fused pattern of the three ops."""
    counts = pool2.run(_fused_ops_properties_body)
    assert counts[0] == counts[1] and counts[0] >= 20
