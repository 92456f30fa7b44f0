"""``trident bench all-load`` / ``all-store``: every rank reads from (writes to) all peers at once.

Each rank owns a buffer ``x`` of B bytes and a receive buffer ``y`` of W slots of B bytes.
``all-load``: every rank pulls every peer's ``x`` into its slot of ``y`` (a pull all-gather).
``all-store``: every rank pushes its ``x`` into its own slot of every peer's ``y`` (a push
all-gather). With one rank, the "peer" is the rank itself. One kernel per rank; its programs
interleave the peers (program i serves peer i % peers), so all links are busy at once.

Per-rank bandwidth counts the bytes that cross into (out of) one rank: ``peers * B / t``, with
``t`` the slowest rank's median time; aggregate = W x per-rank. It equals nccl-tests' bus
bandwidth of an all-gather of B bytes per rank, so the reference lines measured in the same run
compare directly: the copy engine (torch copies between each rank's buffer and the IPC-mapped
peer views, ``ctx.peer_view``; a host memcpy in the simulator) and, with one GPU per rank,
NCCL's all-gather.

    trident bench all-load -n 4 --min-bytes 4K --max-bytes 2G --out results/all_load

Writes ``all_load.json`` (``all_store.json``) and the curve PNG into ``--out``.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist
import triton
import triton.language as tl

import trident

from . import arguments, harness, plots
from .p2p import fill_pattern


@triton.jit
def _peer_block(n, peers, rank, world_size, BLOCK: tl.constexpr):
    """This program's ``(peer, offs, mask)``: program i serves peer ((rank + 1 + i % peers) % world),
    block i // peers (the programs interleave the peers, so all links are busy at once)."""
    pid = tl.program_id(0)
    peer = (rank + 1 + pid % peers) % world_size
    offs = (pid // peers).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    return peer, offs, offs < n


@triton.jit
def all_load_kernel(x_ptr, y_ptr, n, peers, rank, world_size, heap_bases, BLOCK: tl.constexpr):
    """Program i copies block i // peers of peer ((rank + 1 + i % peers) % world)'s x into y[peer]."""
    peer, offs, mask = _peer_block(n, peers, rank, world_size, BLOCK)
    values = trident.load(x_ptr + offs, rank, peer, heap_bases, mask=mask)
    tl.store(y_ptr + tl.cast(peer, tl.int64) * n + offs, values, mask=mask)


@triton.jit
def all_store_kernel(x_ptr, y_ptr, n, peers, rank, world_size, heap_bases, BLOCK: tl.constexpr):
    """Program i copies block i // peers of my x into slot ``rank`` of peer ((rank + 1 + i % peers) % world)'s y."""
    peer, offs, mask = _peer_block(n, peers, rank, world_size, BLOCK)
    values = tl.load(x_ptr + offs, mask=mask)
    trident.store(y_ptr + tl.cast(rank, tl.int64) * n + offs, values, rank, peer, heap_bases, mask=mask)


def parse_args(argv=None) -> argparse.Namespace:
    """The benchmark's arguments (``trident bench all-load --help``)."""
    parser = argparse.ArgumentParser(prog="trident bench all-load|all-store", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=["load", "store"], required=True)
    arguments.add_size_range_args(parser, 4 << 10, 2 << 30, what="B")
    parser.add_argument("--factor", type=int, default=2, help="B grows by this factor")
    parser.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    parser.add_argument("--block", type=int, default=4096, help="elements per program")
    parser.add_argument("--num-warps", type=int, default=8)
    parser.add_argument("--no-reference", action="store_true", help="skip the copy-engine and NCCL lines")
    arguments.add_common_args(parser, "all_load")
    args = parser.parse_args(argv)
    if args.out == "results/all_load" and args.mode == "store":
        args.out = "results/all_store"
    return args


def sim_sizes(args) -> None:
    """Shrink a run for the simulator (Triton's interpreter): check the path, not the speed."""
    arguments.cap_size_range(args, 16 << 10)
    args.factor = max(args.factor, 2)
    args.block, args.num_warps = min(args.block, 256), 4
    args.warmup, args.repeats = min(args.warmup, 1), min(args.repeats, 2)


def _peers(ctx) -> list[int]:
    w = ctx.world_size
    return [(ctx.rank + 1 + j) % w for j in range(max(w - 1, 1))]


def _check(ctx, args, x, y, n) -> bool:
    """After one trident call: every slot it wrote holds the right rank's data."""
    ctx.barrier()
    ok = True
    for peer in _peers(ctx):
        if args.mode == "load":  # peer's x is in my slot `peer`
            ok &= torch.equal(y[peer * n:(peer + 1) * n], ctx.peer_view(x, peer)[:n].to(ctx.device))
        else:  # my x is in slot `rank` of peer's y
            ok &= torch.equal(ctx.peer_view(y, peer)[ctx.rank * n:(ctx.rank + 1) * n].to(ctx.device), x[:n])
    return bool(all(harness.all_values(ctx, ok)))


def _copy_engine(ctx, args, x, y, n):
    """The same movement as torch copies through the IPC-mapped peer views (the copy engine on GPUs)."""
    views = [(peer, ctx.peer_view(x if args.mode == "load" else y, peer)) for peer in _peers(ctx)]
    r = ctx.rank
    if args.mode == "load":
        return lambda: [y[p * n:(p + 1) * n].copy_(v[:n], non_blocking=True) for p, v in views]
    return lambda: [v[r * n:(r + 1) * n].copy_(x[:n], non_blocking=True) for _, v in views]


def _launcher(ctx, args, kernel, grid, x, y, n: int, peers: int):
    """A call that launches the trident kernel for buffers of ``n`` elements."""
    return lambda: kernel[grid](x, y, n, peers, ctx.rank, ctx.world_size, ctx.heap_bases, BLOCK=args.block,
                                num_warps=args.num_warps)


def _timed(ctx, args, fn) -> float:
    ctx.barrier()  # everyone starts together
    return harness.max_over_ranks(ctx, harness.time_ms(ctx, fn, args.warmup, args.repeats))


def run(ctx, args) -> dict:
    """Sweep B from ``--min-bytes`` to ``--max-bytes`` (collective); returns the record on every rank.

    Example::

        record = run(ctx, parse_args(["--mode", "load", "--max-bytes", "64M"]))
    """
    dtype = getattr(torch, args.dtype)
    w, peers = ctx.world_size, max(ctx.world_size - 1, 1)
    sizes = arguments.size_sweep(args.min_bytes, args.max_bytes, args.factor)
    nmax = max(sizes[-1] // dtype.itemsize, 1)
    x, y = ctx.empty(nmax, dtype=dtype), ctx.zeros(w * nmax, dtype=dtype)
    fill_pattern(x, ctx.rank)
    kernel = all_load_kernel if args.mode == "load" else all_store_kernel
    with_nccl = not args.no_reference and ctx.platform.nccl_usable and w > 1 and dist.is_initialized()
    gathered = torch.empty(w * nmax, dtype=dtype, device=ctx.device) if with_nccl else None
    name = f"all-{args.mode}"
    record = harness.new_record(ctx, name, {**harness.params(args),
                                            "peers_per_rank": peers, "sizes": sizes})
    record["references"] = {"copy_engine": not args.no_reference, "nccl_all_gather": with_nccl}
    if w == 1:
        alone = "one rank: its peer is itself, so this measures local memory, not a link"
        record["note"] = f"{record['note']}; {alone}" if record["note"] else alone
    for size in harness.progress(sizes, ctx, args, name):
        n = max(size // dtype.itemsize, 1)
        grid = (triton.cdiv(n, args.block) * peers,)
        fn = _launcher(ctx, args, kernel, grid, x, y, n, peers)
        y.zero_()
        ctx.barrier()
        fn()
        correct = _check(ctx, args, x, y, n)
        moved = peers * n * dtype.itemsize  # bytes into (out of) one rank
        row = {"bytes": n * dtype.itemsize, "grid": grid[0], "correct": correct}
        row["trident_ms"] = _timed(ctx, args, fn)
        row["trident_gbps"] = w * moved / (row["trident_ms"] * 1e-3) / 1e9
        row["per_rank_gbps"] = row["trident_gbps"] / w
        if not args.no_reference:
            row["copy_engine_ms"] = _timed(ctx, args, _copy_engine(ctx, args, x, y, n))
            row["copy_engine_gbps"] = w * moved / (row["copy_engine_ms"] * 1e-3) / 1e9
        if with_nccl:
            assert gathered is not None  # made when with_nccl
            out, inp = gathered[:w * n], x[:n]
            row["nccl_ms"] = _timed(ctx, args, lambda o=out, i=inp: dist.all_gather_into_tensor(o, i))
            row["nccl_gbps"] = w * moved / (row["nccl_ms"] * 1e-3) / 1e9
        record["rows"].append(row)
    ctx.free(x, y)
    record["all_correct"] = all(r["correct"] for r in record["rows"])
    return record


def report(record: dict, out: str) -> list[str]:
    """Write the JSON and the curve PNG into ``out``, print the table; returns the files written."""
    stem = record["benchmark"].replace("-", "_")
    rows = [dict(r, size=arguments.human_bytes(r["bytes"])) for r in record["rows"]]
    columns = [("size", "B per rank", ""), ("grid", "programs", "d"), ("trident_ms", "ms", ".4f"),
               ("trident_gbps", "GB/s (all ranks)", ".4g"), ("per_rank_gbps", "GB/s per rank", ".4g"),
               ("copy_engine_gbps", "copy engine GB/s", ".4g"), ("nccl_gbps", "NCCL GB/s", ".4g"),
               ("correct", "ok", "")]
    series = {"trident_gbps": f"trident {record['params']['mode']}", "copy_engine_gbps": "copy engine (torch copy)",
              "nccl_gbps": "NCCL all-gather"}
    fractions = {"of copy engine": ("trident_gbps", "copy_engine_gbps"), "of NCCL": ("trident_gbps", "nccl_gbps")}
    what = f"trident {record['benchmark']}: every rank {record['params']['mode']}s all peers at once"
    return harness.write_report(
        record, out, columns, rows=rows, wrong="some sizes moved wrong data (see 'ok')",
        plots=[lambda: plots.curves(record, f"{out}/{stem}.png", "bytes", series, "aggregate GB/s (all ranks)",
                                    what, fractions)])


def _heap(args) -> int:
    w = int(os.environ.get("WORLD_SIZE", "1"))  # the heap must be sized before init
    itemsize = torch.tensor([], dtype=getattr(torch, args.dtype)).element_size()
    return harness.heap_for((w + 1) * args.max_bytes + 4 * args.block * itemsize)


def main(argv=None) -> int:
    """Run ``trident bench all-load|all-store`` on this rank; returns the exit code (1 if data was wrong)."""
    record = harness.bench_main(argv, parse_args, run, report, _heap, sim_sizes)
    return 0 if record["all_correct"] else 1


if __name__ == "__main__":
    sys.exit(main())
