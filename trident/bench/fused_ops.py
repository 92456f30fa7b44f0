"""What the fused-op benchmarks share (``bench gemm-all-scatter``, ``all-gather-gemm``, ``gemm-reduce-scatter``).

Per shape they time ``gemm`` (the rank's GEMM alone), ``baseline`` (torch + NCCL) and every
pattern, each checked before it is timed (:func:`check_and_time`); :func:`shape_rows` turns the
times into the record's rows, each pattern also against its machinery budget (:func:`budget_for`: the
GEMM plus the bytes the op declares the pattern moves beyond it, at a same-run copy's bandwidth),
:func:`record_timeline` writes one traced call per pattern
(``--trace``), and :func:`report` writes the JSON, the table and the speedup and breakdown PNGs.

Every GEMM runs with the library's config for the platform (``config=None``: the table's on a
GPU, ``trident.ops``' simulator config in the simulator), so a benchmark measures what a caller gets.
"""

from __future__ import annotations

import os

import torch

import trident.ops

from . import harness, plots

#: Shapes (M x N x K) of the fused-op benchmarks in the simulator: with its 32x32x32 tiles, two
#: or more tiles per rank and two K steps, so every pattern splits work between programs while the
#: interpreter stays quick.
SIM_SHAPES = [(64, 64, 64)]
#: Bytes of the device copy whose bandwidth the machinery budget is taken at (large enough to
#: stream at full bandwidth).
BUDGET_COPY_BYTES = 256 << 20


def shapes_of(args, simulator: bool, gpu_shapes: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """The shapes a run times: ``--shapes`` (``MxNxK,...``), else :data:`SIM_SHAPES` in the simulator
    and ``gpu_shapes`` on a GPU."""
    if args.shapes:
        sizes = [[int(x) for x in shape.split("x")] for shape in args.shapes.split(",")]
        return [(M, N, K) for M, N, K in sizes]
    return SIM_SHAPES if simulator else gpu_shapes


def heap_bytes(shapes: list[tuple[int, int, int]], dtype: str) -> int:
    """The heap a fused-op benchmark takes per rank: four times its largest operand or product (C on
    the heap, the partial-sum slots, the collectives' input buffer, A_local), so that eight ranks
    sharing one GPU fit where a fixed 8 GiB each did not."""
    element_size = torch.empty((), dtype=getattr(torch, dtype)).element_size()
    return harness.heap_for(4 * max(max(M * N, M * K) for M, N, K in shapes) * element_size)


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


def shape_rows(shape: str, flops: float, times: dict, chosen: str | None,
               budget: tuple[dict[str, int | None], float] | None = None) -> list[dict]:
    """The record's rows for one shape: device time, TFLOP/s, speedup over ``baseline``, time over
    ``gemm``, the host time to issue one call (``host_ms``) and, with ``budget`` = ``({pattern:
    extra bytes}, copy bytes/s)`` (:func:`budget_for`), the pattern's time over its machinery
    budget: the GEMM plus its extra bytes at the same run's copy bandwidth (``vs_budget``)."""
    gemm = times["gemm"].device_ms
    baseline = times["baseline"].device_ms if "baseline" in times else None
    extra, bandwidth = budget if budget is not None else ({}, None)
    rows = []
    for name, t in times.items():
        row = {"shape": shape, "pattern": name, "time_ms": t.device_ms, "host_ms": t.host_ms,
               "tflops": flops / t.device_ms / 1e9, "vs_gemm": t.device_ms / gemm,
               "speedup": baseline / t.device_ms if baseline else None, "gemm_ms": gemm,
               "exposed_comm_ms": max(t.device_ms - gemm, 0.0), "chosen": chosen if name == "auto" else None}
        moved = extra.get(name)
        if moved is not None and bandwidth:
            budget_ms = gemm + moved / bandwidth * 1e3
            row.update(extra_bytes=moved, budget_ms=budget_ms, vs_budget=t.device_ms / budget_ms)
        rows.append(row)
    return rows


def budget_for(ctx, op: str, shape: tuple[int, int, int], dtype: torch.dtype, bandwidth: float
               ) -> tuple[dict[str, int | None], float]:
    """``({pattern: bytes it moves beyond the GEMM}, bandwidth)`` for :func:`shape_rows`, from the op's
    declaration (``trident.ops.OPS[op].extra_bytes``) at this world size; ``bandwidth``:
    :func:`~trident.bench.harness.copy_bandwidth` of the same run."""
    spec = trident.ops.OPS[op]
    element_size = torch.empty((), dtype=dtype).element_size()
    return {p: spec.extra_bytes(p, shape, ctx.world_size, element_size) for p in spec.patterns}, bandwidth


def budget_bandwidth(ctx, args) -> float:
    """The copy bandwidth of this run that every pattern's budget is taken at (collective):
    :data:`BUDGET_COPY_BYTES` copied on a GPU, 1 MiB in the simulator."""
    return harness.copy_bandwidth(ctx, args, (1 << 20) if ctx.platform.simulator else BUDGET_COPY_BYTES)


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
               ("vs_gemm", "/ gemm", ".3f"), ("vs_budget", "/ budget", ".3f"), ("chosen", "auto chose", "")]
    with_speedup = dict(record, rows=[r for r in record["rows"] if r["speedup"] is not None])
    speedups = lambda: plots.bars(with_speedup, f"{out}/{name}_speedup.png", "shape", "pattern", "speedup",
                                  "speedup over the baseline (torch + NCCL)", what + " (dashed: the baseline, 1.0)",
                                  reference=1.0) if with_speedup["rows"] else None
    stacked = lambda: plots.breakdown(record, f"{out}/{name}_breakdown.png", f"{what}: where the time goes")
    return harness.write_report(record, out, columns, plots=[speedups, stacked])
