"""Heap creation functions (ctx.zeros, ctx.rand, ctx.full_like, ...) against their torch twins.

Every check runs inside the rank processes of the session pools; the rank functions return the
heap offsets of what they made, and the tests compare them across ranks (symmetry).
"""

import pytest
import torch

import trident
from trident import layout

# -- helpers run inside the ranks ---------------------------------------------------------------


def _offset(ctx, t):
    return t.data_ptr() - ctx.heap_bases_host[ctx.rank]


def _same(got, want, what):
    """``got`` is a heap tensor equal to ``want`` in shape, dtype, strides and values."""
    assert isinstance(got, torch.Tensor), f"{what}: got a {type(got).__name__}"
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    assert got.stride() == want.stride(), f"{what}: stride {got.stride()} != {want.stride()}"
    assert torch.equal(got, want.to(got.device)), f"{what}: values differ:\n{got}\n{want}"


def _gen(seed, device="cpu"):
    return torch.Generator(device).manual_seed(seed)


# -- creation from sizes -------------------------------------------------------------------------


def _creation_body(ctx):
    made = []  # (label, tensor) of every creation, in order

    def check(label, got, want, exact_values=True):
        assert ctx.is_symmetric(got), f"{label}: not on the heap"
        if exact_values:
            _same(got, want, label)
        else:  # empty: only shape, dtype and strides are defined
            assert (got.shape, got.dtype, got.stride()) == (want.shape, want.dtype, want.stride()), label
        made.append((label, got))

    check("zeros varargs", ctx.zeros(2, 3), torch.zeros(2, 3))
    check("zeros tuple", ctx.zeros((2, 3), dtype=torch.int32), torch.zeros((2, 3), dtype=torch.int32))
    check("zeros list", ctx.zeros([4]), torch.zeros([4]))
    check("zeros Size", ctx.zeros(torch.Size([3, 1, 2])), torch.zeros(3, 1, 2))
    check("zeros 0-dim", ctx.zeros(()), torch.zeros(()))
    check("ones varargs f16", ctx.ones(3, 4, dtype=torch.float16), torch.ones(3, 4, dtype=torch.float16))
    check("ones tuple bool", ctx.ones((5,), dtype=torch.bool), torch.ones((5,), dtype=torch.bool))
    check("ones int64", ctx.ones(2, 2, dtype=torch.int64), torch.ones(2, 2, dtype=torch.int64))
    check("empty varargs", ctx.empty(7, 3), torch.empty(7, 3), exact_values=False)
    check("empty tuple bf16", ctx.empty((4, 5), dtype=torch.bfloat16), torch.empty((4, 5), dtype=torch.bfloat16),
          exact_values=False)
    check("empty channels_last", ctx.empty(2, 3, 4, 5, memory_format=torch.channels_last),
          torch.empty(2, 3, 4, 5, memory_format=torch.channels_last), exact_values=False)

    # full: torch's dtype inference from the fill value
    for fill in (7, 2.5, True, -1, 1 + 2j):
        want = torch.full((2, 3), fill)
        check(f"full {fill!r}", ctx.full((2, 3), fill), want)
    assert ctx.full((1,), 7).dtype == torch.int64
    assert ctx.full((1,), 2.5).dtype == torch.get_default_dtype()
    assert ctx.full((1,), True).dtype == torch.bool
    check("full dtype override", ctx.full([4], 3, dtype=torch.float64), torch.full([4], 3, dtype=torch.float64))
    check("full int into float32", ctx.full((3,), 5, dtype=torch.float32), torch.full((3,), 5, dtype=torch.float32))

    # arange: 1, 2 and 3 positional arguments, int and float
    for args in [(5,), (2, 9), (1, 10, 3), (10, 0, -3), (5.0,), (0, 1, 0.25), (-1.5, 2.0), (0.5, 3, 0.7)]:
        check(f"arange{args}", ctx.arange(*args), torch.arange(*args))
    check("arange dtype", ctx.arange(-3, 3, dtype=torch.float64), torch.arange(-3, 3, dtype=torch.float64))
    check("arange int dtype", ctx.arange(0, 20, 4, dtype=torch.int16), torch.arange(0, 20, 4, dtype=torch.int16))
    assert ctx.arange(4).dtype == torch.int64 and ctx.arange(4.0).dtype == torch.float32

    # linspace
    for args, kwargs in [((0, 1, 5), {}), ((-2, 2, 9), {"dtype": torch.float64}), ((0, 10, 6), {"dtype": torch.int64}),
                         ((3, 3, 1), {}), ((1.0, 0.0), {"steps": 4})]:
        check(f"linspace{args}{kwargs}", ctx.linspace(*args, **kwargs), torch.linspace(*args, **kwargs))

    # rand / randn / randint with identically seeded generators: exactly torch's numbers
    dev = ctx.device
    for i, dtype in enumerate([torch.float32, torch.float64, torch.float16, torch.bfloat16]):
        g, ref = _gen(100 + i, dev), _gen(100 + i, dev)
        check(f"rand {dtype}", ctx.rand(5, 7, generator=g, dtype=dtype),
              torch.rand(5, 7, generator=ref, dtype=dtype, device=dev))
        check(f"rand tuple {dtype}", ctx.rand((3, 2), generator=g, dtype=dtype),
              torch.rand((3, 2), generator=ref, dtype=dtype, device=dev))
        check(f"randn {dtype}", ctx.randn(33, generator=g, dtype=dtype),
              torch.randn(33, generator=ref, dtype=dtype, device=dev))
        check(f"randn tuple {dtype}", ctx.randn((2, 17), generator=g, dtype=dtype),
              torch.randn((2, 17), generator=ref, dtype=dtype, device=dev))
        # the generators advanced by the same amount
        assert torch.equal(torch.rand(8, generator=g, device=dev), torch.rand(8, generator=ref, device=dev)), dtype
    g, ref = _gen(7, dev), _gen(7, dev)
    check("randint (high, size)", ctx.randint(9, (4, 10), generator=g),
          torch.randint(9, (4, 10), generator=ref, device=dev))
    check("randint (low, high, size)", ctx.randint(-5, 9, (40,), generator=g),
          torch.randint(-5, 9, (40,), generator=ref, device=dev))
    check("randint int16", ctx.randint(3, 1000, (6, 6), generator=g, dtype=torch.int16),
          torch.randint(3, 1000, (6, 6), generator=ref, dtype=torch.int16, device=dev))
    check("randint float32", ctx.randint(0, 2, (9,), generator=g, dtype=torch.float32),
          torch.randint(0, 2, (9,), generator=ref, dtype=torch.float32, device=dev))
    assert torch.equal(torch.randint(100, (5,), generator=g, device=dev),
                       torch.randint(100, (5,), generator=ref, device=dev))
    # the default generator too
    torch.manual_seed(1234)
    heap = ctx.randn(6, 4)
    torch.manual_seed(1234)
    check("randn default generator", heap, torch.randn(6, 4, device=dev))

    offsets = [(label, _offset(ctx, t)) for label, t in made]
    # every creation got its own block, aligned, after the control block
    starts = [off for _, off in offsets]
    assert len(set(starts)) == len(starts), "two creations share a heap offset"
    assert all(off >= layout.CONTROL_BYTES and off % layout.ALLOC_ALIGN == 0 for off in starts), offsets
    return offsets


