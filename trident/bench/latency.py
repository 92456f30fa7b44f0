"""``trident bench latency``: what a small call costs: host time, flag round trips, small collectives.

Inference lives at small messages and small GEMMs, where a call costs its host time plus its
synchronisation latency, not bandwidth. Three parts, each against references measured in the
same run:

* **host** (``part="host"``): the host time to issue one call (Python, checks, launches; no waiting
  for the device) and its device time, for every collective at 1 KiB (heap and plain tensors),
  ``ctx.device_barrier()`` and the three fused ops (a small and a 4096-class shape on a GPU),
  against an empty Triton launch, a torch op, ``torch.matmul`` and NCCL's all-reduce where NCCL
  can run (one GPU per rank, world 1 included); and a decode-sized MoE dispatch and combine;
* **round trip** (``part="round_trip"``): ranks 0 and 1 pass a flag back and forth ``--rounds``
  times in one kernel each, with ``trident.signal`` / ``trident.wait`` and with a bare reference
  (a release exchange, a volatile spin and one acquire read); the time per round trip;
* **collective** (``part="collective"``): device time of ``all_reduce`` (one_shot) from 1 KiB to
  1 MiB, eager and, on a GPU, inside a CUDA graph of ``--graph-calls`` calls (time per call).

Ranks sharing one GPU need ``--mps`` (``trident bench latency -n 4 --mps``) so that their kernels run
concurrently; then latency and host time are real figures, never bandwidth.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
from functools import partial
from typing import Any

import torch
import torch.distributed as dist
import triton
import triton.language as tl

import trident

from ..platform import SIMULATOR
from . import arguments, harness, moe, plots


@triton.jit
def empty_kernel(x_ptr):
    """The launch-cost reference: a kernel that does nothing."""
    pass


@triton.jit
def round_trip_kernel(flag_ptr, rounds, rank, heap_bases, BARE: tl.constexpr):
    """Ranks 0 and 1 pass ``flag`` back and forth ``rounds`` times (others return at once).

    Round ``i``: rank 0 sets rank 1's flag to ``i`` and waits for its own to reach ``i``; rank 1
    waits for ``i``, then sets rank 0's. ``BARE`` uses the minimal protocol instead of trident's.
    """
    if rank < 2:
        peer = 1 - rank
        for i in range(1, rounds + 1):
            if rank == 1:
                _await(flag_ptr, i, rank, heap_bases, BARE)
            _notify(flag_ptr, i, rank, peer, heap_bases, BARE)
            if rank == 0:
                _await(flag_ptr, i, rank, heap_bases, BARE)


@triton.jit
def _notify(flag_ptr, value, rank, peer, heap_bases, BARE: tl.constexpr):
    if BARE:
        remote = trident.translate(flag_ptr, rank, peer, heap_bases)
        tl.atomic_xchg(remote, value, sem="release", scope="sys")
    else:
        trident.signal(flag_ptr, value, rank, peer, heap_bases)


@triton.jit
def _await(flag_ptr, value, rank, heap_bases, BARE: tl.constexpr):
    if BARE:
        seen = tl.load(flag_ptr, volatile=True)
        while seen < value:
            seen = tl.load(flag_ptr, volatile=True)
        tl.atomic_add(flag_ptr, 0, sem="acquire", scope="sys")  # the ordered read that publishes the data
    else:
        trident.wait(flag_ptr, value, rank, rank, heap_bases, cmp="ge")


_FLOOR_LIBRARY: list = []  # the Library behind torch.ops.trident_bench (its registrations end with it)


def custom_op_floor():
    """``torch.ops.trident_bench.fresh(t, op, group)``: a custom op that only returns
    ``torch.empty_like(t)``, registered as ``torch.ops.trident.*`` are (a Python kernel for CPU and
    CUDA) with ``torch.ops.trident.all_reduce``'s schema (each argument costs torch's dispatch about
    0.35 µs on a CPU, so the schema is part of the floor). Its host time is what any functional custom
    op of that signature pays before doing anything (torch's dispatch into Python and a fresh
    output): the floor under ``torch.ops.trident.all_reduce``."""
    if not _FLOOR_LIBRARY:
        library = torch.library.Library("trident_bench", "DEF")
        library.define('fresh(Tensor t, str op, str group, str algorithm="auto") -> Tensor')
        for key in ("CPU", "CUDA"):
            library.impl("fresh", lambda t, op, group, algorithm="auto": torch.empty_like(t), key)
        _FLOOR_LIBRARY.append(library)
    return torch.ops.trident_bench.fresh


def _host_cases(ctx, small_only: bool, dist_group=None):
    """``(name, group, call)`` triples of the host part; ``keep`` holds the tensors they use.
    ``dist_group``: the ``backend="trident"`` torch group the dist rows call (None: one is made here)."""
    dev, w = ctx.device, ctx.world_size
    n = 256  # 1 KiB of fp32: this rank's part, and what it sends each peer
    x, big, plain = ctx.randn(n), ctx.randn(n * w), torch.randn(n, device=dev)
    gathered, part, exchanged = (torch.empty(n * w, device=dev), torch.empty(n, device=dev),
                                 torch.empty(n * w, device=dev))
    dummy = torch.empty(1, device=dev)
    cases = [("empty triton launch", "reference", lambda: empty_kernel[(1,)](dummy)),
             ("torch x.add_(1)", "reference", lambda: plain.add_(1))]
    if ctx.platform.nccl_usable:
        cases.append(("nccl all_reduce 1 KiB", "reference", lambda: dist.all_reduce(plain)))
    cases += [("all_reduce 1 KiB (heap)", "collective", lambda: trident.ccl.all_reduce(ctx, x)),
              ("all_reduce 1 KiB (plain)", "collective", lambda: trident.ccl.all_reduce(ctx, plain)),
              ("all_gather 1 KiB", "collective", lambda: trident.ccl.all_gather(ctx, gathered, x)),
              ("reduce_scatter 1 KiB", "collective", lambda: trident.ccl.reduce_scatter(ctx, part, big)),
              ("all_to_all 1 KiB per peer", "collective", lambda: trident.ccl.all_to_all(ctx, exchanged, big)),
              ("broadcast 1 KiB", "collective", lambda: trident.ccl.broadcast(ctx, x, 0)),
              ("all_to_all_v 1 KiB per peer", "collective",  # the same splits every call: no upload
               lambda: trident.ccl.all_to_all_v(ctx, exchanged, big, [n] * w, [n] * w)),
              ("device_barrier", "collective", ctx.device_barrier)]
    if w > 1:  # split sizes that change every call (one rank has only one): each call uploads its table
        r = ctx.rank  # rank r sends c[(p - r) % w] rows to rank p: every rank sends and receives n * w rows
        turns = itertools.cycle([([c[(r - p) % w] for p in range(w)], [c[(p - r) % w] for p in range(w)])
                                 for c in ([n] * w, [n + 1, n - 1, *[n] * (w - 2)])])
        cases.append(("all_to_all_v 1 KiB per peer, new splits", "collective",
                      lambda: trident.ccl.all_to_all_v(ctx, exchanged, big, *next(turns))))
    # The entries users call: torch's custom ops (a fresh output every call, as a compiled model
    # makes) and torch.distributed on a trident group, each against the ccl call beneath it.
    name, ops, floor = ctx.group_name, torch.ops.trident, custom_op_floor()
    cases += [("custom op floor (dispatch + fresh out)", "reference", lambda: floor(plain, "sum", name)),
              ("torch.ops all_reduce 1 KiB (plain, fresh out)", "entry", lambda: ops.all_reduce(plain, "sum", name)),
              ("torch.ops all_reduce_ 1 KiB (heap, in place)", "entry", lambda: ops.all_reduce_(x, "sum", name)),
              ("torch.ops all_gather 1 KiB", "entry", lambda: ops.all_gather(x, name)),
              ("torch.ops reduce_scatter 1 KiB", "entry", lambda: ops.reduce_scatter(big, "sum", name)),
              ("torch.ops all_to_all 1 KiB per peer", "entry", lambda: ops.all_to_all(big, name)),
              ("torch.ops broadcast 1 KiB", "entry", lambda: ops.broadcast(x, 0, name))]
    group = dist_group or dist.new_group(list(range(w)), backend="trident")  # collective: every rank makes it
    cases += [("dist.all_reduce trident group 1 KiB", "entry", lambda: dist.all_reduce(plain, group=group)),
              ("dist.all_gather_into_tensor trident group 1 KiB", "entry",
               lambda: dist.all_gather_into_tensor(gathered, plain, group=group)),
              ("dist.reduce_scatter_tensor trident group 1 KiB", "entry",
               lambda: dist.reduce_scatter_tensor(part, exchanged, group=group))]
    shapes = [("small", 64, 64, 64)] + ([] if small_only else [("4096", 4096, 4096, 4096)])
    dtype = torch.float32 if ctx.platform.simulator else torch.bfloat16
    keep = [x, big]
    for label, M, N, K in shapes:
        A, B = torch.randn(M, K, device=dev, dtype=dtype), torch.randn(K, N, device=dev, dtype=dtype)
        C = ctx.empty(M, N * w, dtype=dtype)
        B_local = torch.randn(K, N, device=dev, dtype=dtype)
        A_local = torch.randn(M, K, device=dev, dtype=dtype)
        C_agg = torch.empty(M * w, N, device=dev, dtype=dtype)
        A_grs, C_grs = torch.randn(M * w, K, device=dev, dtype=dtype), torch.empty(M, N, device=dev, dtype=dtype)
        C_gar = torch.empty(M, N, device=dev, dtype=dtype)
        x_norm, weight = torch.randn(M, N, device=dev, dtype=dtype), torch.ones(N, device=dev, dtype=dtype)
        keep.append(C)
        fused: dict[str, Any] = dict(pattern="fused_sequential")
        cases += [(f"torch.matmul {label}", "reference", partial(torch.matmul, A, B)),
                  (f"ops.matmul {label}", "fused op", partial(trident.ops.matmul, A, B)),
                  (f"gemm_all_scatter {label}", "fused op",
                   partial(trident.ops.gemm_all_scatter, ctx, A, B_local, C, **fused)),
                  (f"all_gather_gemm {label}", "fused op",
                   partial(trident.ops.all_gather_gemm, ctx, A_local, B, C_agg, **fused)),
                  (f"gemm_reduce_scatter {label}", "fused op",
                   partial(trident.ops.gemm_reduce_scatter, ctx, A_grs, B, C_grs, **fused)),
                  (f"gemm_all_reduce {label}", "fused op",
                   partial(trident.ops.gemm_all_reduce, ctx, A, B, C_gar, **fused)),
                  (f"all_reduce_rmsnorm {label}", "fused op",
                   partial(trident.ops.all_reduce_rmsnorm, ctx, x_norm, weight, residual=x_norm))]
    return cases + _moe_cases(ctx), keep


def _moe_cases(ctx) -> list:
    """A decode-sized MoE dispatch and combine in each layout (128 tokens per rank, 8 in the simulator;
    bf16, hidden 256, top-2 of 4 experts per rank, ``max_tokens_per_rank`` given: no host sync), on
    ``trident bench moe``'s inputs."""
    tokens, hidden, k, experts = (8 if ctx.platform.simulator else 128), 256, 2, 4 * ctx.world_size
    x, _, _, idx, weights = moe.inputs(ctx, tokens, hidden, k, experts, seed=0)
    cases, latest = [], {}
    for layout in ("contiguous", "masked"):
        call = partial(trident.ops.moe_dispatch, ctx, x, idx, experts, max_tokens_per_rank=tokens, layout=layout)

        def dispatch(call=call, layout=layout):
            latest[layout] = call()  # a combine may only use its layout's latest dispatch
            return latest[layout]

        def combine(dispatch=dispatch, layout=layout):
            if layout not in latest:  # rows are timed round robin: a combine may come before any dispatch
                dispatch()
            return trident.ops.moe_combine(ctx, latest[layout].recv_x, weights, latest[layout])

        name = "" if layout == "contiguous" else f" {layout}"
        cases += [(f"moe_dispatch{name} {tokens} tokens", "moe", dispatch),
                  (f"moe_combine{name} {tokens} tokens", "moe", combine)]
    return cases


