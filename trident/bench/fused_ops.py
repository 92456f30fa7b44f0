"""What the fused-op benchmarks share (``bench gemm-all-scatter``, ``all-gather-gemm``, ``gemm-reduce-scatter``).

Per shape they time ``gemm`` (the rank's GEMM alone), ``baseline`` (torch + NCCL) and every
pattern, each checked before it is timed (:func:`check_and_time`); :func:`shape_rows` turns the
times into the record's rows, :func:`record_timeline` writes one traced call per pattern
(``--trace``), and :func:`report` writes the JSON, the table and the speedup and breakdown PNGs.

Every GEMM runs with the library's config for the platform (``config=None``: the table's on a
GPU, ``trident.ops``' simulator config in the simulator), so a benchmark measures what a caller gets.
"""

from __future__ import annotations

import os

import torch

from . import harness, plots

#: Shapes (M x N x K) of the fused-op benchmarks in the simulator: with its 32x32x32 tiles, two
#: or more tiles per rank and two K steps, so every pattern splits work between programs while the
#: interpreter stays quick.
SIM_SHAPES = [(64, 64, 64)]


def _err(C: torch.Tensor, want: torch.Tensor) -> float:
    return float((C.float() - want.float()).norm() / want.float().norm().clamp_min(1e-30))


def check_and_time(ctx, args, calls: dict, out: torch.Tensor, want: torch.Tensor, label: str, on_call=None) -> dict:
    """Time every call (collective): ``gemm`` (the reference) as it is, every other one after a
    checked run (``out`` poisoned with NaN first, then compared with ``want``). ``on_call(name)``
    runs after each pattern is timed (the timelines). Returns ``{name: (device ms, host ms)}``, each
    the max over ranks (:class:`~trident.bench.harness.Timing`)."""
    times = {}
    for name, fn in harness.progress(list(calls.items()), ctx, args, label):
        ctx.barrier()
        if name != "gemm":
            out.fill_(float("nan"))
            ctx.barrier()
            fn()
            ctx.barrier()
            err = _err(out, want)
            if not err < 2e-2:
                raise RuntimeError(f"rank {ctx.rank}: {name} on {label}: relative error {err:.3g}")
            ctx.barrier()
        timing = harness.measure(ctx.platform.timing_device, fn, args.warmup, args.repeats)
        times[name] = harness.Timing(*(harness.max_over_ranks(ctx, t) for t in timing))
        if on_call is not None and name not in ("gemm", "baseline", "auto"):
            on_call(name)
    return times


def shape_rows(shape: str, flops: float, times: dict, chosen: str | None) -> list[dict]:
    """The record's rows for one shape: device time, TFLOP/s, speedup over ``baseline``, time over
    ``gemm``, and the host time to issue one call (``host_ms``)."""
    gemm = times["gemm"].device_ms
    baseline = times["baseline"].device_ms if "baseline" in times else None
    return [{"shape": shape, "pattern": name, "time_ms": t.device_ms, "host_ms": t.host_ms,
             "tflops": flops / t.device_ms / 1e9, "vs_gemm": t.device_ms / gemm,
             "speedup": baseline / t.device_ms if baseline else None, "gemm_ms": gemm,
             "exposed_comm_ms": max(t.device_ms - gemm, 0.0), "chosen": chosen if name == "auto" else None}
            for name, t in times.items()]


def record_timeline(ctx, args, run_traced, pattern: str, shape: str) -> None:
    """One traced call, ``run_traced(trace)`` (collective): every rank's per-tile compute/comm/wait
    events, written by rank 0 as ``timeline_{pattern}_{shape}.json`` (Perfetto) and ``.png``."""
    import trident.trace

    trace = trident.trace.Trace(ctx, capacity=1 << 16)
    ctx.barrier()
    run_traced(trace)
    ctx.barrier()
    trace.gather()
    if ctx.rank == 0:
        os.makedirs(args.out, exist_ok=True)
        base = os.path.join(args.out, f"timeline_{pattern}_{shape}")
        trace.to_chrome(base + ".json", title=f"{pattern} {shape}")
        trace.plot(base + ".png", title=f"{pattern} {shape}, {ctx.world_size} rank(s)")
    ctx.free(trace.tensor)


def report(record: dict, out: str, name: str = "gemm_all_scatter", what: str = "GEMM + all-scatter") -> list[str]:
    """Write the JSON and the plots (``{name}_speedup.png``, ``{name}_breakdown.png``) into ``out``
    and print the table; returns the files written."""
    columns = [("shape", "shape", ""), ("pattern", "pattern", ""), ("time_ms", "ms", ".3f"),
               ("host_ms", "host ms", ".3f"), ("tflops", "TFLOP/s", ".0f"), ("speedup", "vs baseline", ".2f"),
               ("vs_gemm", "/ gemm", ".3f"), ("chosen", "auto chose", "")]
    with_speedup = dict(record, rows=[r for r in record["rows"] if r["speedup"] is not None])
    speedups = lambda: plots.bars(with_speedup, f"{out}/{name}_speedup.png", "shape", "pattern", "speedup",
                                  "speedup over the baseline (torch + NCCL)", what + " (dashed: the baseline, 1.0)",
                                  reference=1.0) if with_speedup["rows"] else None
    stacked = lambda: plots.breakdown(record, f"{out}/{name}_breakdown.png", f"{what}: where the time goes")
    return harness.write_report(record, out, columns, plots=[speedups, stacked])
