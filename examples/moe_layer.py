"""After the ladder: a mixture-of-experts layer, expert parallel, from moe_dispatch, a grouped GEMM and moe_combine.

Every rank holds its own tokens ``x`` [T, H] (T may differ between ranks), the router, and E/W of
the E experts (rank r owns experts r*E/W .. (r+1)*E/W - 1), each a SwiGLU MLP. One layer is

    probs    = softmax(x @ W_router); w, idx = topk(probs, K)       plain torch, this rank's tokens
    d        = moe_dispatch(ctx, x, idx, E, max_tokens_per_rank)   every (token, j) to expert idx[t, j]'s rank
    h        = grouped_gemm(d.recv_x, W_gate_up[e])                Triton, one expert's rows at a time
    act      = silu(gate) * up                                     plain torch, on every received row
    y        = grouped_gemm(act, W_down[e])                        Triton, its output on the heap
    out      = moe_combine(ctx, y, w, d)                           back home: sum over j of w[t, j] * y[(t, j)]

``y`` is made inside ``ctx.heap_allocations()``, so it lies on the symmetric heap and
``moe_combine`` reads each row where its expert wrote it, at its owner: one kernel, no staging.

The grouped GEMM reads ``d.recv_offsets`` and ``d.recv_counts`` on the device (a program per
local expert and column tile loops over that expert's rows), so nothing in the layer waits for
the host: with ``max_tokens_per_rank`` given, the whole layer could be captured in a CUDA graph.
The example checks every rank's output against the same layer run whole on one rank (all
experts, made from one seed on every rank; a real model loads its shards).

The same grouped GEMM takes either dispatch layout: ``contiguous`` (experts' rows one after
another) or ``masked`` (a fixed region of rows per local expert, as decode uses: no count
exchange), since it only reads each expert's offset and count.

    trident run -n 2 examples/moe_layer.py [tokens] [contiguous|masked]
"""

import sys

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

import trident
import trident.ops

HIDDEN, FFN, EXPERTS, TOP_K = 64, 32, 8, 2  # small enough for the CPU simulator; EXPERTS splits over 1, 2, 4, 8 ranks