def test_creation_matches_torch_and_is_symmetric(pool):
    results = pool.run(_creation_body)
    assert len(results) == pool.world_size
    assert all(r == results[0] for r in results), "heap offsets differ between ranks"
    assert len(results[0]) > 50


# -- *_like, as_symmetric --------------------------------------------------------------------------


def _like_body(ctx):
    made = []
    base = ctx.arange(12.0).reshape(3, 4)
    transposed = base.t()  # strides (1, 4): not contiguous
    assert transposed.stride() == (1, 4)
    cpu_t = torch.arange(6, dtype=torch.int32).reshape(2, 3).t()
    for name, src in [("heap", base), ("heap transposed", transposed), ("cpu transposed", cpu_t)]:
        cases = [
            ("zeros_like", ctx.zeros_like(src), torch.zeros_like(src)),
            ("ones_like", ctx.ones_like(src), torch.ones_like(src)),
            ("full_like", ctx.full_like(src, 7), torch.full_like(src, 7)),
            ("zeros_like f64", ctx.zeros_like(src, dtype=torch.float64), torch.zeros_like(src, dtype=torch.float64)),
            ("ones_like i8", ctx.ones_like(src, dtype=torch.int8), torch.ones_like(src, dtype=torch.int8)),
            ("full_like i32", ctx.full_like(src, -3, dtype=torch.int32), torch.full_like(src, -3, dtype=torch.int32)),
            ("full_like bool", ctx.full_like(src, True, dtype=torch.bool),
             torch.full_like(src, True, dtype=torch.bool)),
            ("zeros_like contiguous", ctx.zeros_like(src, memory_format=torch.contiguous_format),
             torch.zeros_like(src, memory_format=torch.contiguous_format)),
        ]
        for label, got, want in cases:
            assert ctx.is_symmetric(got), f"{name} {label}"
            _same(got, want, f"{name} {label}")
            made.append(got)
        for kwargs in ({}, {"dtype": torch.float16}, {"memory_format": torch.contiguous_format}):
            got, want = ctx.empty_like(src, **kwargs), torch.empty_like(src, **kwargs)
            assert (got.shape, got.dtype, got.stride()) == (want.shape, want.dtype, want.stride()), (name, kwargs)
            assert ctx.is_symmetric(got)
            made.append(got)
    # memory_format=preserve (the default) keeps the transposed strides
    assert ctx.empty_like(transposed).stride() == (1, 4)
    assert ctx.full_like(transposed, 1.5).stride() == (1, 4)
    assert ctx.ones_like(cpu_t).stride() == cpu_t.stride() == (1, 3)

    # as_symmetric: a copy of a CPU tensor, with its own memory
    cpu = torch.randn(4, 6, generator=_gen(5))
    sym = ctx.as_symmetric(cpu)
    assert ctx.is_symmetric(sym) and not ctx.is_symmetric(cpu)
    _same(sym, cpu, "as_symmetric")
    cpu.add_(1.0)
    assert not torch.equal(sym.cpu(), cpu), "as_symmetric shares memory with its input"
    sym_t = ctx.as_symmetric(cpu_t)
    _same(sym_t, cpu_t, "as_symmetric transposed")
    with_grad = torch.ones(3, requires_grad=True)
    sym_g = ctx.as_symmetric(with_grad)
    _same(sym_g.detach(), torch.ones(3), "as_symmetric of a tensor that requires grad")
    made += [sym, sym_t, sym_g]
    with pytest.raises(trident.NotSymmetricError):
        ctx.as_symmetric([1.0, 2.0])
    with pytest.raises(TypeError):
        ctx.zeros_like([1.0, 2.0])
    return [_offset(ctx, t) for t in made]