def _round_trips(ctx, args, record) -> None:
    """The flag round trip of ranks 0 and 1, trident's protocol against the bare one (collective)."""
    if ctx.world_size < 2:
        return
    for bare in (True, False):
        flag = ctx.zeros(1, dtype=torch.int64)
        ctx.barrier()  # every rank's flag is zero before any peer signals into it
        kernel = partial(round_trip_kernel[(1,)], flag, args.rounds, ctx.rank, ctx.heap_bases, BARE=bare)
        ms = harness.max_over_ranks(ctx, harness.time_ms(ctx, kernel, 0, 1))  # one launch: the flags count up
        ctx.barrier()
        record["rows"].append({"part": "round_trip", "name": "bare spin" if bare else "trident signal/wait",
                               "group": "reference" if bare else "trident", "time_us": ms * 1e3 / args.rounds,
                               "host_us": None})
        ctx.free(flag)


def _small_collectives(ctx, args, record) -> None:
    """Device time of one_shot all_reduce from 1 KiB up, eager and (GPU) in a CUDA graph."""
    for nbytes in arguments.size_sweep(1 << 10, args.max_bytes, 4):
        x = ctx.randn(nbytes // 4)
        fn = lambda x=x: trident.ccl.all_reduce(ctx, x, algorithm="one_shot")  # noqa: E731
        t = harness.measure(ctx.platform.timing_device, fn, args.warmup, args.repeats)
        record["rows"].append({"part": "collective", "name": "all_reduce one_shot eager", "group": "trident",
                               "bytes": nbytes, "time_us": harness.max_over_ranks(ctx, t.device_ms) * 1e3,
                               "host_us": harness.max_over_ranks(ctx, t.host_ms) * 1e3})
        if not ctx.platform.simulator:
            graph = torch.cuda.CUDAGraph()
            ctx.barrier()
            with torch.cuda.graph(graph):
                for _ in range(args.graph_calls):
                    fn()
            ctx.barrier()
            ms = harness.time_ms(ctx, graph.replay, 2, args.repeats)
            record["rows"].append({"part": "collective", "name": "all_reduce one_shot in a CUDA graph",
                                   "group": "trident", "bytes": nbytes, "host_us": None,
                                   "time_us": harness.max_over_ranks(ctx, ms) * 1e3 / args.graph_calls})
        ctx.barrier()
        ctx.free(x)


def run(ctx, args) -> dict:
    """All three parts (collective: every rank calls it); returns the record on every rank.

    Example::

        record = run(ctx, parse_args(["--max-bytes", "64K"]))
    """
    record = harness.new_record(ctx, "latency", harness.params(args))
    record["mps"] = {"active": "CUDA_MPS_PIPE_DIRECTORY" in os.environ,
                     "sm_share_percent": os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")}
    dist_group = dist.new_group(list(range(ctx.world_size)), backend="trident")
    cases, keep = _host_cases(ctx, args.small_only or ctx.platform.simulator, dist_group)  # keep: heap tensors
    # Round robin: every row gets a share of each round's calls, so a slow spell of a shared host
    # (which moved single rows by 2-3x on the H100 host of 2026-12-05) weighs on all rows alike. Each
    # round gives a row its device time and its host time per call (harness.measure).
    rounds = 1 if ctx.platform.simulator else max(1, args.host_rounds)
    per_round = args.repeats if ctx.platform.simulator else max(1, max(args.repeats, args.host_repeats) // rounds)
    samples: dict[str, list] = {name: [] for name, _, _ in cases}
    for i in harness.progress(range(rounds * len(cases)), ctx, args, "host time"):
        name, _, fn = cases[i % len(cases)]
        ctx.barrier()
        samples[name].append(harness.measure(ctx.platform.timing_device, fn, args.warmup if i < len(cases) else 1,
                                             per_round))
    for name, group, _ in cases:
        host_ms, device_ms = (statistics.median(getattr(t, field) for t in samples[name])
                              for field in ("host_ms", "device_ms"))
        record["rows"].append({"part": "host", "name": name, "group": group,
                               "host_us": harness.max_over_ranks(ctx, host_ms) * 1e3,
                               "time_us": harness.max_over_ranks(ctx, device_ms) * 1e3})
    ctx.barrier()
    ctx.free(*keep)
    # Which calls of the dist rows trident ran and which went to the fallback (all should be trident's).
    record["dist_backend_counts"] = dict(dist_group.counts)
    _round_trips(ctx, args, record)
    _small_collectives(ctx, args, record)
    record["goals"] = goals(record)
    return record


def _row(record, part: str, name: str) -> dict | None:
    return next((r for r in record["rows"] if r["part"] == part and r["name"] == name), None)


def goals(record: dict) -> list[dict]:
    """The latency issue's goals as ratios of rows measured in this run (only those measured here).

    Each entry: ``{"goal", "value", "target", "met"}``; ``value`` and ``target`` are ratios, or
    microseconds for the CUDA-graph all-reduce. Collectives' host time is compared with NCCL's
    all-reduce where NCCL ran (one GPU per rank, world 1 included), else with an empty Triton launch.

    Example::

        for g in goals(record): print(g["goal"], g["value"], g["met"])
    """
    out = []

    def add(goal, value, target, unit="x"):
        if value is not None:
            out.append({"goal": goal, "value": round(value, 3), "target": target, "unit": unit,
                        "met": bool(value <= target)})

    def ratio(a, b, field):
        return None if a is None or b is None or not b.get(field) else a[field] / b[field]

    nccl = _row(record, "host", "nccl all_reduce 1 KiB")
    add_ = _row(record, "host", "torch x.add_(1)")
    reference, target = (nccl, 1.0) if nccl else (_row(record, "host", "empty triton launch"), 1.5)
    assert reference is not None, "the record has no reference row"
    for r in record["rows"]:
        if r["part"] == "host" and r["group"] in ("collective", "entry"):
            add(f"host time of {r['name']} / {reference['name']}", ratio(r, reference, "host_us"), target)
            add(f"host time of {r['name']} / torch x.add_(1)", ratio(r, add_, "host_us"), 1.5)
        if r["part"] == "host" and r["group"] == "fused op" and not r["name"].startswith("ops.matmul"):
            matmul = _row(record, "host", "torch.matmul " + r["name"].rsplit(" ", 1)[1])
            add(f"host time of {r['name']} / torch.matmul", ratio(r, matmul, "host_us"), 1.5)
    # Every entry as fast as the call beneath it (the one pipeline and cache: issue 29).
    ccl_all_reduce = _row(record, "host", "all_reduce 1 KiB (plain)")
    custom_op = _row(record, "host", "torch.ops all_reduce 1 KiB (plain, fresh out)")
    add("host time of torch.ops all_reduce (fresh out) / ccl all_reduce (plain)",
        ratio(custom_op, ccl_all_reduce, "host_us"), 1.2)
    floor = _row(record, "host", "custom op floor (dispatch + fresh out)")
    if custom_op and floor and ccl_all_reduce:  # what trident adds above torch's own cost of any custom op
        add("host time of torch.ops all_reduce less the custom-op floor / ccl all_reduce (plain)",
            round((custom_op["host_us"] - floor["host_us"]) / ccl_all_reduce["host_us"], 3), 1.2)
    add("host time of torch.ops all_reduce_ (heap) / ccl all_reduce (heap)",
        ratio(_row(record, "host", "torch.ops all_reduce_ 1 KiB (heap, in place)"),
              _row(record, "host", "all_reduce 1 KiB (heap)"), "host_us"), 1.0)
    if nccl:
        add("host time of dist.all_reduce on a trident group / nccl dist.all_reduce",
            ratio(_row(record, "host", "dist.all_reduce trident group 1 KiB"), nccl, "host_us"), 1.0)
    add("signal/wait round trip / bare spin", ratio(_row(record, "round_trip", "trident signal/wait"),
                                                    _row(record, "round_trip", "bare spin"), "time_us"), 1.5)
    add("all_to_all / all_gather device time (1 KiB per peer)",
        ratio(_row(record, "host", "all_to_all 1 KiB per peer"), _row(record, "host", "all_gather 1 KiB"),
              "time_us"), 2.0)
    graph = next((r for r in record["rows"] if r["name"] == "all_reduce one_shot in a CUDA graph"
                  and r.get("bytes") == 1024), None)
    add("all_reduce 1 KiB in a CUDA graph, us per call", None if graph is None else graph["time_us"], 5.0, "us")
    return out


def parse_args(argv=None) -> argparse.Namespace:
    """The benchmark's arguments (``trident bench latency --help``)."""
    parser = argparse.ArgumentParser(prog="trident bench latency", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=10_000, help="flag round trips in one kernel")
    parser.add_argument("--max-bytes", type=arguments.parse_bytes, default=1 << 20, help="largest all_reduce")
    parser.add_argument("--graph-calls", type=int, default=100, help="calls captured in one CUDA graph")
    parser.add_argument("--small-only", action="store_true", help="fused ops at the small shape only (no 4096^3)")
    parser.add_argument("--host-repeats", type=int, default=100,
                        help="device-timed calls per host row, spread over the rounds (each round also times "
                             "the host in batches of back-to-back calls)")
    parser.add_argument("--host-rounds", type=int, default=5,
                        help="rounds over every host row; a row's figures are the medians of its rounds'")
    arguments.add_common_args(parser, "latency", warmup=5, repeats=20)
    return parser.parse_args(argv)


def sim_sizes(args) -> None:
    """The simulator checks the benchmark, not the speed: few round trips, small sizes, few repeats."""
    args.rounds, args.max_bytes = min(args.rounds, 20), min(args.max_bytes, 4096)
    args.repeats, args.warmup, args.small_only = min(args.repeats, 2), min(args.warmup, 1), True


def report(record: dict, out: str) -> list[str]:
    """Write the JSON and the plot into ``out`` and print the table; returns the files written."""
    columns = [("part", "part", ""), ("name", "call", ""), ("bytes", "bytes", "d"), ("host_us", "host us", ".1f"),
               ("time_us", "device us", ".1f")]
    host = [r for r in record["rows"] if r["part"] == "host"]
    for g in record.get("goals", []):
        print(f"goal {'met   ' if g['met'] else 'missed'} {g['goal']}: {g['value']} {g['unit']} "
              f"(target <= {g['target']} {g['unit']})")
    return harness.write_report(record, out, columns, plots=[lambda: plots.bars(
        {**record, "rows": _host_panels(host)}, f"{out}/latency_host.png", "family", "name", "host_us",
        "host us per call", "host time per call (dashed: the reference; in brackets: time / reference)",
        reference=lambda r: r["is_reference"], ratio="of")])


def _host_panels(host: list[dict]) -> list[dict]:
    """The host rows by family, each with its reference: the collectives against NCCL's all-reduce
    (or an empty Triton launch without NCCL), the fused ops of a shape against torch.matmul of it."""
    names = {r["name"] for r in host}
    base = "nccl all_reduce 1 KiB" if "nccl all_reduce 1 KiB" in names else "empty triton launch"
    out = []
    for r in host:
        if r["group"] == "collective":
            out.append({**r, "family": "collectives, 1 KiB", "is_reference": False})
        elif r["group"] == "fused op":
            shape = r["name"].rsplit(" ", 1)[-1]
            out.append({**r, "family": f"fused ops, {shape} shape", "is_reference": False})
        elif r["group"] == "moe":
            out.append({**r, "family": "MoE dispatch and combine", "is_reference": False})
        elif r["name"].startswith("torch.matmul "):
            out.append({**r, "family": f"fused ops, {r['name'].rsplit(' ', 1)[-1]} shape", "is_reference": True})
        else:
            out.append({**r, "family": "launch floor (references)", "is_reference": False})
        if r["name"] == base:
            out.append({**r, "family": "collectives, 1 KiB", "is_reference": True})
    return out


def main(argv=None) -> int:
    """Run ``trident bench latency`` on this rank (``trident bench latency -n N`` starts the ranks); returns 0."""
    harness.bench_main(argv, parse_args, run, report, (64 << 20) if SIMULATOR else (1 << 30), sim_sizes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
