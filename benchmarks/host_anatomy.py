"""Where a small call's host time goes, piece by piece, on one rank (a profiling aid for issue 29).

``trident bench latency`` reports each entry's host time per call; this script takes the replay
path apart: the pipeline's own Python (layout key, capture check, cache lookup), the recorded
launch alone, Triton's launch path against the compiled launcher's, torch's dispatcher with a
no-op custom op (the floor of any ``torch.ops.trident.*`` call) and a fresh ``empty_like``. Each
row is the host time per call of 200 calls issued while a sleep kernel keeps the GPU busy (so the
queue never drains and only the host is timed), the median of 7 (``trident.bench.harness.host_ms_per_call``,
as every benchmark's host column); then cProfile of the entry
paths, or of any row whose name contains a ``--profile`` argument, the host cases of ``trident
bench latency`` included (the same calls and shapes). Needs a GPU (the simulator's launches are
interpreter calls, not launches).

    python benchmarks/host_anatomy.py --out results/host_anatomy     # -> host_anatomy.json
    python benchmarks/host_anatomy.py --profile "gemm_all_reduce 4096" "torch.ops all_gather"
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats

import torch
import torch.distributed as dist
import triton

import trident
from trident.bench.harness import host_ms_per_call
from trident.bench.latency import _host_cases
from trident.calls import cache as call_cache
from trident.calls.pipeline import run_call
from trident.ccl.api import OPS
from trident.kernels.prepared import direct_launcher
from trident.runtime.groups import resolve, team
from trident.runtime.resources import note_call


@triton.jit
def empty_kernel(x_ptr):
    """The launch-cost reference: a kernel that does nothing."""
    pass


def _cases(ctx) -> dict:
    """``{name: call}``: the pieces of a repeated small call and the references around them."""
    dev, n, name = ctx.device, 256, ctx.group_name
    x, plain, fixed = ctx.randn(n), torch.randn(n, device=dev), torch.empty(n, device=dev)
    dummy = torch.empty(1, device=dev)
    library = torch.library.Library("trident_anatomy", "DEF")
    library.define("noop(Tensor t, str g) -> ()")
    library.define("fresh(Tensor t, str g) -> Tensor")
    library.impl("noop", lambda t, g: None, "CUDA")
    library.impl("fresh", lambda t, g: torch.empty_like(t), "CUDA")
    _cases.keep = [library, x]  # type: ignore[attr-defined]  # registrations end with the Library
    group = dist.new_group([0], backend="trident")
    A, B = (torch.randn(64, 64, device=dev, dtype=torch.bfloat16) for _ in range(2))
    C = torch.empty(64, 64, device=dev, dtype=torch.bfloat16)
    xn, wn = torch.randn(64, 64, device=dev, dtype=torch.bfloat16), torch.ones(64, device=dev, dtype=torch.bfloat16)
    world, all_reduce = team(ctx, None), OPS["all_reduce"]
    options, heap = ("sum", "auto"), world.heap_range
    trident.ccl.all_reduce(ctx, plain, out=fixed)
    entry = world.call_cache.get(call_cache.layout_key("all_reduce", (plain, fixed), options, heap))
    again, address = direct_launcher(empty_kernel[(1,)](dummy), (1, 1, 1)), dummy.data_ptr()
    ops = torch.ops.trident
    return {
        "torch x.add_(1)": lambda: plain.add_(1),
        "torch.empty_like": lambda: torch.empty_like(plain),
        "triton launch, empty kernel": lambda: empty_kernel[(1,)](dummy),
        "recorded launch, empty kernel": lambda: again(address),
        "pipeline: layout_key": lambda: call_cache.layout_key("all_reduce", (plain, fixed), options, heap),
        "pipeline: note_call (capture check)": lambda: note_call(world, "all_reduce"),
        "pipeline: team + resolve": lambda: (resolve(name), team(ctx, None)),
        "pipeline: entry.replay alone": lambda: entry.replay((plain, fixed)),
        "run_call all_reduce (plain, fixed out)": lambda: run_call(world, all_reduce, (plain, fixed), options),
        "ccl.all_reduce heap": lambda: trident.ccl.all_reduce(ctx, x),
        "ccl.all_reduce plain": lambda: trident.ccl.all_reduce(ctx, plain),
        "ccl.all_reduce plain, fixed out": lambda: trident.ccl.all_reduce(ctx, plain, out=fixed),
        "ccl.all_reduce plain, fresh out": lambda: trident.ccl.all_reduce(ctx, plain, out=torch.empty_like(plain)),
        "custom op floor: no-op": lambda: torch.ops.trident_anatomy.noop(plain, name),
        "custom op floor: empty_like": lambda: torch.ops.trident_anatomy.fresh(plain, name),
        "torch.ops.trident.all_reduce": lambda: ops.all_reduce(plain, "sum", name),
        "torch.ops.trident.all_reduce_ heap": lambda: ops.all_reduce_(x, "sum", name),
        "dist.all_reduce trident group": lambda: dist.all_reduce(plain, group=group),
        "dist.all_reduce nccl": lambda: dist.all_reduce(plain),
        "torch.matmul small": lambda: torch.matmul(A, B),
        "gemm_all_reduce small": lambda: trident.ops.gemm_all_reduce(ctx, A, B, C, pattern="fused_sequential"),
        "all_reduce_rmsnorm small": lambda: trident.ops.all_reduce_rmsnorm(ctx, xn, wn, residual=xn),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="results/host_anatomy")
    parser.add_argument("--profile", nargs="*", help="profile the rows whose names contain these (cProfile)",
                        default=["ccl.all_reduce plain, fixed out", "torch.ops.trident.all_reduce",
                                 "dist.all_reduce trident group", "all_reduce_rmsnorm small"])
    args = parser.parse_args()
    ctx = trident.init()
    if ctx.platform.simulator:
        raise SystemExit("host_anatomy.py times GPU launches: run it on a GPU")
    rows = {}
    cases = _cases(ctx)
    for name, fn in cases.items():
        for _ in range(20):
            fn()
        us = host_ms_per_call(ctx.device, fn, batch=200, samples=7) * 1e3
        rows[name] = {"host_us": round(us, 2)}
        print(f"{name:42s} {us:7.2f} us", flush=True)
    latency, keep = _host_cases(ctx, small_only=False)
    every = {**cases, **{f"latency: {name}": fn for name, _, fn in latency}}
    for name, fn in every.items():
        if not any(wanted in name for wanted in args.profile):
            continue
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(2000):
            fn()
        profile.disable()
        torch.cuda.synchronize()
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(15)
        print(f"=== cProfile of 2000 calls: {name}\n{text.getvalue()[:4000]}")
    del keep
    os.makedirs(args.out, exist_ok=True)
    record = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "rows": rows}
    with open(os.path.join(args.out, "host_anatomy.json"), "w") as f:
        json.dump(record, f, indent=1)
    ctx.close()


if __name__ == "__main__":
    main()