def test_like_functions_and_as_symmetric(pool2):
    results = pool2.run(_like_body)
    assert results[0] == results[1]
    assert len(set(results[0])) == len(results[0])


# -- is_symmetric, requires_grad, out= ----------------------------------------------------------


def _is_symmetric_body(ctx):
    t = ctx.arange(16.0)
    m = ctx.zeros(4, 4)
    views = {"t": t, "t[1:3]": t[1:3], "t.view(4,4)": t.view(4, 4), "t[::3]": t[::3], "m.t()": m.t(),
             "m[2]": m[2], "m[:, 1]": m[:, 1], "t[-1]": t[-1], "t.view(int32)": t.view(torch.int32)}
    computed = {"t + 1": t + 1, "t.clone()": t.clone(), "m @ m": m @ m, "torch.zeros(4)": torch.zeros(4),
                "t.contiguous() of m.t()": m.t().contiguous(), "sum": t.sum()}
    return ({k: ctx.is_symmetric(v) for k, v in views.items()},
            {k: ctx.is_symmetric(v) for k, v in computed.items()},
            [ctx.is_symmetric(x) for x in (None, 3, [1.0], t.tolist())])


def test_is_symmetric(pool2):
    for on_heap, off_heap, non_tensors in pool2.run(_is_symmetric_body):
        assert on_heap == dict.fromkeys(on_heap, True)
        assert off_heap == dict.fromkeys(off_heap, False)
        assert non_tensors == [False] * 4


