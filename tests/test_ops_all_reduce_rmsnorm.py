"""trident.ops.all_reduce_rmsnorm against torch: all-reduce (every rank's x summed in fp32) + residual + RMSNorm.

Tasks run inside the ranks and return a list of problems (empty when all is well).
"""

import re

import pytest
import torch

from tests.conftest import get_pool
from tests.helpers import assert_no_problems
from trident import ccl
from trident.ccl.api import INPUT_STAGE
from trident.ccl.workspace import workspace
from trident.ops.rmsnorm.all_reduce_rmsnorm import all_reduce_rmsnorm
from trident.testing import refusals

FLOATS = [torch.bfloat16, torch.float16, torch.float32]
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}
EPS = 1e-5
FP8 = torch.float8_e4m3fn


def _data(rank, shape, dtype, salt=0):
    """Rank ``rank``'s x (``rank`` = -1: the residual), rounded to ``dtype``; the same on every rank."""
    g = torch.Generator().manual_seed(1000 * salt + rank + 7)
    return (torch.randn(shape, generator=g) * (1 + rank % 3)).to(dtype)


def _weight(hidden, dtype):
    return torch.linspace(0.5, 1.5, hidden).to(dtype)


def _reference(world, shape, dtype, residual, weight, salt=0):
    """(normed in fp32, h in fp32) from every rank's x summed in fp32."""
    h = sum(_data(p, shape, dtype, salt).float() for p in range(world))
    if residual is not None:
        h = h + residual.float().cpu()
    normed = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS) * weight.float().cpu()
    return normed, h


def _diff(what, got, want, dtype):
    try:
        torch.testing.assert_close(got.cpu().float(), want.to(dtype).float(), rtol=TOL[dtype], atol=TOL[dtype])
    except AssertionError as exc:
        return [f"{what}: {str(exc).splitlines()[0]} {str(exc).splitlines()[2:4]}"]
    return []


def _check_call(ctx, what, x, shape, dtype, residual, weight, salt=0):
    out, h = all_reduce_rmsnorm(ctx, x, weight, EPS, residual=residual)
    return _check_results(ctx, what, out, h, shape, dtype, residual, weight, salt)


def _check_results(ctx, what, out, h, shape, dtype, residual, weight, salt=0):
    """What is wrong with a call's ``(out, h)`` (``residual`` as it was at the call)."""
    normed, h_want = _reference(ctx.world_size, shape, dtype, residual, weight, salt)
    problems = []
    if out.dtype != dtype or h.dtype != dtype or out.shape != shape or h.shape != shape:
        problems.append(f"{what}: out {out.dtype} {tuple(out.shape)}, h {h.dtype} {tuple(h.shape)}")
    return problems + _diff(f"{what}: h", h, h_want, dtype) + _diff(f"{what}: out", out, normed, dtype)


# -- results ---------------------------------------------------------------------------------------------


def _matches_body(ctx):
    """Every dtype with T = 1 and with T past the simulator's programs, ragged H; plain inputs. The residual
    alternates, and odd and even world sizes alternate the other way, so each case runs with and without."""
    me, problems = ctx.rank, []
    cases = [(shape, dtype) for shape in ((1, 200), (9, 37)) for dtype in FLOATS]
    for i, (shape, dtype) in enumerate(cases):
        with_residual = (i + ctx.world_size) % 2 == 0
        residual = _data(-1, shape, dtype).to(ctx.device) if with_residual else None
        x = _data(me, shape, dtype).to(ctx.device).clone()
        what = f"rank {me}/{ctx.world_size} {dtype} {shape} residual={with_residual}"
        problems += _check_call(ctx, what, x, shape, dtype, residual, _weight(shape[1], dtype).to(ctx.device))
    return problems


@pytest.mark.parametrize("world", [1, 2, 3, 4], ids=lambda w: f"{w}ranks")
def test_matches_torch(world):
    assert_no_problems(get_pool(world), _matches_body)


def _repeated_body(ctx):
    """The same heap buffers over several calls (the epochs), other collectives in between (the shared
    sync block), weight in another dtype than x."""
    me, w, problems = ctx.rank, ctx.world_size, []
    shape, dtype = (6, 100), torch.bfloat16
    x, residual = ctx.zeros(*shape, dtype=dtype), ctx.zeros(*shape, dtype=dtype)
    weight = _weight(shape[1], torch.float32).to(ctx.device)
    other = ctx.zeros(50)
    for salt in range(3):
        x.copy_(_data(me, shape, dtype, salt))
        residual.copy_(_data(-1, shape, dtype, salt))
        problems += _check_call(ctx, f"rank {me}/{w} call {salt}", x, shape, dtype, residual, weight, salt)
        other.fill_(1.0)
        ccl.all_reduce(ctx, other)
        if not torch.all(other.cpu() == w):
            problems.append(f"rank {me}/{w}: all_reduce between the calls went wrong")
    return problems


