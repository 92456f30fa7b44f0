"""translate / load / store / get / put / copy across ranks, for every dtype, ragged sizes and 2-D tiles."""

import pytest
import torch
import triton
import triton.language as tl

import trident

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.int32, torch.int64, torch.int8]
SIZES = [(1, 128), (200, 128), (1000, 256)]  # (n, BLOCK): one element, ragged tails, several programs


@triton.jit
def memory_op_kernel(x_ptr, y_ptr, n, rank, peer, dst_rank, heap_bases, OP: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    if OP == "load":
        tl.store(y_ptr + offs, trident.load(x_ptr + offs, rank, peer, heap_bases, mask=mask), mask=mask)
    elif OP == "store":
        trident.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask), rank, peer, heap_bases, mask=mask)
    elif OP == "get":
        trident.get(x_ptr + offs, y_ptr + offs, rank, peer, heap_bases, mask=mask)
    elif OP == "put":
        trident.put(x_ptr + offs, y_ptr + offs, rank, peer, heap_bases, mask=mask)
    elif OP == "copy":
        trident.copy(x_ptr + offs, y_ptr + offs, peer, dst_rank, rank, heap_bases, mask=mask)
    else:
        remote = trident.translate(y_ptr + offs, rank, peer, heap_bases)
        tl.store(remote, tl.load(x_ptr + offs, mask=mask), mask=mask)


def _pattern(n, rank, dtype):
    base = torch.arange(n) % 100 + 100 * rank + 1
    return base.to(dtype)


def _source_of_y(op, rank, world):
    """Which rank's x ends up in my y after ``op`` (peer = rank + 1, copy's destination = rank + 2)."""
    if op in ("load", "get"):
        return (rank + 1) % world       # I pulled from my right neighbour
    if op in ("store", "put", "translate"):
        return (rank - 1) % world       # my left neighbour pushed into me
    # copy: rank q moves x of q+1 into y of q+2, so mine came from x of (rank - 2) + 1
    return (rank - 1) % world


def _memory_op_body(ctx, op):
    world = ctx.world_size
    failures = []
    for dtype in DTYPES:
        for n, block in SIZES:
            x = ctx.as_symmetric(_pattern(n, ctx.rank, dtype))
            y = ctx.full((n + 7,), -1, dtype=dtype)  # the 7 extra elements must stay untouched
            ctx.barrier()
            peer, dst = (ctx.rank + 1) % world, (ctx.rank + 2) % world
            memory_op_kernel[(triton.cdiv(n, block),)](x, y, n, ctx.rank, peer, dst, ctx.heap_bases,
                                                       OP=op, BLOCK=block)
            ctx.barrier()
            expected = _pattern(n, _source_of_y(op, ctx.rank, world), dtype)
            got = y.cpu()
            if not torch.equal(got[:n], expected) or not torch.all(got[n:] == -1):
                failures.append(f"{dtype} n={n}: {got[:4].tolist()}... tail {got[n:].tolist()}")
            ctx.free(x, y)
    return failures


@pytest.mark.parametrize("op", ["load", "store", "get", "put", "copy", "translate"])
def test_memory_op_moves_the_right_data(pool, op):
    results = pool.run(_memory_op_body, op)
    assert all(r == [] for r in results), results


@triton.jit
def tile_kernel(a_ptr, out_ptr, rows, cols, stride, rank, peer, heap_bases, BM: tl.constexpr, BN: tl.constexpr):
    """A GEMM-style 2-D tile read from a peer, and a per-lane peer block (lane i reads rank i % world)."""
    r = tl.program_id(0) * BM + tl.arange(0, BM)[:, None]
    c = tl.arange(0, BN)[None, :]
    mask = (r < rows) & (c < cols)
    tile = trident.load(a_ptr + r * stride + c, rank, peer, heap_bases, mask=mask, other=0.0)
    tl.store(out_ptr + r * stride + c, tile * 2, mask=mask)


@triton.jit
def per_lane_peer_kernel(x_ptr, out_ptr, world_size, rank, heap_bases, BLOCK: tl.constexpr):
    lanes = tl.arange(0, BLOCK)
    peers = lanes % world_size
    tl.store(out_ptr + lanes, trident.load(x_ptr + lanes, rank, peers, heap_bases))


def _tiles_body(ctx):
    rows, cols = 37, 20  # ragged in both dimensions
    a = ctx.as_symmetric(torch.arange(rows * cols, dtype=torch.float32).reshape(rows, cols) + 1000 * ctx.rank)
    out = ctx.zeros(rows, cols)
    x = ctx.full((16,), float(ctx.rank))
    lanes_out = ctx.zeros(16)
    ctx.barrier()
    peer = (ctx.rank + 1) % ctx.world_size
    tile_kernel[(triton.cdiv(rows, 16),)](a, out, rows, cols, cols, ctx.rank, peer, ctx.heap_bases, BM=16, BN=32)
    per_lane_peer_kernel[(1,)](x, lanes_out, ctx.world_size, ctx.rank, ctx.heap_bases, BLOCK=16)
    ctx.barrier()
    expected = (torch.arange(rows * cols, dtype=torch.float32).reshape(rows, cols) + 1000 * peer) * 2
    return (torch.equal(out.cpu(), expected),
            lanes_out.cpu().tolist() == [float(i % ctx.world_size) for i in range(16)])


def test_2d_tiles_and_per_lane_peers(pool):
    assert all(r == (True, True) for r in pool.run(_tiles_body))


@triton.jit
def scalar_kernel(x_ptr, y_ptr, rank, peer, heap_bases):
    value = trident.load(x_ptr, rank, peer, heap_bases)        # a scalar pointer, no block
    trident.store(y_ptr + 1, value + 1, rank, peer, heap_bases)


def _scalar_body(ctx):
    x = ctx.full((1,), 10 * ctx.rank + 3, dtype=torch.int64)
    y = ctx.zeros(2, dtype=torch.int64)
    ctx.barrier()
    scalar_kernel[(1,)](x, y, ctx.rank, (ctx.rank + 1) % ctx.world_size, ctx.heap_bases)
    ctx.barrier()
    return y.tolist()


def test_scalar_pointers(pool):
    results = pool.run(_scalar_body)
    world = len(results)
    # Rank r's y[1] was written by rank r-1 with (x of rank r) + 1.
    assert results == [[0, 10 * r + 3 + 1] for r in range(world)]


def _translate_host_view_body(ctx):
    """Host-side view of a peer's copy agrees with what a kernel reads through translation."""
    x = ctx.as_symmetric(torch.arange(50, dtype=torch.float32) * (ctx.rank + 1))
    y = ctx.zeros(50)
    ctx.barrier()
    peer = (ctx.rank + 1) % ctx.world_size
    memory_op_kernel[(1,)](x, y, 50, ctx.rank, peer, peer, ctx.heap_bases, OP="load", BLOCK=64)
    ctx.barrier()
    return torch.equal(y.cpu(), ctx.peer_view(x, peer).cpu())


def test_peer_view_matches_translated_loads(pool2):
    assert pool2.run(_translate_host_view_body) == [True, True]
