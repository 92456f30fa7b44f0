"""``trident bench ccl``: trident's collectives against torch.distributed (NCCL) over message sizes.

Run once per rank (``trident bench ccl -n 8`` starts the ranks). For each collective, algorithm
and size: warm-up, then the median over repeats of the time of one call measured with device
events, taken as the maximum over ranks. Bus bandwidth follows the nccl-tests convention. NCCL
cannot place two ranks on one GPU, so with fewer GPUs than ranks only trident is measured, and
the output says those numbers are not performance figures.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch
import torch.distributed as dist

import trident

from . import arguments, harness, plots

# busbw = algbw * factor(world), as in nccl-tests; algbw counts the bytes of the largest buffer.
BUS_FACTOR = {
    "all_reduce": lambda w: 2 * (w - 1) / w, "all_gather": lambda w: (w - 1) / w,
    "reduce_scatter": lambda w: (w - 1) / w, "all_to_all": lambda w: (w - 1) / w, "broadcast": lambda w: 1.0,
}


def _cases(ctx, nbytes: int, dtype: torch.dtype, with_nccl: bool):
    """(collective, implementation, call) triples for one message size."""
    w = ctx.world_size
    n = max(nbytes // dtype.itemsize, w)
    n -= n % w
    x, big = ctx.randn(n, dtype=dtype), ctx.randn(n * w, dtype=dtype)
    out, small = torch.empty(n * w, dtype=dtype, device=ctx.device), torch.empty(n // w, dtype=dtype, device=ctx.device)
    a2a = torch.empty_like(x)
    cases: list[tuple[str, str, Callable[..., object]]]
    cases = [("all_reduce", f"trident {alg}", lambda alg=alg: trident.ccl.all_reduce(ctx, x, algorithm=alg))
             for alg in ("one_shot", "two_shot")]
    cases += [("all_gather", "trident", lambda: trident.ccl.all_gather(ctx, big, x)),
              ("reduce_scatter", "trident", lambda: trident.ccl.reduce_scatter(ctx, small, x)),
              ("all_to_all", "trident", lambda: trident.ccl.all_to_all(ctx, a2a, x)),
              ("broadcast", "trident", lambda: trident.ccl.broadcast(ctx, x, 0))]
    if with_nccl:
        cases += [("all_reduce", "nccl", lambda: dist.all_reduce(x)),
                  ("all_gather", "nccl", lambda: dist.all_gather_into_tensor(out, x)),
                  ("reduce_scatter", "nccl", lambda: dist.reduce_scatter_tensor(small, x)),
                  ("all_to_all", "nccl", lambda: dist.all_to_all_single(a2a, x)),
                  ("broadcast", "nccl", lambda: dist.broadcast(x, 0))]
    return cases, n * dtype.itemsize, (x, big)


# ``trident bench ccl --help``
parse_args = arguments.message_size_args("trident bench ccl", __doc__, "ccl", 1 << 30, warmup=5, repeats=20)
# The simulator runs tiny sizes: it checks the benchmark, not the speed.
sim_sizes = arguments.simulator_sizes(1 << 14, warmup=1, repeats=2)


def run(ctx, args) -> dict:
    """Time every collective and algorithm at every size (collective); returns the record on every rank.

    Example::

        record = run(ctx, parse_args(["--max-bytes", "1M"]))
    """
    dtype = getattr(torch, args.dtype)
    with_nccl = ctx.platform.nccl_usable
    record = harness.new_record(ctx, "ccl", harness.params(args))
    record["nccl_compared"] = with_nccl
    for size in harness.progress(arguments.size_sweep(args.min_bytes, args.max_bytes, 4), ctx, args, "ccl"):
        cases, nbytes, keep = _cases(ctx, size, dtype, with_nccl)
        for collective, impl, fn in cases:
            ctx.barrier()
            slowest = harness.max_over_ranks(ctx, harness.time_ms(ctx, fn, args.warmup, args.repeats))
            algbw = nbytes * (ctx.world_size if collective == "all_gather" else 1) / (slowest * 1e-3) / 1e9
            record["rows"].append({"collective": collective, "impl": impl, "bytes": nbytes, "time_us": slowest * 1e3,
                                   "algbw_gbps": algbw, "busbw_gbps": algbw * BUS_FACTOR[collective](ctx.world_size)})
        ctx.free(*keep)
    return record


def report(record: dict, out: str) -> list[str]:
    """Write the JSON and the plot into ``out`` and print the table; returns the files written."""
    columns = [("collective", "collective", ""), ("impl", "impl", ""), ("bytes", "bytes", "d"),
               ("time_us", "time us", ".1f"), ("busbw_gbps", "busbw GB/s", ".4g")]
    return harness.write_report(record, out, columns, plots=[lambda: plots.loglog(
        record, f"{out}/ccl.png", "collective", "impl", "bytes", "time_us", "bytes", "time (us)",
        f"trident collectives ({record['params']['dtype']})", reference="nccl")])


def main(argv=None) -> int:
    """Run ``trident bench ccl`` on this rank (started once per rank by ``trident bench``); returns 0."""
    harness.bench_main(argv, parse_args, run, report, harness.message_size_heap, sim_sizes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
