"""ctx.register / ctx.unregister: a tensor made elsewhere (torch's allocator) reachable by peers.

A kernel passes ``win.bases`` where the device API takes ``heap_bases`` and reads or writes peers'
registered tensors; the values survive registration; debug mode's bounds check accepts the
window's bytes and still refuses bytes past it; bad input gets clear errors; unregister and close
end the registration.
"""

import pytest
import torch
import triton
import triton.language as tl

import trident
from trident.errors import ContextClosedError, DivergenceError


@triton.jit
def pull_kernel(x_ptr, out_ptr, n, rank, world_size, bases, BLOCK: tl.constexpr):
    """out = the left neighbour's x (remote loads)."""
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    left = (rank + world_size - 1) % world_size
    tl.store(out_ptr + offs, trident.load(x_ptr + offs, rank, left, bases, mask=mask), mask=mask)


@triton.jit
def push_kernel(x_ptr, n, rank, world_size, bases, BLOCK: tl.constexpr):
    """x of the right neighbour += 1000 (remote atomics)."""
    offs = tl.arange(0, BLOCK)
    trident.atomic_add(x_ptr + offs, 1000.0, rank, (rank + 1) % world_size, bases, mask=offs < n)


def _values(rank, n=100):
    return torch.arange(n, dtype=torch.float32) + 100 * rank


def _reach_peers(ctx):
    x = _values(ctx.rank).to(ctx.device)  # torch's allocator, not the heap
    assert not ctx.is_symmetric(x)
    win = ctx.register(x)
    assert torch.equal(x.cpu(), _values(ctx.rank)), "registering keeps the values"
    out = torch.zeros(100, device=ctx.device)
    ctx.barrier()
    pull_kernel[(1,)](x, out, 100, ctx.rank, ctx.world_size, win.bases, BLOCK=128)
    ctx.barrier()  # every rank has read before any rank adds
    push_kernel[(1,)](x, 100, ctx.rank, ctx.world_size, win.bases, BLOCK=128)
    ctx.barrier()
    left = (ctx.rank - 1) % ctx.world_size
    pulled = torch.equal(out.cpu(), _values(left))
    pushed = torch.equal(x.cpu(), _values(ctx.rank) + 1000)  # my left neighbour added to mine
    seen = torch.equal(win.peer(left).cpu(), _values(left) + 1000)
    ctx.unregister(win)
    assert not win.registered
    with pytest.raises(ContextClosedError, match="unregistered"):
        win.peer(left)
    return pulled, pushed, seen


def test_a_kernel_reaches_peers_registered_tensors_through_the_window(pool):
    for result in pool.run(_reach_peers):
        assert result == (True, True, True), result


@triton.jit
def read_past_kernel(x_ptr, out_ptr, n, extra, rank, peer, bases, BLOCK: tl.constexpr):
    """out = peer's x[0 .. n + extra): the lanes past n read beyond the registered tensor."""
    offs = tl.arange(0, BLOCK)
    mask = offs < n + extra
    tl.store(out_ptr + offs, trident.load(x_ptr + offs, rank, peer, bases, mask=mask, other=0.0), mask=mask)


def _debug_bounds(ctx):
    storage = torch.zeros(64 * 1024, device=ctx.device)  # x is its start: bytes past x stay mapped
    x = storage[:64]
    x.copy_(_values(ctx.rank, 64))
    win = ctx.register(x)
    out = torch.zeros(128, device=ctx.device)
    peer = (ctx.rank + 1) % ctx.world_size
    ctx.barrier()
    read_past_kernel[(1,)](x, out, 64, 0, ctx.rank, peer, win.bases, BLOCK=128)
    ctx.check()  # inside the window: no fault
    inside = torch.equal(out[:64].cpu(), _values(peer, 64))
    try:
        read_past_kernel[(1,)](x, out, 64, 8, ctx.rank, peer, win.bases, BLOCK=128)
        ctx.check()
        message = "no error"
    except trident.DeviceError as exc:  # the simulator raises in the launch, a GPU in check()
        message = str(exc)
    ctx.barrier()
    ctx.unregister(win)
    return inside, message


def test_debug_mode_accepts_a_windows_bytes_and_refuses_bytes_past_it(debug_pool):
    for inside, message in debug_pool.run(_debug_bounds):
        assert inside
        assert "access outside the symmetric heap" in message, message


def _bad_input(ctx):
    errors = []
    for bad in (ctx.zeros(8), torch.zeros(0, device=ctx.device), torch.zeros(80, device=ctx.device)[1:], "x"):
        with pytest.raises((TypeError, ValueError)) as caught:
            ctx.register(bad)
        errors.append(str(caught.value))
    with pytest.raises(DivergenceError, match="same shape"):
        ctx.register(torch.zeros(8 + ctx.rank, device=ctx.device))  # ranks disagree
    win = ctx.register(torch.ones(16, device=ctx.device))
    ctx.unregister(win)
    with pytest.raises(ValueError, match="not registered"):
        ctx.unregister(win)
    with pytest.raises(TypeError, match="what ctx.register returned"):
        ctx.unregister(torch.ones(16))
    kept = ctx.register(torch.ones(16, device=ctx.device))
    return errors, kept


def _refusals_then_close(ctx):
    with trident.init(heap_size=16 << 20) as inner:  # a context of its own: closing it leaves the pool's
        errors, kept = _bad_input(inner)
    return errors, kept.registered


def test_bad_registrations_are_refused_clearly_and_close_ends_the_rest(pool2):
    for errors, registered in pool2.run(_refusals_then_close):
        assert "symmetric heap already" in errors[0]
        assert "empty" in errors[1]
        assert "byte boundary" in errors[2]
        assert "expected a torch.Tensor" in errors[3]
        assert not registered, "close() ends every registration"


@triton.jit
def fill_right_kernel(x_ptr, n, value, rank, world_size, bases, BLOCK: tl.constexpr):
    """The right neighbour's x[:n] = value."""
    offs = tl.arange(0, BLOCK)
    trident.store(x_ptr + offs, tl.full([BLOCK], value, tl.float32), rank, (rank + 1) % world_size, bases,
                  mask=offs < n)


def _graph_inputs(ctx):
    static_in = torch.zeros(256, device=ctx.device)  # torch's caching allocator, before capture
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up off the capture stream, as torch recommends
        static_in * 2
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = static_in * 2
    win = ctx.register(static_in)  # the graph's input, registered after its capture
    ctx.barrier()
    fill_right_kernel[(1,)](static_in, 256, float(ctx.rank + 1), ctx.rank, ctx.world_size, win.bases, BLOCK=256)
    ctx.barrier()
    graph.replay()  # reads what the left neighbour wrote into this rank's input
    torch.cuda.synchronize()
    left = (ctx.rank - 1) % ctx.world_size
    ok = torch.equal(static_out.cpu(), torch.full((256,), 2.0 * (left + 1)))
    ctx.unregister(win)
    return ok


@pytest.mark.skipif(trident.platform.SIMULATOR, reason="CUDA graphs need the cuda backend")
def test_a_cuda_graphs_captured_input_is_registered_and_written_by_a_peer(pool):
    assert all(pool.run(_graph_inputs))
