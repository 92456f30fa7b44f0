"""How much a repeated call's cache lookup costs, torch's C layout check against the key alone (issue 29).

Each entry's host time per call, measured twice in one process, rounds alternating: with
``CallCache.lookup`` as it is (the C check of the layouts last used, :mod:`trident.calls.cache`)
and with a lookup that computes the Python layout key every call (as before the C check). Each
figure is the fastest 20-call batch of ``calls / 20`` batches over five rounds. ``--stub`` replaces
every recorded launch by a no-op after the first calls, leaving the Python around the launches:
the figure this change moves, and the one a CPU machine can measure (the simulator's launches are
interpreter runs). Run it under ``trident run -n 1``::

    trident run -n 1 benchmarks/call_lookup.py 4000 --stub    # CPU: the Python alone
    trident run -n 1 benchmarks/call_lookup.py 2000           # GPU: whole calls
"""

from __future__ import annotations

import sys
import timeit

import torch
import torch.distributed as dist

import trident
from trident.bench.latency import custom_op_floor
from trident.calls import cache as cache_module


def key_only_lookup(self, name, options, tensors, heap):
    """``CallCache.lookup`` without the C check: the layout key, computed for every call."""
    key = cache_module.layout_key(name, tensors, options, heap)
    entry = self.get(key)
    return (None, key) if entry is None else (entry, [None if t is None else t.data_ptr() for t in tensors])


def main() -> None:
    calls = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 2000
    ctx = trident.init()
    name, dev = ctx.group_name, ctx.device
    x, plain = ctx.randn(256), torch.randn(256, device=dev)
    group = dist.new_group([0], backend="trident")
    ops, floor = torch.ops.trident, custom_op_floor()
    A, B, C = (torch.randn(64, 64, device=dev) for _ in range(3))
    cases = {
        "x.add_(1)": lambda: plain.add_(1),
        "custom-op floor": lambda: floor(plain, "sum", name),
        "empty_like": lambda: torch.empty_like(plain),
        "ccl all_reduce heap": lambda: trident.ccl.all_reduce(ctx, x),
        "ccl all_reduce plain": lambda: trident.ccl.all_reduce(ctx, plain),
        "ccl all_reduce out=": lambda: trident.ccl.all_reduce(ctx, plain, out=torch.empty_like(plain)),
        "torch.ops all_reduce": lambda: ops.all_reduce(plain, "sum", name),
        "torch.ops all_reduce_": lambda: ops.all_reduce_(x, "sum", name),
        "dist.all_reduce": lambda: dist.all_reduce(plain, group=group),
        "gemm_all_reduce 64^3": lambda: trident.ops.gemm_all_reduce(ctx, A, B, C, pattern="fused_sequential"),
    }
    for call in cases.values():  # recorded, then replayed once
        call()
        call()
    if "--stub" in sys.argv:
        for cache in (ctx.call_cache, group.group.call_cache):
            for entry in cache.entries():
                entry.steps = [lambda ptrs, tensors, options: None]
    as_is = cache_module.CallCache.lookup
    sync = (lambda: None) if ctx.platform.simulator else torch.cuda.synchronize
    best: dict = {}
    for _ in range(5):
        for mode, lookup in (("C check", as_is), ("key only", key_only_lookup)):
            cache_module.CallCache.lookup = lookup
            for case, call in cases.items():
                us = min(timeit.repeat(call, number=20, repeat=max(calls // 20, 1), setup=sync)) / 20 * 1e6
                best[case, mode] = min(best.get((case, mode), float("inf")), us)
    cache_module.CallCache.lookup = as_is
    stubbed = ", launches stubbed" if "--stub" in sys.argv else ""
    print(f"{'call':22s} {'C check':>8s} {'key only':>8s}  (host us per call{stubbed})")
    for case in cases:
        print(f"{case:22s} {best[case, 'C check']:8.2f} {best[case, 'key only']:8.2f}")
    ctx.close()


if __name__ == "__main__":
    main()