@triton.jit
def grouped_gemm_kernel(a_ptr, b_ptr, c_ptr, offsets_ptr, counts_ptr, K, N,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """``C[rows of e] = A[rows of e] @ B[e]`` for local expert e = program_id(0); B is [E_local, K, N]."""
    e = tl.program_id(0)
    start, count = tl.load(offsets_ptr + e), tl.load(counts_ptr + e)  # on the device: no host sync
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    b_ptr += e.to(tl.int64) * K * N
    for m in range(0, count, BLOCK_M):
        rm = m + tl.arange(0, BLOCK_M)
        rows = (start + rm).to(tl.int64)
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k in range(0, K, BLOCK_K):
            a = tl.load(a_ptr + rows[:, None] * K + (k + rk)[None, :],
                        mask=(rm < count)[:, None] & (k + rk < K)[None, :], other=0.0)
            b = tl.load(b_ptr + (k + rk)[:, None] * N + rn[None, :],
                        mask=(k + rk < K)[:, None] & (rn < N)[None, :], other=0.0)
            acc += tl.dot(a, b)
        tl.store(c_ptr + rows[:, None] * N + rn[None, :], acc.to(c_ptr.dtype.element_ty),
                 mask=(rm < count)[:, None] & (rn < N)[None, :])


def grouped_gemm(a, weights, d):
    """``[capacity, N]``: each received row of ``a`` times its local expert's ``weights[e]`` ([E_local, K, N]).
    Rows of no expert are left unset (moe_combine ignores them)."""
    c = torch.empty(a.shape[0], weights.shape[2], device=a.device, dtype=a.dtype)
    grid = (d.num_local_experts, triton.cdiv(weights.shape[2], 32))
    grouped_gemm_kernel[grid](a, weights, c, d.recv_offsets, d.recv_counts, weights.shape[1], weights.shape[2],
                              BLOCK_M=16, BLOCK_N=32, BLOCK_K=32)
    return c


def weights(world_size, rank, dtype, device):
    """The whole layer (for the reference) and this rank's part: the router and its experts."""
    gen = torch.Generator().manual_seed(0)
    full = {"router": torch.randn(HIDDEN, EXPERTS, generator=gen) / HIDDEN ** 0.5,
            "gate_up": torch.randn(EXPERTS, HIDDEN, 2 * FFN, generator=gen) / HIDDEN ** 0.5,
            "down": torch.randn(EXPERTS, FFN, HIDDEN, generator=gen) / FFN ** 0.5}
    mine = slice(rank * EXPERTS // world_size, (rank + 1) * EXPERTS // world_size)
    shard = {"router": full["router"], "gate_up": full["gate_up"][mine], "down": full["down"][mine]}
    return full, {k: v.contiguous().to(device, dtype) for k, v in shard.items()}


def route(x, router):
    """Top-K experts of each token and their weights (softmax over the K, in fp32)."""
    w, idx = (x.float() @ router.float()).topk(TOP_K, dim=-1)
    return w.softmax(dim=-1), idx


def moe_layer(ctx, x, w, max_tokens, layout="contiguous"):
    """One rank's part of the layer (collective): its tokens ``x`` [T, H] in, their outputs [T, H] out."""
    weight, idx = route(x, w["router"])
    d = trident.ops.moe_dispatch(ctx, x, idx, EXPERTS, max_tokens_per_rank=max_tokens, layout=layout)
    gate, up = grouped_gemm(d.recv_x, w["gate_up"], d).chunk(2, dim=-1)
    act = (F.silu(gate.float()) * up.float()).to(x.dtype).contiguous()
    with ctx.heap_allocations():  # the expert outputs on the heap: the combine reads them where they lie
        y = grouped_gemm(act, w["down"], d)
    return trident.ops.moe_combine(ctx, y, weight, d)


def reference_layer(x, full, router):
    """The same layer, every expert on one rank (fp64), routed as the layer routes (``router`` in its dtype)."""
    f = {k: v.double() for k, v in full.items()}
    weight, idx = route(x, router)
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(TOP_K):
            gate, up = (x[t] @ f["gate_up"][idx[t, j]]).chunk(2)
            out[t] += weight[t, j].double() * ((F.silu(gate) * up) @ f["down"][idx[t, j]])
    return out


def main(tokens: str = "8", layout: str = "contiguous") -> None:
    with trident.init(heap_size=1 << 27) as ctx:
        w, r = ctx.world_size, ctx.rank
        if EXPERTS % w:
            raise SystemExit(f"this layer has {EXPERTS} experts: run it on 1, 2, 4 or 8 ranks, not {w}")
        T = int(tokens) + r  # ranks hold different numbers of tokens
        dtype = torch.float32 if ctx.platform.simulator else torch.bfloat16
        full, shard = weights(w, r, dtype, ctx.device)
        x = torch.randn(T, HIDDEN, generator=torch.Generator().manual_seed(1 + r))
        y = moe_layer(ctx, x.to(ctx.device, dtype), shard, max_tokens=int(tokens) + w - 1, layout=layout)
        want = reference_layer(x.to(dtype).double(), full, shard["router"].cpu())  # x rounded as the layer's
        err = float((y.cpu().double() - want).norm() / want.norm())
        ok = err < (1e-4 if dtype == torch.float32 else 3e-2)
        print(f"rank {r}: MoE layer ({layout}), {T} tokens, {EXPERTS} experts (top {TOP_K}) on {w} ranks: "
              f"relative error {err:.1e} ({'matches' if ok else 'WRONG'})")
        if not ok:
            raise SystemExit(f"rank {r}: relative error {err}")


if __name__ == "__main__":
    main(*sys.argv[1:])
