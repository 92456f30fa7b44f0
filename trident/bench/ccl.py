"""``trident bench ccl``: trident's collectives against torch.distributed (NCCL) over message sizes.

Run once per rank (``trident bench ccl -n 8`` starts the ranks). For each collective, algorithm
and size: warm-up, then the median over repeats of the time of one call measured with device
events, taken as the maximum over ranks. Bus bandwidth follows the nccl-tests convention. NCCL
cannot place two ranks on one GPU, so with fewer GPUs than ranks only trident is measured, and
the output says those numbers are not performance figures.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import time

import torch
import torch.distributed as dist

import trident

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


def _time_ms(ctx, fn, warmup: int, repeats: int) -> float:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        if ctx.backend == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="trident bench ccl", description=__doc__)
    parser.add_argument("--min-bytes", type=int, default=1 << 10)
    parser.add_argument("--max-bytes", type=int, default=1 << 30)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", default="results/ccl")
    args = parser.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    if trident.config.BACKEND == "sim":
        args.max_bytes, args.repeats, args.warmup = min(args.max_bytes, 1 << 14), 2, 1
    ctx = trident.init(heap_size=8 * args.max_bytes + (256 << 20) if trident.config.BACKEND == "cuda"
                       else 64 << 20)
    gpus = torch.cuda.device_count() if ctx.backend == "cuda" else 0
    with_nccl = ctx.backend == "cuda" and gpus >= ctx.world_size
    rows = []
    size = args.min_bytes
    while size <= args.max_bytes:
        cases, nbytes, keep = _cases(ctx, size, dtype, with_nccl)
        for collective, impl, fn in cases:
            ctx.barrier()
            ms = _time_ms(ctx, fn, args.warmup, args.repeats)
            slowest = max(ctx.broadcast(ms, src=r) for r in range(ctx.world_size))
            algbw = nbytes * (ctx.world_size if collective == "all_gather" else 1) / (slowest * 1e-3) / 1e9
            rows.append({"collective": collective, "impl": impl, "bytes": nbytes, "time_us": slowest * 1e3,
                         "algbw_gbps": algbw, "busbw_gbps": algbw * BUS_FACTOR[collective](ctx.world_size)})
        ctx.free(*keep)
        size *= 4
    if ctx.rank == 0:
        _report(ctx, args, rows, gpus, with_nccl)
    ctx.close()


def _report(ctx, args, rows, gpus, with_nccl) -> None:
    shared = ctx.backend == "cuda" and gpus < ctx.world_size
    record = {"benchmark": "ccl", "date": datetime.datetime.now().isoformat(timespec="seconds"),
              "backend": ctx.backend, "world_size": ctx.world_size, "gpus": gpus, "dtype": args.dtype,
              "device": torch.cuda.get_device_name(ctx.device) if ctx.backend == "cuda" else "cpu (simulator)",
              "torch": torch.__version__, "nccl_compared": with_nccl,
              "performance_figure": ctx.backend == "cuda" and not shared, "rows": rows}
    if not record["performance_figure"]:
        record["note"] = ("ranks share a GPU or run in the simulator: a correctness and harness run, "
                          "not a performance figure")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "ccl.json"), "w") as f:
        json.dump(record, f, indent=2)
    print(f"{record['device']}, {ctx.world_size} ranks on {gpus or 'no'} GPU(s), {args.dtype}, {record['date']}")
    if "note" in record:
        print("NOTE:", record["note"])
    print(f"{'collective':<15}{'impl':<18}{'bytes':>12}{'time us':>11}{'busbw GB/s':>12}")
    for r in rows:
        print(f"{r['collective']:<15}{r['impl']:<18}{r['bytes']:>12}{r['time_us']:>11.1f}{r['busbw_gbps']:>12.2f}")
    _plot(record, os.path.join(args.out, "ccl.png"))


def _plot(record, path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    collectives = sorted({r["collective"] for r in record["rows"]})
    fig, axes = plt.subplots(1, len(collectives), figsize=(4 * len(collectives), 3.5), squeeze=False)
    for ax, collective in zip(axes[0], collectives, strict=True):
        for impl in sorted({r["impl"] for r in record["rows"] if r["collective"] == collective}):
            pts = [(r["bytes"], r["time_us"]) for r in record["rows"] if r["collective"] == collective
                   and r["impl"] == impl]
            ax.loglog(*zip(*pts, strict=True), marker="o", label=impl)
        ax.set_title(collective)
        ax.set_xlabel("bytes")
        ax.set_ylabel("time (us)")
        ax.legend(fontsize=7)
    fig.suptitle(f"{record['device']}, {record['world_size']} ranks" + (" (not a performance figure)"
                                                                       if not record["performance_figure"] else ""))
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
