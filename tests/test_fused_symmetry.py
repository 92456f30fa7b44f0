"""A fused op whose symmetric operand lies at different heap offsets on different ranks (allocations
out of step, or a heap operand on one rank and a plain one on another) fails: it writes into no
peer, ``ctx.check()`` raises a DivergenceError naming both offsets, and the next call with
symmetric operands runs normally (trident.ops.fused.sync, "Symmetry check").
"""

import pytest
import torch

import trident
from tests.helpers import GEMM_TOL, relative_error
from trident.errors import DivergenceError

M, N_LOCAL, K = 24, 16, 32


def _operands(ctx):
    gen = torch.Generator().manual_seed(5)
    A = torch.randn(M, K, generator=gen).to(ctx.device)
    B = torch.randn(K, N_LOCAL * ctx.world_size, generator=gen).to(ctx.device)
    return A, B[:, ctx.rank * N_LOCAL:(ctx.rank + 1) * N_LOCAL].contiguous(), A @ B


def _scatter_into_diverged_c(ctx, pattern):
    A, B_local, want = _operands(ctx)
    good = ctx.zeros(M, N_LOCAL * ctx.world_size)  # made before the ranks diverge: symmetric
    trident.ops.gemm_all_scatter(ctx, A, B_local, good, pattern=pattern)  # the op's sync block exists
    guard = ctx.full((4096,), 7.0)
    if ctx.rank == 1:
        extra = ctx.full((4096,), 3.0)  # rank 1 makes one more tensor: its C lies further on
    bad = ctx.zeros(M, N_LOCAL * ctx.world_size)
    # Rank 0's C lies where rank 1's extra tensor is: a write at rank 0's offset would land there.
    offsets = ctx.all_gather_object("offsets", ctx.heap_offset(bad))
    trident.ops.gemm_all_scatter(ctx, A, B_local, bad, pattern=pattern)
    with pytest.raises(DivergenceError) as caught:
        ctx.check()
    message = str(caught.value)
    peer = 1 - ctx.rank
    assert f"{offsets[ctx.rank]:#x} on rank {ctx.rank}" in message and f"{offsets[peer]:#x} on rank {peer}" in message
    untouched = bool(torch.equal(guard.cpu(), torch.full((4096,), 7.0)))
    if ctx.rank == 1:
        untouched &= bool(torch.equal(extra.cpu(), torch.full((4096,), 3.0)))
    # The context is still in step for calls whose operands are symmetric.
    trident.ops.gemm_all_scatter(ctx, A, B_local, good, pattern=pattern)
    ctx.check()
    return offsets, untouched, relative_error(good, want.cpu().double())  # fp32 GEMMs run in tf32 on a GPU


@pytest.mark.parametrize("pattern", ["fused_sequential", "workgroup_specialized", "producer_consumer"])
def test_gemm_all_scatter_into_c_at_different_offsets_fails_and_writes_no_peer(pool2, pattern):
    for offsets, untouched, error in pool2.run(_scatter_into_diverged_c, pattern):
        assert offsets[0] != offsets[1], offsets
        assert untouched, "a call with asymmetric operands wrote into a peer's other tensor"
        assert error < GEMM_TOL[torch.float32], error


def _gather_mixed_placement(ctx, pattern):
    A, B, _ = _operands(ctx)
    rows = M // ctx.world_size
    plain = A[ctx.rank * rows:(ctx.rank + 1) * rows].clone()
    C = torch.empty(M, N_LOCAL, device=ctx.device)
    trident.ops.all_gather_gemm(ctx, plain, B, C, pattern=pattern)  # its staging and sync block exist
    # Rank 0 passes a heap tensor (used in place), rank 1 a plain one (staged): peers would read the wrong rows.
    mixed = ctx.as_symmetric(plain) if ctx.rank == 0 else plain
    trident.ops.all_gather_gemm(ctx, mixed, B, C, pattern=pattern)
    with pytest.raises(DivergenceError, match="lies at heap offset"):
        ctx.check()
    trident.ops.all_gather_gemm(ctx, plain, B, C, pattern=pattern)  # both plain again: staged alike
    ctx.check()
    return relative_error(C, (A @ B).cpu().double())


@pytest.mark.parametrize("pattern", ["fused_sequential", "workgroup_specialized"])
def test_all_gather_gemm_with_a_heap_operand_on_one_rank_only_fails(pool2, pattern):
    assert max(pool2.run(_gather_mixed_placement, pattern)) < GEMM_TOL[torch.float32]


def _first_call_after_diverging(ctx):
    A, B_local, _ = _operands(ctx)
    guard = ctx.full((4096,), 7.0)
    if ctx.rank == 1:
        ctx.full((4096,), 3.0)  # rank 1 makes one more tensor before the op's first call
    C = ctx.zeros(M, N_LOCAL * ctx.world_size)
    # The op's sync block is made now, after the ranks diverged: peers would signal into wrong places.
    with pytest.raises(DivergenceError, match="out of step"):
        trident.ops.gemm_all_scatter(ctx, A, B_local, C, pattern="fused_sequential")
    return bool(torch.equal(guard.cpu(), torch.full((4096,), 7.0))) and float(C.abs().max()) == 0.0


def test_a_fused_op_first_called_after_ranks_diverged_refuses_before_any_write(pool2):
    assert all(pool2.run(_first_call_after_diverging))


def _heap_allocations_out_of_step(ctx):
    A, B_local, want = _operands(ctx)
    good = ctx.zeros(M, N_LOCAL * ctx.world_size)
    trident.ops.gemm_all_scatter(ctx, A, B_local, good, pattern="fused_sequential")  # sync block made in step
    kept = []
    with ctx.heap_allocations():  # activations torch makes on the heap; rank 1 makes one more first
        if ctx.rank == 1:
            kept.append(torch.full((4096,), 3.0, device=ctx.device))
        C = torch.zeros(M, N_LOCAL * ctx.world_size, device=ctx.device)
    trident.ops.gemm_all_scatter(ctx, A, B_local, C, pattern="fused_sequential")
    with pytest.raises(DivergenceError, match="lies at heap offset"):
        ctx.check()
    untouched = all(bool(torch.equal(t.cpu(), torch.full((4096,), 3.0))) for t in kept)
    with pytest.raises(DivergenceError, match="out of step"):
        ctx.barrier()  # the allocation digests differ too
    return untouched


def test_a_fused_op_on_heap_allocations_made_out_of_step_fails_and_overwrites_nothing(pool2):
    assert all(pool2.run(_heap_allocations_out_of_step))
