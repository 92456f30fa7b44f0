"""What every ``trident bench`` benchmark shares: timing, gathering over ranks, metadata, output.

A benchmark module has ``run(ctx, args) -> record`` (collective: every rank calls it; the record
is complete on every rank) and ``main(argv)``, which parses arguments, starts trident, runs,
and writes the results on rank 0 (:func:`write_results`)::

    results/NAME/NAME.json    {"schema": "trident-bench/1", "benchmark", "meta", "params",
                               "performance_figure", "note", "rows": [...], ...}
    results/NAME/*.png        plots

Timing: ``warmup`` calls, then the median of ``repeats`` calls, each timed with CUDA events
(the host clock in the simulator); a measurement taken on several ranks at once counts the
slowest rank (:func:`max_over_ranks`). On a GPU the stream first sleeps about a millisecond
before each timed call, so the host has queued the whole call before its first kernel starts:
the figure is the call's device time, with no Python or launch overhead in it. That overhead is
measured separately, as the host time of one call (:func:`measure`).
"""

from __future__ import annotations

import datetime
import json
import math
import os
import platform as pyplatform
import shlex
import statistics
import sys
import time
from typing import NamedTuple

import torch

from .. import config, torch_private
from ..platform import SIMULATOR

# NVLink multicast (NVLS) must never be used on the shared multi-GPU hosts (it can take a host's
# GPUs out of service): the NCCL reference lines run with it off. NCCL reads this when its first
# communicator is made, which is after a benchmark module (and so this one) is imported.
os.environ.update(config.NO_MULTICAST_ENV)

SCHEMA = "trident-bench/1"
SHARED_NOTE = ("ranks share a GPU or run in the simulator: a correctness and harness run, "
               "not link bandwidth and not a performance figure")


def time_ms(ctx, fn, warmup: int, repeats: int) -> float:
    """Median milliseconds of one ``fn()`` call on this rank.

    Args:
        ctx: the trident context (``ctx.platform.timing_device`` picks device events or the host clock).
        fn: what to time; it launches device work (it need not wait for it).
        warmup: untimed calls first.
        repeats: timed calls (at least 1).

    Returns:
        The median over the repeats, in milliseconds.

    Example::

        ms = time_ms(ctx, lambda: kernel[grid](x, y, n), warmup=3, repeats=10)
    """
    return time_on(ctx.platform.timing_device, fn, warmup, repeats)


def time_on(device: torch.device, fn, warmup: int, repeats: int) -> float:
    """:func:`time_ms` without a context: CUDA events on a GPU, the host clock on the CPU.

    Example::

        ms = time_on(A.device, lambda: torch.matmul(A, B), warmup=3, repeats=10)
    """
    return measure(device, fn, warmup, repeats, host=False).device_ms


#: GPU cycles the stream sleeps before each timed call: about 1 ms at an H200's clock, far more
#: than the host needs to queue any call benchmarked here.
SLEEP_CYCLES = 2_000_000
#: The timing device that means "the host clock" (:func:`measure`).
HOST = torch.device("cpu")


class Timing(NamedTuple):
    """Medians of one call: ``device_ms`` on the device (the host clock in the simulator) and
    ``host_ms``, the host time to issue it (Python, checks, launches; no waiting for the device)."""

    device_ms: float
    host_ms: float


#: Calls issued back to back per host-time sample (:func:`host_ms_per_call`), and samples per figure.
HOST_BATCH, HOST_SAMPLES = 20, 3
#: GPU cycles the stream sleeps under a host-time batch: about 10 ms at an H100's clock, longer than
#: the host takes to queue HOST_BATCH of any call benchmarked here (so the queue never drains).
BATCH_SLEEP_CYCLES = 20_000_000


def copy_bandwidth(ctx, args, nbytes: int) -> float:
    """Bytes per second a plain device copy of ``nbytes`` moves (read plus write) on the slowest rank
    (collective): the memory bandwidth a benchmark's floor or budget is taken at, measured in the same
    run as what it is compared with.

    Example::

        floor_us = moved_bytes / copy_bandwidth(ctx, args, 256 << 20) * 1e6
    """
    src = torch.empty(max(nbytes, 1), dtype=torch.uint8, device=ctx.device)
    dst = torch.empty_like(src)
    ctx.barrier()
    t = measure(ctx.platform.timing_device, lambda: dst.copy_(src), args.warmup, args.repeats)
    return 2 * src.numel() / (max_over_ranks(ctx, t.device_ms) * 1e-3)