def _requires_grad_body(ctx):
    results = {}
    for name, make in [("zeros", lambda: ctx.zeros(3, requires_grad=True)),
                       ("ones", lambda: ctx.ones((3,), requires_grad=True)),
                       ("full", lambda: ctx.full((3,), 2.0, requires_grad=True)),
                       ("rand", lambda: ctx.rand(3, requires_grad=True)),
                       ("arange", lambda: ctx.arange(3.0, requires_grad=True)),
                       ("zeros_like", lambda: ctx.zeros_like(torch.ones(3), requires_grad=True))]:
        t = make()
        (t * torch.tensor([1.0, 2.0, 3.0], device=t.device)).sum().backward()
        results[name] = (t.requires_grad, t.is_leaf, ctx.is_symmetric(t), t.grad.tolist())
    results["default"] = ctx.zeros(3).requires_grad
    return results


def test_requires_grad(pool2):
    for r in pool2.run(_requires_grad_body):
        assert r.pop("default") is False
        for name, value in r.items():
            assert value == (True, True, True, [1.0, 2.0, 3.0]), name


def _out_body(ctx):
    dev = ctx.device
    before = ctx.memory_stats()["num_allocations"]
    t = ctx.full((4,), 9.0)
    ints = ctx.full((2, 3), 9, dtype=torch.int64)
    ptr = t.data_ptr()
    results = []
    for label, call, want in [
        ("zeros", lambda: ctx.zeros(4, out=t), torch.zeros(4)),
        ("ones", lambda: ctx.ones(4, out=t), torch.ones(4)),
        ("full", lambda: ctx.full((4,), -2.5, out=t), torch.full((4,), -2.5)),
        ("arange", lambda: ctx.arange(0.0, 2.0, 0.5, out=t), torch.arange(0.0, 2.0, 0.5)),
        ("linspace", lambda: ctx.linspace(0, 3, 4, out=t), torch.linspace(0, 3, 4)),
        ("rand", lambda: ctx.rand(4, generator=_gen(3, dev), out=t), torch.rand(4, generator=_gen(3, dev), device=dev)),
        ("randn", lambda: ctx.randn(4, generator=_gen(4, dev), out=t),
         torch.randn(4, generator=_gen(4, dev), device=dev)),
        ("empty", lambda: ctx.empty(4, out=t), None),
        ("randint", lambda: ctx.randint(5, (2, 3), generator=_gen(6, dev), out=ints),
         torch.randint(5, (2, 3), generator=_gen(6, dev), device=dev)),
        ("zeros ints", lambda: ctx.zeros(2, 3, dtype=torch.int64, out=ints), torch.zeros(2, 3, dtype=torch.int64)),
    ]:
        got = call()
        assert got is t or got is ints, f"{label}: out= did not return the out tensor"
        if want is not None:
            _same(got, want, f"out= {label}")
        results.append(label)
    assert t.data_ptr() == ptr
    # out= never allocates
    assert ctx.memory_stats()["num_allocations"] == before + 2
    return results


def test_out_with_heap_tensor(pool2):
    results = pool2.run(_out_body)
    assert results[0] == results[1] and len(results[0]) == 10


# -- errors ----------------------------------------------------------------------------------------


