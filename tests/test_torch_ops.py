"""torch.ops.trident.*: functional custom ops keyed by a group name, traced by torch.compile (the ranks'
``trident.init`` registers them).

Pinned here: every op against a torch reference computed in the rank (inputs unchanged: the ops
are functional); a tensor-parallel MLP built from them compiles with ``fullgraph=True`` (no graph
break) and gives the eager result; an unknown group name is refused with what to pass instead.
"""

import pytest
import torch

TOL = 1e-4
#: The GEMMs' fp32 runs as TF32 on GPUs: their error relative to the largest reference element.
GEMM_TOL = 5e-3


def _data(rank, *shape, salt=0):
    g = torch.Generator().manual_seed(1000 * rank + salt)
    return torch.randn(*shape, generator=g)


def _every_op(ctx):
    w, r, g, dev = ctx.world_size, ctx.rank, ctx.group_name, ctx.device
    ops = torch.ops.trident
    every = [_data(p, 6, 8) for p in range(w)]
    mine = every[r].to(dev)
    before = mine.clone()
    errors = {}

    def check(name, got, want, relative=False):  # relative: to the largest reference element, for GEMMs
        if got.shape != want.shape:
            errors[name] = (f"shape {tuple(got.shape)}, expected {tuple(want.shape)}", TOL)
            return
        error = float((got.cpu().float() - want.float()).abs().max()) if want.numel() else 0.0
        errors[name] = (error / float(want.abs().max()), GEMM_TOL) if relative else (error, TOL)

    check("all_reduce", ops.all_reduce(mine, "sum", g), sum(every))
    check("all_reduce max", ops.all_reduce(mine, "max", g), torch.stack(every).amax(0))
    check("all_gather", ops.all_gather(mine, g), torch.cat(every))
    tall = [_data(p, 2 * w, 8, salt=1) for p in range(w)]
    check("reduce_scatter", ops.reduce_scatter(tall[r].to(dev), "sum", g), sum(tall)[2 * r:2 * r + 2])
    check("all_to_all", ops.all_to_all(tall[r].to(dev), g), torch.cat([t[2 * r:2 * r + 2] for t in tall]))
    check("broadcast", ops.broadcast(mine, w - 1, g), every[w - 1])
    # Rank p sends (p + q) % 3 rows to rank q (some none); each rank's rows differ in number.
    sends = [[(p + q) % 3 for q in range(w)] for p in range(w)]
    rows = [_data(p, sum(sends[p]), 8, salt=6) for p in range(w)]
    got = ops.all_to_all_v(rows[r].to(dev), [sends[p][r] for p in range(w)], sends[r], g)
    want = torch.cat([rows[p][sum(sends[p][:r]):sum(sends[p][:r + 1])] for p in range(w)])
    check("all_to_all_v", got, want)
    on_heap = ctx.empty(max(sum(s) for s in sends), 8)[:len(rows[r])].copy_(rows[r])  # read in place
    check("all_to_all_v on the heap", ops.all_to_all_v(on_heap, [sends[p][r] for p in range(w)], sends[r], g), want)
    # Mixed placement (rank 0 on the heap, the others plain): every rank runs the same collectives.
    mixed = on_heap if r == 0 else rows[r].to(dev)
    check("all_to_all_v mixed", ops.all_to_all_v(mixed, [sends[p][r] for p in range(w)], sends[r], g), want)
    # The last rank has nothing to send (a plain 0-row input), as MoE traffic often has.
    quiet = [[0 if p == w - 1 else (p + q) % 3 for q in range(w)] for p in range(w)]
    rows = [_data(p, sum(quiet[p]), 8, salt=7) for p in range(w)]
    got = ops.all_to_all_v(rows[r].to(dev), [quiet[p][r] for p in range(w)], quiet[r], g)
    check("all_to_all_v 0 rows", got, torch.cat([rows[p][sum(quiet[p][:r]):sum(quiet[p][:r + 1])] for p in range(w)]))
    y = mine.clone()
    ops.all_reduce_(y, "sum", g)  # in place
    check("all_reduce_", y, sum(every))
    z = ctx.empty(*mine.shape).copy_(mine)  # on the heap: used in place
    ops.broadcast_(z, w - 1, g)
    check("broadcast_", z, every[w - 1])
    A = [_data(p, 8, 16, salt=2) for p in range(w)]
    B = [_data(p, 16, 12, salt=3) for p in range(w)]
    full = sum(a @ b for a, b in zip(A, B, strict=True))
    check("gemm_all_reduce", ops.gemm_all_reduce(A[r].to(dev), B[r].to(dev), g), full, relative=True)
    check("gemm_reduce_scatter", ops.gemm_reduce_scatter(A[r].to(dev), B[r].to(dev), g),
          full[r * 8 // w:(r + 1) * 8 // w], relative=True)
    check("all_gather_gemm", ops.all_gather_gemm(A[r].to(dev), B[0].to(dev), g), torch.cat(A) @ B[0],
          relative=True)
    check("gemm_all_scatter", ops.gemm_all_scatter(A[0].to(dev), B[r].to(dev), g), A[0] @ torch.cat(B, dim=1),
          relative=True)
    weight = _data(0, 8, salt=4)
    residual = _data(r, 6, 8, salt=5)
    out, h = ops.all_reduce_rmsnorm(mine, weight.to(dev), 1e-6, residual.to(dev), g)
    want_h = sum(every) + residual
    check("all_reduce_rmsnorm h", h, want_h)
    check("all_reduce_rmsnorm out", out, want_h * torch.rsqrt(want_h.pow(2).mean(-1, keepdim=True) + 1e-6) * weight)
    # Any layout, as every other op: a strided weight and a transposed residual give the same result.
    strided_w = torch.stack([weight, weight], 1).to(dev)[:, 0]
    transposed_res = residual.t().contiguous().to(dev).t()
    out2, h2 = ops.all_reduce_rmsnorm(mine, strided_w, 1e-6, transposed_res, g)
    check("all_reduce_rmsnorm h, non-contiguous", h2, want_h)
    check("all_reduce_rmsnorm out, non-contiguous", out2, out.cpu())
    errors["input unchanged"] = (float((mine - before).abs().max()), TOL)
    return errors


def test_every_op_matches_torch_and_changes_no_input(pool2):
    for errors in pool2.run(_every_op):
        bad = {name: (err, tol) for name, (err, tol) in errors.items() if not err < tol}
        assert not bad, bad


def _mlp(x, w_up, w_down, group: str):
    """A tensor-parallel MLP: column-parallel up projection, SiLU, row-parallel down projection
    (its partial sums all-reduced twice over: once fused with the GEMM, once as a collective)."""
    h = torch.nn.functional.silu(x @ w_up)
    y = torch.ops.trident.gemm_all_reduce(h, w_down, group)
    z = torch.ops.trident.all_reduce(torch.nn.functional.silu(y) @ w_down.t(), "sum", group)
    return torch.ops.trident.all_gather(z, group)


def _compiled_mlp(ctx):
    torch._dynamo.reset()
    x = _data(0, 4, 16).to(ctx.device)
    w_up = _data(ctx.rank, 16, 8, salt=1).to(ctx.device)
    w_down = _data(ctx.rank, 8, 16, salt=2).to(ctx.device)
    eager = _mlp(x, w_up, w_down, ctx.group_name)
    compiled = torch.compile(_mlp, fullgraph=True, backend="aot_eager")  # fullgraph: a graph break raises
    first = compiled(x, w_up, w_down, ctx.group_name)
    again = compiled(x, w_up, w_down, ctx.group_name)
    return float((first - eager).abs().max()), float((again - eager).abs().max()), tuple(first.shape)


def test_a_tensor_parallel_mlp_compiles_with_fullgraph_and_matches_eager(pool2):
    for first, again, shape in pool2.run(_compiled_mlp):
        assert first < TOL and again < TOL
        assert shape == (2 * 4, 8)  # every rank's 4 tokens, 8 features


#: How to call each op for its torch.compile case: ``fn(ctx, group) -> (op, args)``. Every op of
#: ``trident.torch_ops.SCHEMAS`` has one, or a row in COMPILED_ELSEWHERE (tests/test_registry.py).
def _compile_calls(ctx, g):
    dev, w = ctx.device, ctx.world_size
    x, tall = _data(ctx.rank, 6, 8).to(dev), _data(ctx.rank, 2 * w, 8, salt=1).to(dev)
    A, B = _data(ctx.rank, 8, 16, salt=2).to(dev), _data(ctx.rank, 16, 12, salt=3).to(dev)
    sends = [(ctx.rank + q) % 3 for q in range(w)]
    rows = _data(ctx.rank, sum(sends), 8, salt=6).to(dev)
    return {
        "all_reduce": (x, "sum", g), "all_reduce_": (ctx.empty(6, 8).copy_(x), "sum", g), "all_gather": (x, g),
        "reduce_scatter": (tall, "sum", g), "all_to_all": (tall, g), "broadcast": (x, 0, g),
        "broadcast_": (ctx.empty(6, 8).copy_(x), w - 1, g),
        "all_to_all_v": (rows, [(p + ctx.rank) % 3 for p in range(w)], sends, g),
        "gemm_all_reduce": (A, B, g), "gemm_reduce_scatter": (A, B, g), "all_gather_gemm": (A, B, g),
        "gemm_all_scatter": (A, B, g), "all_reduce_rmsnorm": (x, torch.ones(8, device=dev), 1e-6, x, g),
    }


#: Ops whose torch.compile case is a test of its own.
COMPILED_ELSEWHERE = {"moe_dispatch": "test_moe_dispatch_and_combine_as_custom_ops_match_torch_and_compile",
                      "moe_combine": "test_moe_dispatch_and_combine_as_custom_ops_match_torch_and_compile"}


def _compile_every_op(ctx):
    errors = {}
    for name, args in _compile_calls(ctx, ctx.group_name).items():
        op = getattr(torch.ops.trident, name)
        torch._dynamo.reset()

        def call(*a, op=op, inplace=name.endswith("_")):
            if inplace:  # the mutating op: the result is its first argument
                op(*a)
                return a[0]
            return op(*a)

        eager_args = [a.clone() if isinstance(a, torch.Tensor) and name.endswith("_") else a for a in args]
        eager = call(*eager_args)
        compiled = torch.compile(call, fullgraph=True, backend="aot_eager")(*args)
        flat = (lambda r: list(r) if isinstance(r, (tuple, list)) else [r])
        errors[name] = max(float((c.cpu().float() - e.cpu().float()).abs().max())
                           for c, e in zip(flat(compiled), flat(eager), strict=True))
    return errors


def test_every_op_compiles_with_fullgraph_and_matches_eager(pool2):
    from trident.torch_ops import SCHEMAS

    for errors in pool2.run(_compile_every_op):
        covered = set(errors) | set(COMPILED_ELSEWHERE)
        assert covered == set(SCHEMAS), f"ops without a compile case: {set(SCHEMAS) - covered}"
        bad = {n: e for n, e in errors.items() if not e < GEMM_TOL}
        assert not bad, bad


def _unknown_group(ctx):
    with pytest.raises(ValueError, match="pass ctx.group_name"):
        torch.ops.trident.all_reduce(torch.ones(4, device=ctx.device), "sum", "no-such-group")
    return ctx.group_name


def test_an_unknown_group_name_is_refused_and_every_rank_shares_the_name(pool2):
    names = pool2.run(_unknown_group)
    assert len(set(names)) == 1 and names[0].startswith("trident-")


def _moe_layer(x, topk_idx, topk_weights, num_experts: int, max_tokens: int, group: str):
    """Dispatch, an "expert" that doubles its rows, combine: every token ends as 2 x sum of its weights x x."""
    recv_x, offsets, counts, recv_src, scales, handle = torch.ops.trident.moe_dispatch(
        x, topk_idx, num_experts, max_tokens, None, group)
    return torch.ops.trident.moe_combine(2 * recv_x, topk_weights, topk_idx, recv_src, handle, num_experts,
                                         max_tokens, group)


def _routing(p, experts, k):
    """Rank p's tokens (3 + 2p: T differs between ranks), routing (-1 entries too) and weights."""
    g = torch.Generator().manual_seed(p)
    tokens = 3 + 2 * p
    return (_data(p, tokens, 8, salt=7), torch.randint(-1, experts, (tokens, k), generator=g),
            torch.rand(tokens, k, generator=g))


def _moe_ops(ctx):
    torch._dynamo.reset()
    r, w, experts, k, max_tokens = ctx.rank, ctx.world_size, 4, 2, 5
    every = [_routing(p, experts, k) for p in range(w)]
    x, topk_idx, topk_weights = every[r]
    want = 2 * x * (topk_weights * (topk_idx >= 0)).sum(1, keepdim=True)
    args = (x.to(ctx.device), topk_idx.to(ctx.device), topk_weights.to(ctx.device), experts, max_tokens,
            ctx.group_name)
    # The received rows themselves: one per (token, choice) routed to one of my experts, from any rank.
    recv_x, offsets, counts, recv_src, scales, handle = torch.ops.trident.moe_dispatch(
        args[0], args[1], experts, max_tokens, None, ctx.group_name)
    received = int(counts.sum())
    routed_here = sum(int(((idx >= 0) & (idx // (experts // w) == r)).sum()) for _, idx, _ in every)
    errors = {"received rows": (abs(received - routed_here), 0.5), "no scales": (float(scales.shape[1]), 0.5)}
    sent = [every[int(s) // max_tokens][0][int(s) % max_tokens] for s in recv_src[:received].cpu()]
    if sent:
        errors["rows match their source"] = (float((recv_x[:received].cpu() - torch.stack(sent)).abs().max()), TOL)
    eager = _moe_layer(*args)
    errors["eager"] = (float((eager.cpu() - want).abs().max()), TOL)
    # One expert per rank (E/W = 1 < k): the fake's capacity is the real one's, W * max_tokens * k.
    from torch._subclasses.fake_tensor import FakeTensorMode

    two = args[1] % 2
    real = torch.ops.trident.moe_dispatch(args[0], two, 2, max_tokens, None, ctx.group_name)[0]
    mode = FakeTensorMode()
    x_fake, idx_fake = mode.from_tensor(args[0]), mode.from_tensor(two)
    with mode:
        fake = torch.ops.trident.moe_dispatch(x_fake, idx_fake, 2, max_tokens, None, ctx.group_name)[0]
    errors["fake capacity"] = (float(abs(fake.shape[0] - real.shape[0])) + float(real.shape[0] != w * max_tokens * k),
                               0.5)
    compiled = torch.compile(_moe_layer, fullgraph=True, backend="aot_eager")(*args)
    errors["compiled"] = (float((compiled.cpu() - want).abs().max()), TOL)
    # quantize="fp8": bf16 rows arrive as fp8 with a scale per 128 columns; the fake says so too.
    every_128 = [torch.randn(3 + 2 * p, 128, generator=torch.Generator().manual_seed(p)).to(torch.bfloat16)
                 for p in range(w)]  # every rank's rows, as _routing sizes them
    x128 = every_128[r]
    x128 = x128.to(ctx.device)
    q = torch.ops.trident.moe_dispatch(x128, args[1], experts, max_tokens, None, ctx.group_name, "fp8")
    with mode:
        q_fake = torch.ops.trident.moe_dispatch(mode.from_tensor(x128), mode.from_tensor(args[1]), experts,
                                                max_tokens, None, ctx.group_name, "fp8")
    shapes = [(t.dtype, tuple(t.shape)) for t in (q[0], q[4])]
    errors["quantized rows and scales"] = (float(shapes != [(torch.float8_e4m3fn, (w * max_tokens * k, 128)),
                                                            (torch.float32, (w * max_tokens * k, 1))]), 0.5)
    errors["quantized fake"] = (float(shapes != [(t.dtype, tuple(t.shape)) for t in (q_fake[0], q_fake[4])]), 0.5)
    rows = int(q[2].sum())
    if rows:  # the documented quantization of each source row: scale = max(amax, 1e-4) / 448, x / scale
        sent = torch.stack([every_128[int(s) // max_tokens][int(s) % max_tokens] for s in q[3][:rows].cpu()]).float()
        scale = sent.abs().amax(1, keepdim=True).clamp(min=1e-4) / 448.0
        bits_differ = q[0][:rows].cpu().view(torch.uint8) != (sent / scale).to(torch.float8_e4m3fn).view(torch.uint8)
        wrong = float(bits_differ.sum()) + float((q[4][:rows].cpu() != scale).sum())
        errors["quantized rows match their source"] = (wrong, 0.5)
    return errors


def test_moe_dispatch_and_combine_as_custom_ops_match_torch_and_compile(pool2):
    for errors in pool2.run(_moe_ops):
        bad = {name: (err, tol) for name, (err, tol) in errors.items() if not err < tol}
        assert not bad, bad