def measure(device: torch.device, fn, warmup: int, repeats: int, host: bool = True) -> Timing:
    """Time ``fn()``: ``warmup`` untimed calls, then the median device time of ``repeats`` timed ones
    and the host time per call (:func:`host_ms_per_call`; on a GPU that calls ``fn`` another
    ``HOST_BATCH * HOST_SAMPLES`` times: ``host=False`` skips it, and ``host_ms`` is then NaN, for a
    caller that counts on ``fn`` running exactly ``warmup + repeats`` times, as a check of an atomic's
    total does).

    ``device`` is where the timer runs (``ctx.platform.timing_device``): a GPU is timed with CUDA
    events, the CPU (the simulator's kernels run there) with the host clock, which then gives both
    figures.

    On a GPU each timed call runs after a sleep kernel (:data:`SLEEP_CYCLES`) on the current
    stream: the host queues the start event, the call and the end event while the GPU sleeps,
    so the events measure device time only. Without it a call's Python and launch overhead would
    count as device time whenever the GPU is idle, as it is between timed calls.

    Example::

        t = measure(A.device, lambda: torch.matmul(A, B), warmup=3, repeats=10)
        print(t.device_ms, t.host_ms)
    """
    for _ in range(warmup):
        fn()
    samples = []
    if torch.device(device) == HOST:
        for _ in range(max(repeats, 1)):
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1e3)
        return Timing(statistics.median(samples), statistics.median(samples))
    torch.cuda.synchronize(device)
    for _ in range(max(repeats, 1)):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch_private.cuda_sleep(SLEEP_CYCLES)
        start.record()
        fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end))
    return Timing(statistics.median(samples), host_ms_per_call(device, fn) if host else math.nan)


def host_ms_per_call(device: torch.device, fn, batch: int = HOST_BATCH, samples: int = HOST_SAMPLES) -> float:
    """Host milliseconds per call of ``fn()`` on a GPU: the median over ``samples`` batches of
    ``batch`` calls issued back to back while a sleep kernel keeps the GPU busy.

    The queue never drains during a batch, so only the host is timed (Python, checks, launches), as
    in a serving loop that stays ahead of its GPU; timing calls one at a time instead adds the timer's
    own cost and the host's wake-up after each wait for the device (on the H100 host of 2026-12-06
    ``x.add_(1)`` read 33 us one at a time against 10 in batches). A call that waits for the device
    itself waits for the sleep here, and its figure shows it.

    Example::

        us = host_ms_per_call(A.device, lambda: torch.matmul(A, B)) * 1e3
    """
    torch.cuda.synchronize(device)
    per_call = []
    for _ in range(samples):
        torch_private.cuda_sleep(BATCH_SLEEP_CYCLES)
        t0 = time.perf_counter()
        for _ in range(batch):
            fn()
        per_call.append((time.perf_counter() - t0) * 1e3 / batch)
        torch.cuda.synchronize(device)
    return statistics.median(per_call)


def all_values(ctx, value) -> list:
    """Every rank's ``value`` (any picklable object), in rank order, on every rank (collective)."""
    return [ctx.broadcast(value if r == ctx.rank else None, src=r) for r in range(ctx.world_size)]


def max_over_ranks(ctx, value: float) -> float:
    """The largest of every rank's ``value`` (collective): a collective step lasts as long as its slowest rank."""
    return max(all_values(ctx, value))


def synchronize(ctx) -> None:
    """Wait until this rank's queued device work has finished (in the simulator it already has)."""
    if not ctx.platform.simulator:
        torch.cuda.synchronize(ctx.device)