def _errors_body(ctx):
    stats = ctx.memory_stats()
    heap = ctx.zeros(4)
    allocated = ctx.memory_stats()["num_allocations"]
    messages = {}
    other = "meta" if ctx.device.type != "meta" else "cpu"
    wrong_type = "cuda" if ctx.device.type == "cpu" else "cpu"
    for name, call in [
        ("zeros", lambda d: ctx.zeros(4, device=d)),
        ("ones", lambda d: ctx.ones(2, 2, device=d)),
        ("empty", lambda d: ctx.empty(3, device=d)),
        ("full", lambda d: ctx.full((3,), 1.0, device=d)),
        ("arange", lambda d: ctx.arange(5, device=d)),
        ("linspace", lambda d: ctx.linspace(0, 1, 3, device=d)),
        ("rand", lambda d: ctx.rand(3, device=d)),
        ("randn", lambda d: ctx.randn(3, device=d)),
        ("randint", lambda d: ctx.randint(3, (3,), device=d)),
        ("zeros_like", lambda d: ctx.zeros_like(heap, device=d)),
        ("empty_like", lambda d: ctx.empty_like(heap, device=d)),
        ("full_like", lambda d: ctx.full_like(heap, 2, device=d)),
    ]:
        for device in (wrong_type, other, torch.device(wrong_type)):
            with pytest.raises(ValueError) as info:
                call(device)
            assert str(ctx.device) in str(info.value), str(info.value)
            assert f"ctx.{name}" in str(info.value), str(info.value)
            messages[name] = str(info.value)
    for call in (lambda: ctx.empty(3, pin_memory=True), lambda: ctx.rand(3, pin_memory=True),
                 lambda: ctx.randn(3, pin_memory=True)):
        with pytest.raises(ValueError, match="pin_memory"):
            call()
    plain = torch.zeros(4)
    for call in (lambda: ctx.zeros(4, out=plain), lambda: ctx.ones(4, out=plain),
                 lambda: ctx.full((4,), 1.0, out=plain), lambda: ctx.arange(4.0, out=plain),
                 lambda: ctx.rand(4, out=plain), lambda: ctx.empty(4, out=plain),
                 lambda: ctx.zeros(4, out=heap + 1)):
        with pytest.raises(trident.NotSymmetricError, match="symmetric"):
            call()
    # out= of the wrong shape or dtype: heap tensors cannot be resized
    with pytest.raises(ValueError, match="cannot be resized"):
        ctx.zeros(5, out=heap)
    with pytest.raises(ValueError, match="cannot be resized"):
        ctx.zeros(4, dtype=torch.float64, out=heap)
    assert torch.equal(plain, torch.zeros(4))
    # failed calls allocated nothing
    assert ctx.memory_stats()["num_allocations"] == allocated == stats["num_allocations"] + 1
    ctx.barrier()  # and the ranks are still in step
    return messages


def test_creation_errors(pool2):
    results = pool2.run(_errors_body)
    for rank, messages in enumerate(results):
        assert len(messages) == 12
        assert all(m.startswith(f"rank {rank}:") for m in messages.values()), messages


# -- zero-element tensors ---------------------------------------------------------------------------


def _zero_element_body(ctx):
    before = ctx.memory_stats()["num_allocations"]
    out = {}
    for label, t, want in [("zeros(0)", ctx.zeros(0), torch.zeros(0)),
                           ("empty(0, 3)", ctx.empty(0, 3), torch.empty(0, 3)),
                           ("ones((2, 0))", ctx.ones((2, 0)), torch.ones((2, 0))),
                           ("arange(0)", ctx.arange(0), torch.arange(0)),
                           ("rand(0)", ctx.rand(0), torch.rand(0))]:
        shape_ok = (t.shape, t.dtype, t.stride()) == (want.shape, want.dtype, want.stride())
        symmetric = ctx.is_symmetric(t)
        try:
            ctx.free(t)
            freed = "ok"
        except Exception as exc:  # reported to the test, which asserts
            freed = f"{type(exc).__name__}: {exc}"
        out[label] = (shape_ok, symmetric, freed)
    out["leaked allocations"] = ctx.memory_stats()["num_allocations"] - before
    return out


def test_zero_element_tensors(pool2):
    """A zero-element tensor from a creation function is a heap tensor like any other: symmetric, freeable."""
    for r in pool2.run(_zero_element_body):
        leaked = r.pop("leaked allocations")
        for label, (shape_ok, symmetric, freed) in r.items():
            assert shape_ok, label
            assert symmetric, f"ctx.is_symmetric({label}) is False"
            assert freed == "ok", f"ctx.free({label}) failed: {freed}"
        assert leaked == 0


def _zero_dim_random_body(ctx):
    out = {}
    dev = ctx.device
    for label, call, want in [("rand(())", lambda g: ctx.rand((), generator=g),
                               lambda g: torch.rand((), generator=g, device=dev)),
                              ("randn(())", lambda g: ctx.randn((), generator=g),
                               lambda g: torch.randn((), generator=g, device=dev)),
                              ("randint(5, ())", lambda g: ctx.randint(5, (), generator=g),
                               lambda g: torch.randint(5, (), generator=g, device=dev))]:
        try:
            got = call(_gen(11, ctx.device))
            out[label] = (tuple(got.shape), got.item() == want(_gen(11, ctx.device)).item())
        except Exception as exc:
            out[label] = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
    return out


def test_zero_dim_random_tensors(pool2):
    """torch.rand(()) makes a 0-dim tensor; ctx.rand(()) must too."""
    for r in pool2.run(_zero_dim_random_body):
        assert r == dict.fromkeys(r, ((), True)), r
