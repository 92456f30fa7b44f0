"""The device debug mode (TRIDENT_DEBUG=1): translated accesses outside the heap are reported and skipped."""

import torch
import triton
import triton.language as tl

import trident


@triton.jit
def overrun_kernel(x_ptr, n, past_end, rank, peer, heap_bases, BLOCK: tl.constexpr):
    """Stores BLOCK values into the peer's x; lanes >= n are pushed `past_end` elements further."""
    offs = tl.arange(0, BLOCK)
    index = tl.where(offs < n, offs, offs + past_end)
    trident.store(x_ptr + index, offs + 1, rank, peer, heap_bases)


def _overrun_body(ctx):
    n = 6
    x = ctx.zeros(8, dtype=torch.int32)
    guard = ctx.full((8,), -5, dtype=torch.int32)  # the next allocation must stay intact
    ctx.barrier()
    offset_of_x = x.data_ptr() - ctx.heap_bases_host[ctx.rank]
    past_end = ctx.heap_size // 4  # elements: lands beyond the end of every heap
    peer = (ctx.rank + 1) % ctx.world_size
    try:
        overrun_kernel[(1,)](x, n, past_end, ctx.rank, peer, ctx.heap_bases, BLOCK=8)
        ctx.check()
        message = "no error"
    except Exception as exc:  # the simulator raises in the launch, a GPU in check()
        message = str(exc)
    ctx.barrier()
    bad_offset = offset_of_x + 4 * (7 + past_end)  # the highest bad lane is reported
    return message, x.tolist(), guard.tolist(), bad_offset, peer


def test_out_of_heap_store_is_reported_with_rank_peer_and_offset(debug_pool):
    for rank, (message, x, guard, bad_offset, peer) in enumerate(debug_pool.run(_overrun_body)):
        assert f"rank {rank}: access outside the symmetric heap" in message, message
        assert f"peer {peer}" in message and f"heap offset {bad_offset:#x}" in message, message
        assert guard == [-5] * 8  # nothing beyond x was touched


def _in_bounds_lanes_still_run_body(ctx):
    """On a GPU the kernel goes on after a bad lane: good lanes land, bad lanes are skipped."""
    x = ctx.zeros(8, dtype=torch.int32)
    ctx.barrier()
    try:
        overrun_kernel[(1,)](x, 6, ctx.heap_size // 4, ctx.rank, ctx.rank, ctx.heap_bases, BLOCK=8)
    except Exception:
        return "raised at launch"  # the simulator stops the kernel at the fault
    try:
        ctx.check()
    except trident.DeviceError:
        pass
    return x.tolist()


def test_good_lanes_land_when_a_gpu_kernel_continues(debug_pool):
    for result in debug_pool.run(_in_bounds_lanes_still_run_body):
        assert result == "raised at launch" or result == [1, 2, 3, 4, 5, 6, 0, 0], result


@triton.jit
def load_kernel(x_ptr, out_ptr, n, rank, peer, heap_bases, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, trident.load(x_ptr + offs, rank, peer, heap_bases, mask=offs < n), mask=offs < n)


def _off_heap_tensor_body(ctx):
    x = ctx.arange(16, dtype=torch.float32)
    off_heap = x + 1  # arithmetic makes a new tensor outside the heap
    out = torch.zeros(16, device=ctx.device)
    ctx.barrier()
    try:
        load_kernel[(1,)](off_heap, out, 16, ctx.rank, (ctx.rank + 1) % ctx.world_size, ctx.heap_bases, BLOCK=16)
        ctx.check()
        message = "no error"
    except Exception as exc:
        message = str(exc)
    ctx.barrier()
    return message


def test_a_tensor_computed_from_a_heap_tensor_is_caught(debug_pool):
    for message in debug_pool.run(_off_heap_tensor_body):
        assert "outside the symmetric heap" in message and "(a tensor computed from one" in message, message


def _debug_flag_body(ctx):
    return ctx.debug, trident.config.DEBUG


def test_debug_mode_is_on_only_where_asked(debug_pool, pool2):
    assert debug_pool.run(_debug_flag_body) == [(True, True)] * 2
    assert pool2.run(_debug_flag_body) == [(False, False)] * 2


def _mismatch_body(ctx):
    import trident
    from trident.testing import refusals

    r, w, dev = ctx.rank, ctx.world_size, ctx.device
    calls = {
        "all_reduce": lambda: trident.ccl.all_reduce(ctx, torch.ones(4 + r, device=dev)),
        "gemm_all_scatter": lambda: trident.ops.gemm_all_scatter(
            ctx, torch.ones(8, 4, device=dev), torch.ones(4, 2, device=dev),
            [ctx.zeros(8, 2 * w), ctx.zeros(8, 2 * w)][r]),  # two allocations: C at different offsets
        "all_gather_gemm": lambda: trident.ops.all_gather_gemm(
            ctx, [ctx.ones(4, 4), torch.ones(4, 4, device=dev)][r % 2],  # a heap A_local and a plain one
            torch.ones(4, 2, device=dev), torch.empty(4 * w, 2, device=dev)),
        "gemm_reduce_scatter": lambda: trident.ops.gemm_reduce_scatter(
            ctx, torch.ones(4 * w, 4 + r, device=dev), torch.ones(4 + r, 2, device=dev), torch.empty(4, 2, device=dev)),
    }
    return refusals(calls)


def test_collectives_and_fused_ops_refuse_arguments_that_differ_across_ranks(debug_pool):
    for rank, messages in enumerate(debug_pool.run(_mismatch_body)):
        for name, text in messages.items():
            assert text.startswith(f"rank {rank}: ranks called collectives with different arguments"), (name, text)
            assert f"rank 0: ('{name}'" in text and f"rank 1: ('{name}'" in text, text
        assert "C at heap offset" in messages["gemm_all_scatter"]
        assert "A_local at heap offset" in messages["all_gather_gemm"] and "not on the heap" in \
            messages["all_gather_gemm"]