def metadata(ctx, argv=None) -> dict:
    """The run's environment: date, command line, backend, world size, GPUs, driver, versions (collective).

    Example::

        meta = metadata(ctx)     # {"date": "...Z", "backend": "cuda", "gpu": "NVIDIA H200", ...}
    """
    import triton

    import trident

    from ..topology import driver_version

    p = ctx.platform
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")
    meta = {
        "date": ctx.broadcast(now if ctx.rank == 0 else None),  # rank 0's: every rank's record is the same
        # `trident bench` passes the user's command line; a rank's own argv is only the module's.
        "command": os.environ.get("TRIDENT_BENCH_COMMAND") or " ".join(
            shlex.quote(a) for a in (argv if argv is not None else sys.argv)),
        "host": pyplatform.node(), "backend": p.backend, "world_size": ctx.world_size, "gpus": p.gpus_visible,
        "ranks_share_gpus": p.ranks_share_gpus, "gpu": p.gpu_name,
        "sm_count": None if p.simulator else p.sm_count,  # the simulator's stand-in count is no hardware
        "driver": None if p.simulator else driver_version(),
        "cuda": torch.version.cuda, "torch": torch.__version__, "triton": triton.__version__,
        "trident": trident.__version__, "python": pyplatform.python_version(), "heap_size": ctx.heap_size,
    }
    return meta


def params(args) -> dict:
    """A record's ``params``: the parsed arguments but ``no_progress`` (how a run is shown, not what it
    measures), as in ``new_record(ctx, "ccl", params(args))``."""
    return {k: v for k, v in vars(args).items() if k != "no_progress"}


def new_record(ctx, benchmark: str, params: dict, argv=None) -> dict:
    """A results record with the schema's fixed fields; add ``rows`` (and extras) to it.

    ``performance_figure`` (``ctx.platform.performance_figure``) is false, with a ``note`` saying
    why, when ranks share GPUs or run in the simulator: such numbers check correctness and the
    harness, never link bandwidth.
    """
    perf = ctx.platform.performance_figure
    return {"schema": SCHEMA, "benchmark": benchmark, "meta": metadata(ctx, argv), "params": dict(params),
            "performance_figure": perf, "note": "" if perf else SHARED_NOTE, "rows": []}


#: The fields every results record has, and their types (``validate`` checks them).
RECORD_FIELDS = {"schema": str, "benchmark": str, "meta": dict, "params": dict, "performance_figure": bool,
                 "note": str, "rows": list}
META_FIELDS = {"date": str, "command": str, "host": str, "backend": str, "world_size": int, "gpus": int,
               "ranks_share_gpus": bool, "gpu": str, "torch": str, "triton": str, "trident": str, "heap_size": int}


def validate(record: dict) -> dict:
    """Check that ``record`` follows the results schema; returns it, or raises ``ValueError`` naming the problem.

    Example::

        validate(json.load(open("results/p2p/p2p.json")))
    """
    for fields, where in ((RECORD_FIELDS, record), (META_FIELDS, record.get("meta", {}))):
        for key, kind in fields.items():
            if not isinstance(where.get(key), kind):
                raise ValueError(f"results record: {key!r} missing or not {kind.__name__}: {where.get(key)!r}")
    if record["schema"] != SCHEMA:
        raise ValueError(f"results record: schema {record['schema']!r}, expected {SCHEMA!r}")
    if not all(isinstance(r, dict) for r in record["rows"]):
        raise ValueError("results record: every row must be an object")
    if not record["performance_figure"] and not record["note"]:
        raise ValueError("results record: a run that is not a performance figure must say why in 'note'")
    return record


def write_results(record: dict, out: str, name: str | None = None) -> str:
    """Write ``record`` as ``OUT/NAME.json`` (``NAME`` defaults to the benchmark's); returns the path."""
    validate(record)
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, f"{name or record['benchmark'].replace('-', '_')}.json")
    with open(path, "w") as f:
        json.dump(record, f, indent=2)
    return path


def header(record: dict) -> str:
    """One line naming the machine and run, plus the shared-GPU warning when there is one."""
    m = record["meta"]
    line = (f"{record['benchmark']}: {m['gpu']}, {m['world_size']} rank(s) on {m['gpus'] or 'no'} GPU(s), "
            f"backend {m['backend']}, {m['date']}")
    if record.get("note"):
        line += f"\nNOTE: {record['note']}"
    return line


def table(rows: list[dict], columns: list[tuple[str, str, str]]) -> str:
    """Rows as a fixed-width text table.

    Args:
        rows: dicts.
        columns: ``(key, heading, format)`` triples, e.g. ``("gbps", "GB/s", ".1f")``.

    Returns:
        The table as one string (heading line, then one line per row).
    """
    cells = [[format(r.get(k, ""), f) if r.get(k) is not None else "-" for k, _, f in columns] for r in rows]
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, (_, h, _) in enumerate(columns)]
    # Text columns (format "") read best left-aligned, numbers right-aligned.
    just = [(lambda s, w: s.ljust(w)) if f == "" else (lambda s, w: s.rjust(w)) for _, _, f in columns]
    lines = ["  ".join(j(h, w) for j, (_, h, _), w in zip(just, columns, widths, strict=True))]
    lines += ["  ".join(j(c, w) for j, c, w in zip(just, row, widths, strict=True)) for row in cells]
    return "\n".join(line.rstrip() for line in lines)