def test_repeated_calls_on_the_same_buffers():
    assert_no_problems(get_pool(2), _repeated_body)


def _placement_body(ctx):
    """Rank 0 passes x on the heap, the others plain tensors; then every rank a different heap tensor."""
    me, w, problems = ctx.rank, ctx.world_size, []
    shape, dtype = (5, 48), torch.float16
    heap_x = ctx.zeros(*shape, dtype=dtype)
    per_rank = [ctx.zeros(*shape, dtype=dtype) for _ in range(w)]  # every rank allocates all of them
    weight = _weight(shape[1], dtype).to(ctx.device)
    for case in ("rank 0 heap, others plain", "different heap tensors"):
        data = _data(me, shape, dtype)
        if case == "different heap tensors":
            for t in per_rank:
                t.fill_(-77)
            x = per_rank[me].copy_(data)
        else:
            x = heap_x.copy_(data) if me == 0 else data.to(ctx.device).clone()
        residual = _data(-1, shape, dtype).to(ctx.device)
        problems += _check_call(ctx, f"rank {me}/{w} {case}", x, shape, dtype, residual, weight)
    return problems


def test_ranks_place_x_differently():
    assert_no_problems(get_pool(3), _placement_body)


# -- fp8 output ------------------------------------------------------------------------------------------


def _fp8_body(ctx):
    """fp8 e4m3 output against torch's quantisation of the fp32 reference, with a float and a tensor scale."""
    me, w, problems = ctx.rank, ctx.world_size, []
    shape = (7, 160)
    for dtype, scale in ((torch.bfloat16, 0.01), (torch.float32, torch.tensor([0.004], device=ctx.device)),
                         (torch.float16, 1.0)):
        x = _data(me, shape, dtype).to(ctx.device)
        residual = _data(-1, shape, dtype).to(ctx.device)
        weight = _weight(shape[1], dtype).to(ctx.device)
        out, h = all_reduce_rmsnorm(ctx, x, weight, EPS, residual=residual, out_dtype=FP8, scale=scale)
        normed, h_want = _reference(w, shape, dtype, residual, weight)
        s = float(scale) if not isinstance(scale, torch.Tensor) else scale.item()
        problems += _fp8_problems(f"rank {me}/{w} fp8 {dtype} scale {s}", out, normed, s)
        problems += _diff(f"rank {me}/{w} fp8 {dtype} scale {s}: h", h, h_want, dtype)
    return problems


def _fp8_problems(what, out, normed, s):
    """What is wrong with an fp8 ``out`` against torch's quantisation of ``normed / s``."""
    want = (normed / s).clamp(-448, 448).to(FP8).float()
    got = out.cpu().float()
    if out.dtype != FP8:
        return [f"{what}: out is {out.dtype}"]
    # fp32 sums in another order may flip a rounding: at most one fp8 step (2**-3 relative), rarely
    step = torch.maximum(want.abs() * 2.0 ** -3, torch.tensor(2.0 ** -9))
    exact = (got == want).float().mean().item()
    if not torch.all((got - want).abs() <= step) or exact < 0.98:
        return [f"{what}: {exact:.3f} exact, max diff {(got - want).abs().max().item()}"]
    return []


def test_fp8_output():
    assert_no_problems(get_pool(2), _fp8_body)


# -- the small-call path ----------------------------------------------------------------------------------


