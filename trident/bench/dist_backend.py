"""``trident bench dist-backend``: what the torch.distributed backend's Python dispatch costs per call.

For each message size, the host time to issue one all-reduce (median; Python, checks, launches,
no waiting for the device) three ways in the same run: ``dist.all_reduce(t, group=g)`` on a
``dist.new_group(..., backend="trident")`` group, ``trident.ccl.all_reduce(ctx, t, group=tg)``
on that group's trident group (the same kernel, no torch dispatch), and, where NCCL can run, NCCL's
``dist.all_reduce`` on the default group. ``dispatch_us`` is the first minus the second: what
going through torch.distributed adds. In the simulator the host time includes running the kernel
on the CPU, so ``dispatch_us`` is measured a second way, which the simulator can measure too:
``dist.all_reduce`` through the backend with the ``trident.ccl`` call stubbed out ("dispatch alone").
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

import trident

from . import arguments, harness

# ``trident bench dist-backend --help``
parse_args = arguments.message_size_args("trident bench dist-backend", __doc__, "dist_backend", 1 << 20,
                                         warmup=10, repeats=100)
# Tiny sizes: the simulator checks the benchmark and measures the Python layers only.
sim_sizes = arguments.simulator_sizes(1 << 12, warmup=3, repeats=20)


def run(ctx, args) -> dict:
    """Time the three ways at every size (collective); returns the record on every rank.

    Example::

        record = run(ctx, parse_args(["--max-bytes", "64K"]))
    """
    dtype = getattr(torch, args.dtype)
    trident.dist_backend.reserve(ctx, groups=1, group_bytes=max(4 * args.max_bytes, 1 << 20))
    group = dist.new_group(list(range(ctx.world_size)), backend="trident")
    record = harness.new_record(ctx, "dist_backend", harness.params(args))
    record["nccl_compared"] = ctx.platform.nccl_usable
    try:
        for size in harness.progress(arguments.size_sweep(args.min_bytes, args.max_bytes, 4), ctx, args, "dist"):
            t = torch.zeros(max(size // dtype.itemsize, 1), dtype=dtype, device=ctx.device)
            ways = {"torch.distributed (trident backend)": lambda t=t: dist.all_reduce(t, group=group),
                    "trident.ccl": lambda t=t: trident.ccl.all_reduce(ctx, t, group=group.group)}
            if ctx.platform.nccl_usable:
                ways["torch.distributed (nccl)"] = lambda t=t: dist.all_reduce(t)
            host = {}
            for way, fn in ways.items():
                ctx.barrier()
                timing = harness.measure(ctx.platform.timing_device, fn, args.warmup, args.repeats)
                host[way] = harness.max_over_ranks(ctx, timing.host_ms) * 1e3
                record["rows"].append({"way": way, "bytes": t.numel() * dtype.itemsize, "host_us": host[way],
                                       "device_us": harness.max_over_ranks(ctx, timing.device_ms) * 1e3})
            record["rows"][-len(ways)]["dispatch_us"] = (host["torch.distributed (trident backend)"]
                                                         - host["trident.ccl"])
            record["rows"].append({"way": "dispatch alone (trident.ccl stubbed)", "bytes": t.numel() * dtype.itemsize,
                                   "dispatch_us": _dispatch_alone(ctx, group, t, args) * 1e3})
    finally:
        ctx.barrier()
        dist.destroy_process_group(group)
    return record


def _dispatch_alone(ctx, group, t, args) -> float:
    """Host ms of ``dist.all_reduce`` through the backend with the trident.ccl call replaced by nothing:
    torch.distributed's and the backend's Python alone (rank-local; the kernel never runs)."""
    real = trident.dist_backend.ccl.all_reduce
    trident.dist_backend.ccl.all_reduce = lambda *a, **k: None  # type: ignore[assignment]  # nothing, on purpose
    try:
        timing = harness.measure(torch.device("cpu"), lambda: dist.all_reduce(t, group=group),
                                 args.warmup, max(args.repeats, 100))
    finally:
        trident.dist_backend.ccl.all_reduce = real
    return harness.max_over_ranks(ctx, timing.host_ms)


def report(record: dict, out: str) -> list[str]:
    """Write the JSON into ``out`` and print the table; returns the files written."""
    columns = [("way", "way", ""), ("bytes", "bytes", "d"), ("host_us", "host us", ".1f"),
               ("device_us", "device us", ".1f"), ("dispatch_us", "dispatch us", ".1f")]
    return harness.write_report(record, out, columns)


def main(argv=None) -> int:
    """Run ``trident bench dist-backend`` on this rank (started once per rank by ``trident bench``); returns 0."""
    harness.bench_main(argv, parse_args, run, report, harness.message_size_heap, sim_sizes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
