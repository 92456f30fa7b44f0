"""Atomics on a peer's copy: every op x dtype x sem x scope, masks, returned old values, contention."""

import pytest
import torch
import triton
import triton.language as tl

import trident

SEMS = ["relaxed", "acquire", "release", "acq_rel"]
SCOPES = ["cta", "gpu", "sys"]
# Types Triton allows per op (fp16/bf16 only for add; min/max not for fp16/bf16; bitwise ops on ints).
OP_DTYPES = {
    "add": [torch.float16, torch.bfloat16, torch.float32, torch.int32, torch.int64],
    "sub": [torch.float16, torch.bfloat16, torch.float32, torch.int32, torch.int64],
    "xchg": [torch.float32, torch.int32, torch.int64],
    "and": [torch.int32, torch.int64],
    "or": [torch.int32, torch.int64],
    "xor": [torch.int32, torch.int64],
    "min": [torch.float32, torch.int32, torch.int64],
    "max": [torch.float32, torch.int32, torch.int64],
    "cas": [torch.float16, torch.bfloat16, torch.float32, torch.int32, torch.int64],
}
REFERENCE = {
    "add": lambda x, v: x + v, "sub": lambda x, v: x - v, "xchg": lambda x, v: v,
    "and": lambda x, v: x & v, "or": lambda x, v: x | v, "xor": lambda x, v: x ^ v,
    "min": torch.minimum, "max": torch.maximum,
}
# The device function of each op in REFERENCE: the kernel takes it as a constexpr (Triton inlines it).
ATOMICS = {"add": trident.atomic_add, "sub": trident.atomic_sub, "xchg": trident.atomic_xchg,
           "and": trident.atomic_and, "or": trident.atomic_or, "xor": trident.atomic_xor,
           "min": trident.atomic_min, "max": trident.atomic_max}


@triton.jit
def atomic_op_kernel(x_ptr, val_ptr, old_ptr, n, rank, peer, heap_bases, ATOMIC: tl.constexpr, SEM: tl.constexpr,
                     SCOPE: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    val = tl.load(val_ptr + offs, mask=mask)
    old = ATOMIC(x_ptr + offs, val, rank, peer, heap_bases, mask=mask, sem=SEM, scope=SCOPE)
    tl.store(old_ptr + offs, old, mask=mask)


@triton.jit
def cas_kernel(x_ptr, cmp_ptr, val_ptr, old_ptr, rank, peer, heap_bases, SEM: tl.constexpr, SCOPE: tl.constexpr,
               BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    old = trident.atomic_cas(x_ptr + offs, tl.load(cmp_ptr + offs), tl.load(val_ptr + offs), rank, peer, heap_bases,
                             sem=SEM, scope=SCOPE)
    tl.store(old_ptr + offs, old)


def _initial(n, rank, dtype):
    return (torch.arange(n) % 7 + 10 * rank).to(dtype)


def _operand(n, rank, dtype):
    return (torch.arange(n) % 5 + 1 + rank).to(dtype)


def _atomic_body(ctx, op, dtype, n, block):
    left, right = (ctx.rank - 1) % ctx.world_size, (ctx.rank + 1) % ctx.world_size
    failures = []
    x = ctx.zeros(n + 3, dtype=dtype)  # 3 elements past n must stay untouched (the mask)
    val = ctx.as_symmetric(_operand(n, ctx.rank, dtype))
    old = ctx.zeros(n, dtype=dtype)
    for sem in SEMS:
        for scope in SCOPES:
            x[:n] = _initial(n, ctx.rank, dtype)
            x[n:] = -3
            ctx.barrier()
            atomic_op_kernel[(triton.cdiv(n, block),)](x, val, old, n, ctx.rank, right, ctx.heap_bases,
                                                       ATOMIC=ATOMICS[op], SEM=sem, SCOPE=scope, BLOCK=block)
            ctx.barrier()
            # My x was updated by my left neighbour with its operand; my `old` holds my right one's x.
            want_x = REFERENCE[op](_initial(n, ctx.rank, dtype), _operand(n, left, dtype))
            got_x, got_old = x.cpu(), old.cpu()
            if not torch.equal(got_x[:n], want_x) or not torch.all(got_x[n:] == -3):
                failures.append(f"{sem}/{scope}: x {got_x.tolist()} != {want_x.tolist()}")
            if not torch.equal(got_old, _initial(n, right, dtype)):
                failures.append(f"{sem}/{scope}: old {got_old.tolist()}")
    return failures


@pytest.mark.parametrize("op", [op for op in OP_DTYPES if op != "cas"])
def test_atomic_op_every_dtype_sem_and_scope(pool, op):
    for dtype in OP_DTYPES[op]:
        results = pool.run(_atomic_body, op, dtype, 13, 8)  # 13 elements in blocks of 8: a masked tail
        assert all(r == [] for r in results), (dtype, results)


def _cas_body(ctx, dtype):
    right, left = (ctx.rank + 1) % ctx.world_size, (ctx.rank - 1) % ctx.world_size
    n = 8
    x = ctx.zeros(n, dtype=dtype)
    # Even lanes compare equal to the target's current value (they swap), odd lanes do not.
    target = _initial(n, right, dtype)
    cmp = ctx.as_symmetric(torch.where(torch.arange(n) % 2 == 0, target, target + 1))
    val = ctx.as_symmetric(_operand(n, ctx.rank, dtype) + 50)
    old = ctx.zeros(n, dtype=dtype)
    failures = []
    for sem in SEMS:
        for scope in SCOPES:
            x.copy_(_initial(n, ctx.rank, dtype))
            ctx.barrier()
            cas_kernel[(1,)](x, cmp, val, old, ctx.rank, right, ctx.heap_bases, SEM=sem, SCOPE=scope, BLOCK=n)
            ctx.barrier()
            even = torch.arange(n) % 2 == 0
            want = torch.where(even, _operand(n, left, dtype) + 50, _initial(n, ctx.rank, dtype))
            if not torch.equal(x.cpu(), want) or not torch.equal(old.cpu(), _initial(n, right, dtype)):
                failures.append(f"{sem}/{scope}: x {x.tolist()} old {old.tolist()}")
    return failures


@pytest.mark.parametrize("dtype", OP_DTYPES["cas"], ids=str)
def test_atomic_cas_swaps_only_on_match(pool, dtype):
    results = pool.run(_cas_body, dtype)
    assert all(r == [] for r in results), results


@triton.jit
def contention_kernel(counter_ptr, world_size, rank, heap_bases, ROUNDS: tl.constexpr):
    # Every program of every rank adds 1 to every rank's counter, ROUNDS times, peers in a loop.
    for _ in range(ROUNDS):
        for peer in range(world_size):
            trident.atomic_add(counter_ptr, 1, rank, peer, heap_bases, sem="relaxed", scope="sys")


def _contention_body(ctx, dtype):
    counter = ctx.zeros(1, dtype=dtype)
    ctx.barrier()
    programs, rounds = 4, 3
    contention_kernel[(programs,)](counter, ctx.world_size, ctx.rank, ctx.heap_bases, ROUNDS=rounds)
    ctx.barrier()
    return counter.item(), programs * rounds * ctx.world_size


@pytest.mark.parametrize("dtype", [torch.int64, torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_atomic_add_under_contention_counts_exactly(pool, dtype):
    # Every count is exact in each dtype; a non-atomic add across rank processes would lose some.
    for got, want in pool.run(_contention_body, dtype):
        assert got == want