def write_report(record: dict, out: str, columns: list[tuple[str, str, str]] | None, *, rows: list[dict] | None = None,
                 plots=(), name: str | None = None, wrong: str = "some measurements are wrong") -> list[str]:
    """The end of every benchmark's ``report``: write the record, show it, draw its plots.

    Writes ``OUT/NAME.json`` (:func:`write_results`), prints the :func:`header` and, with
    ``columns``, the :func:`table` of ``rows`` (default: the record's), then calls each of
    ``plots`` (no arguments; each returns the PNG it wrote, or None without matplotlib). When the
    record has ``all_correct`` and it is false, ``ERROR: {wrong}`` goes to stderr.

    Returns:
        The files written, the JSON first.

    Example::

        return harness.write_report(record, out, [("op", "op", ""), ("gbps", "GB/s", ".4g")],
                                    plots=[lambda: plots.heatmaps(record, f"{out}/p2p.png", ops, "value", unit)])
    """
    files = [write_results(record, out, name)]
    print(header(record))
    if columns:
        print(table(record["rows"] if rows is None else rows, columns))
    files += [path for draw in plots if (path := draw())]
    if not record.get("all_correct", True):
        print(f"ERROR: {wrong}", file=sys.stderr)
    return files


def progress(iterable, ctx, args, desc: str, total: int | None = None):
    """``iterable`` wrapped in a tqdm progress bar on rank 0 of an interactive terminal, else as is."""
    if ctx.rank != 0 or getattr(args, "no_progress", False):
        return iterable
    try:
        from tqdm import tqdm
    except ImportError:
        return iterable
    return tqdm(iterable, desc=desc, total=total, disable=None, leave=False, file=sys.stderr)


def run_benchmark(args, run, report, heap_size: int) -> dict:
    """A benchmark's rank body: open a context with ``heap_size``, ``record = run(ctx, args)``,
    ``report(record, args.out)`` on rank 0, close (also after an error); returns the record.

    Example::

        record = harness.run_benchmark(args, run, report, harness.heap_for(2 * args.bytes))
    """
    import trident

    ctx = trident.init(heap_size=heap_size)
    try:
        record = run(ctx, args)
        if ctx.rank == 0:
            report(record, args.out)
    finally:
        ctx.close()
    return record


def bench_main(argv, parse_args, run, report, heap, sim_sizes=None) -> dict:
    """A benchmark module's ``main`` on this rank: ``args = parse_args(argv)``, ``sim_sizes(args)`` in
    the simulator (if given), then :func:`run_benchmark` with ``run``, ``report`` and a heap of
    ``heap(args)`` bytes (after ``sim_sizes``: the heap follows the sizes; or ``heap`` itself, an int).
    Returns the record.

    Example::

        record = harness.bench_main(argv, parse_args, run, report, lambda args: heap_for(2 * args.bytes), sim_sizes)
        return 0 if record["all_correct"] else 1
    """
    args = parse_args(argv)
    if SIMULATOR and sim_sizes is not None:
        sim_sizes(args)
    return run_benchmark(args, run, report, heap if isinstance(heap, int) else heap(args))


def heap_for(nbytes: int) -> int:
    """A heap size holding ``nbytes`` of benchmark buffers plus room for trident's own.

    Called before ``trident.init`` (the heap size is an argument of it), so it asks
    :data:`trident.platform.SIMULATOR`: the simulator's heap is host memory and is capped.
    """
    need = int(nbytes) + (64 << 20)
    return min(need, 256 << 20) if SIMULATOR else need


def message_size_heap(args) -> int:
    """The heap of a message-size sweep (``args.max_bytes``): room for eight messages and trident's
    workspaces on a GPU, 64 MiB in the simulator (whose sizes :func:`arguments.simulator_sizes` caps)."""
    return 64 << 20 if SIMULATOR else 8 * args.max_bytes + (256 << 20)