def _cached_body(ctx):
    """Three calls on the same buffers with new data each time (x on the heap and plain, with and without
    a residual, fp8 with a tensor scale whose value changes): right results, one cache entry made by the
    first call and used by the next two, fresh outputs every call (earlier results stay as they were)."""
    me, w, problems = ctx.rank, ctx.world_size, []
    cache = ctx.call_cache
    shape, dtype = (5, 72), torch.bfloat16
    weight = _weight(shape[1], torch.float32).to(ctx.device)
    for heap in (True, False):
        for with_residual in (True, False):
            what = f"rank {me}/{w} heap={heap} residual={with_residual}"
            cache.clear()
            x = ctx.zeros(*shape, dtype=dtype) if heap else torch.zeros(shape, dtype=dtype, device=ctx.device)
            residual = torch.zeros(shape, dtype=dtype, device=ctx.device) if with_residual else None
            kept, entries = [], []
            for salt in range(3):
                x.copy_(_data(me, shape, dtype, salt))
                if residual is not None:
                    residual.copy_(_data(-1, shape, dtype, salt))
                out, h = all_reduce_rmsnorm(ctx, x, weight, EPS, residual=residual)
                was = None if residual is None else residual.clone()
                problems += _check_results(ctx, f"{what} call {salt}", out, h, shape, dtype, was, weight, salt)
                kept.append((out, h, was, salt))
                entries.append(cache.entries("all_reduce_rmsnorm"))
            if len(entries[0]) != 1 or any(e != entries[0] or e[0] is not entries[0][0] for e in entries):
                problems.append(f"{what}: cache entries after each call {entries}, expected the first call's only")
            for out, h, was, salt in kept:  # fresh tensors: later calls wrote none of them
                problems += _check_results(ctx, f"{what} kept {salt}", out, h, shape, dtype, was, weight, salt)
    # fp8 with a 1-element scale tensor: one entry; the kernel reads the scale's value at every call
    cache.clear()
    x, residual = torch.zeros(shape, dtype=dtype, device=ctx.device), torch.zeros(shape, dtype=dtype, device=ctx.device)
    scale = torch.zeros(1, device=ctx.device)
    for salt in range(3):
        x.copy_(_data(me, shape, dtype, salt))
        residual.copy_(_data(-1, shape, dtype, salt))
        scale.fill_(0.01 * (salt + 1))
        out, h = all_reduce_rmsnorm(ctx, x, weight, EPS, residual=residual, out_dtype=FP8, scale=scale)
        normed, h_want = _reference(w, shape, dtype, residual, weight, salt)
        problems += _fp8_problems(f"rank {me}/{w} fp8 call {salt}", out, normed, scale.item())
        problems += _diff(f"rank {me}/{w} fp8 call {salt}: h", h, h_want, dtype)
    kept = len(cache.entries("all_reduce_rmsnorm"))
    if kept != 1:
        problems.append(f"rank {me}/{w} fp8 tensor scale: {kept} cache entries after 3 calls, expected 1")
    # a float scale is part of the key: another value on the same buffers is another entry, not a stale one
    normed = _reference(w, shape, dtype, residual, weight, salt=2)[0]  # x and residual hold call 2's data
    for s in (0.01, 0.02, 0.01):
        out, h = all_reduce_rmsnorm(ctx, x, weight, EPS, residual=residual, out_dtype=FP8, scale=s)
        problems += _fp8_problems(f"rank {me}/{w} fp8 scale {s}", out, normed, s)
    kept = len(cache.entries("all_reduce_rmsnorm"))
    if kept != 3:
        problems.append(f"rank {me}/{w} fp8: {kept} cache entries, expected 3 (tensor scale, 0.01, 0.02)")
    return problems


def test_repeated_calls_take_the_small_call_path(pool2):
    assert_no_problems(pool2, _cached_body)


def _fill_before(ctx, offset):
    """Heap tensors over every free byte before heap offset ``offset``: the heap allocates first fit,
    so the next allocation lands at ``offset`` if that is free."""
    return [ctx.empty(min(size, offset - start), dtype=torch.uint8)
            for start, size in list(ctx._allocator._free) if start < offset]


def _moved_body(ctx):
    """A cache entry launches on the heap stage of plain x: once the stage grew (a call on a larger x), and
    once a heap_scope in which it grew ended, a call must stage into the new one and never write where the
    old one was (a user tensor lives there now)."""
    me, w, problems = ctx.rank, ctx.world_size, []
    shape, dtype = (4, 64), torch.float32
    x, residual = torch.zeros(shape, device=ctx.device), torch.zeros(shape, device=ctx.device)
    weight, big_weight = _weight(shape[1], dtype).to(ctx.device), _weight(32768, dtype).to(ctx.device)
    nbytes = x.numel() * 4

    def call(salt, what, x=x, residual=residual, weight=weight):
        x.copy_(_data(me, tuple(x.shape), dtype, salt))
        residual.copy_(_data(-1, tuple(x.shape), dtype, salt))
        return _check_call(ctx, f"rank {me}/{w} {what}", x, tuple(x.shape), dtype, residual, weight, salt)

    def stage():  # (heap offset, capacity in bytes) of the stage buffer now
        grower = workspace(ctx)._buffers[INPUT_STAGE]
        return ctx.heap_offset(grower.tensor), grower.tensor.numel()

    def bigger():  # plain x larger than the stage now: it grows (rows of 128 KiB keep the simulator quick)
        rows = stage()[1] // (32768 * 4) + 1
        return torch.zeros(rows, 32768, device=ctx.device), torch.zeros(rows, 32768, device=ctx.device), big_weight

    def pin_after_stage():
        # Every free byte before the stage's end taken, and a blocker right after it: the grown stage cannot
        # start where this one is (first fit would put it there, hiding a stale write in the new stage).
        offset, capacity = stage()
        pinned.extend(_fill_before(ctx, offset + capacity))
        pinned.append(ctx.empty(256, dtype=torch.uint8))
        return offset

    def user_at(offset):  # a user's heap tensor of 7.0 where a freed stage was
        pinned.extend(_fill_before(ctx, offset))
        pinned.append(ctx.full((nbytes // 4,), 7.0))
        if ctx.heap_offset(pinned[-1]) != offset:
            problems.append(f"rank {me}/{w}: the user tensor is at {ctx.heap_offset(pinned[-1])}, not at {offset}")
        return pinned[-1]

    problems += call(0, "first call")
    problems += call(1, "second call")  # a hit
    pinned = []
    old = pin_after_stage()
    problems += call(2, "larger x", *bigger())
    user = user_at(old)
    for salt in (3, 4):
        problems += call(salt, f"after the stage grew, call {salt}")
    if not torch.all(user == 7.0):
        problems.append(f"rank {me}/{w}: a call after the stage grew wrote into the freed stage")
    pin_after_stage()
    ctx.call_cache.clear()  # what follows tests the scope alone: call 6 makes the entry
    with ctx.heap_scope():
        problems += call(5, "larger x in a heap_scope", *bigger())
        problems += call(6, "in the heap_scope")  # an entry on the scope's stage
        inner = stage()[0]
    user = user_at(inner)
    for salt in (7, 8):
        problems += call(salt, f"after the heap_scope, call {salt}")
    if not torch.all(user == 7.0):
        problems.append(f"rank {me}/{w}: a call after the heap_scope wrote into the stage the scope freed")
    ctx.free(*pinned)
    return problems


def test_moved_stage_is_never_written(pool2):
    assert_no_problems(pool2, _moved_body)


def _debug_body(ctx):
    x = _data(ctx.rank, (3, 40), torch.float16).to(ctx.device)
    weight = _weight(40, torch.float16).to(ctx.device)
    problems = []
    for salt in range(2):
        problems += _check_call(ctx, f"debug call {salt}", x, (3, 40), torch.float16, None, weight)
    return problems, len(ctx.call_cache)


def test_the_debug_mode_keeps_no_entry(debug_pool):
    for problems, entries in debug_pool.run(_debug_body):
        assert not problems, problems
        assert entries == 0


# -- bad input ---------------------------------------------------------------------------------------------


def _refusals_body(ctx):
    me, dev, problems = ctx.rank, ctx.device, []
    x = torch.ones(4, 32, device=dev)
    wt = torch.ones(32, device=dev)
    calls = {
        "x 1-D": (lambda: all_reduce_rmsnorm(ctx, torch.ones(32, device=dev), wt), ["x", "dimensions"]),
        "x int": (lambda: all_reduce_rmsnorm(ctx, x.int(), wt), ["int32"]),
        "x meta": (lambda: all_reduce_rmsnorm(ctx, torch.ones(4, 32, device="meta"), wt), ["meta"]),
        "x not a tensor": (lambda: all_reduce_rmsnorm(ctx, [[1.0]], wt), ["tensor", "list"]),
        "x strided": (lambda: all_reduce_rmsnorm(ctx, torch.ones(32, 4, device=dev).t(), wt), ["contiguous"]),
        "weight size": (lambda: all_reduce_rmsnorm(ctx, x, torch.ones(33, device=dev)), ["weight", "33", "32"]),
        "weight 2-D": (lambda: all_reduce_rmsnorm(ctx, x, torch.ones(1, 32, device=dev)), ["weight"]),
        "residual shape": (lambda: all_reduce_rmsnorm(ctx, x, wt, residual=torch.ones(3, 32, device=dev)),
                           ["residual", r"\(3, 32\)", r"\(4, 32\)"]),
        "residual dtype": (lambda: all_reduce_rmsnorm(ctx, x, wt, residual=x.half()), ["residual", "float16"]),
        "out_dtype": (lambda: all_reduce_rmsnorm(ctx, x, wt, out_dtype=torch.float16), ["out_dtype"]),
        "out_dtype e5m2": (lambda: all_reduce_rmsnorm(ctx, x, wt, out_dtype=torch.float8_e5m2), ["out_dtype"]),
        "fp8 without scale": (lambda: all_reduce_rmsnorm(ctx, x, wt, out_dtype=FP8), ["scale"]),
        "scale without fp8": (lambda: all_reduce_rmsnorm(ctx, x, wt, scale=0.5), ["scale"]),
        "scale negative": (lambda: all_reduce_rmsnorm(ctx, x, wt, out_dtype=FP8, scale=-1.0), ["scale"]),
        "scale tensor dtype": (lambda: all_reduce_rmsnorm(ctx, x, wt, out_dtype=FP8,
                                                          scale=torch.ones(1, dtype=torch.float16, device=dev)),
                               ["scale", "float16"]),
        "scale tensor size": (lambda: all_reduce_rmsnorm(ctx, x, wt, out_dtype=FP8, scale=torch.ones(2, device=dev)),
                              ["scale"]),
        "eps": (lambda: all_reduce_rmsnorm(ctx, x, wt, eps=-1.0), ["eps"]),
    }
    messages = refusals({name: call for name, (call, _) in calls.items()})
    for name, (_, fragments) in calls.items():
        message = messages[name]
        for fragment in [f"rank {me}", "all_reduce_rmsnorm"] + fragments:
            if not re.search(fragment, message, re.IGNORECASE):
                problems.append(f"{name}: {fragment!r} not in {message!r}")
    # the ranks are still in step: a valid call works
    problems += _check_call(ctx, "after the refusals", _data(me, (3, 32), torch.float32).to(dev).clone(), (3, 32),
                            torch.float32, None, _weight(32, torch.float32).to(dev))
    return problems


def test_bad_input_is_refused(pool2):
    assert_no_problems(pool2, _refusals_body)



# -- sm_90 ------------------------------------------------------------------------------------------------

COMPILE_CHILD = r'''
import json
from tests.sm90_harness import outcome, with_ones
from trident.ops.rmsnorm.kernels import all_reduce_rmsnorm_kernel as kernel

COMMON = {"weight_ptr": "*bf16", "h_ptr": "*bf16", "scale_value": "fp32", "shape": ("i32", "i32"),
          "eps": "fp32", "sync_ptr": "*i64", "rank": "i32", "world_size": "i32", "heap_bases": "*i64",
          "ROUND_FP8_IN_FP32": "constexpr", "STAGE": "constexpr", "BLOCK_H": "constexpr", "WORLD_BLOCK": "constexpr"}
CASES = {  # name: (x and residual, out, residual given, scale: None, "value" or "tensor")
    "bf16 residual": ("*bf16", "*bf16", True, None),
    "fp16 no residual": ("*fp16", "*fp16", False, None),
    "fp8 scale tensor": ("*fp32", "*fp8e4nv", True, "tensor"),
    "fp8 scale value": ("*bf16", "*fp8e4nv", False, "value"),
}
results = {}
for name, (xt, ot, residual, scale) in CASES.items():
    for ones in (False, True):
        signature = {**COMMON, "src_ptr": xt, "x_ptr": xt, "out_ptr": ot,
                     "residual_ptr": xt if residual else "constexpr",
                     "scale_ptr": "*fp32" if scale == "tensor" else "constexpr"}
        constexprs = {"ROUND_FP8_IN_FP32": False, "STAGE": ones, "BLOCK_H": 4096, "WORLD_BLOCK": 8}  # both ways
        if not residual:
            constexprs["residual_ptr"] = None
        if scale != "tensor":
            constexprs["scale_ptr"] = None
        signature = {arg: signature[arg] for arg in kernel.arg_names}
        if ones:
            signature, constexprs = with_ones(signature, constexprs, ("rank", "world_size"))
            at = kernel.arg_names.index("shape")  # (tokens, hidden), both 1
            signature["shape"] = ("constexpr", "constexpr")
            constexprs.update({(at, 0): 1, (at, 1): 1})
        results[f"{name}{'-ones' if ones else ''}"] = outcome(kernel, signature, constexprs,
                                                              None if scale is None else "e4m3", num_warps=8)
print(json.dumps(results))
'''


@pytest.mark.sm90_child(COMPILE_CHILD)
def test_kernel_compiles_for_sm90(tmp_path):
    from tests.sm90_harness import assert_compiled

    assert_compiled(COMPILE_CHILD, tmp_path, 8)
