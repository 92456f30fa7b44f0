"""``trident bench p2p``: bandwidth (or rate) of each device-API op from every rank to every peer.

For every op and every pair (rank, peer), only ``rank`` runs (the others wait at a barrier), so
each cell of the W x W matrix is one link direction alone; the diagonal is the rank's own heap
through the same translated path. Memory ops move ``--bytes`` (GB/s counts the bytes that cross
to or from the peer, once); atomics run on ``--atomic-elems`` int32 counters, one op per element
(Mops/s). One program per ``--block`` elements. Every measurement is checked: the data (or the
counters) must be what the op wrote.

    trident bench p2p -n 4 --bytes 256M --out results/p2p

Writes ``p2p.json`` and ``p2p.png`` (a heatmap per op) into ``--out``.
"""

from __future__ import annotations

import argparse
import sys

import torch
import triton
import triton.language as tl

import trident

from . import arguments, harness, plots

MEMORY_OPS = ("load", "store", "get", "put")
ATOMIC_OPS = ("atomic_add", "atomic_xchg", "atomic_cas")
OPS = MEMORY_OPS + ATOMIC_OPS


@triton.jit
def p2p_memory_kernel(x_ptr, y_ptr, n, rank, peer, heap_bases, OP: tl.constexpr, BLOCK: tl.constexpr):
    """One BLOCK of x -> y through the device API; ``peer``'s copy is the remote end."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    if OP == "load":  # read peer's x, write my y
        tl.store(y_ptr + offs, trident.load(x_ptr + offs, rank, peer, heap_bases, mask=mask), mask=mask)
    elif OP == "store":  # read my x, write peer's y
        trident.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask), rank, peer, heap_bases, mask=mask)
    elif OP == "get":  # peer's x -> my y
        trident.get(x_ptr + offs, y_ptr + offs, rank, peer, heap_bases, mask=mask)
    else:  # put: my x -> peer's y
        trident.put(x_ptr + offs, y_ptr + offs, rank, peer, heap_bases, mask=mask)


@triton.jit
def p2p_atomic_kernel(c_ptr, value, rank, peer, heap_bases, OP: tl.constexpr, SEM: tl.constexpr,
                      BLOCK: tl.constexpr):
    """One atomic per element of one BLOCK of ``peer``'s counters (the count is a multiple of BLOCK)."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ones = tl.full([BLOCK], 1, tl.int32)
    if OP == "atomic_add":
        trident.atomic_add(c_ptr + offs, ones, rank, peer, heap_bases, sem=SEM, scope="sys")
    elif OP == "atomic_xchg":
        trident.atomic_xchg(c_ptr + offs, ones * value, rank, peer, heap_bases, sem=SEM, scope="sys")
    else:  # the first call swaps 0 for value; later calls compare, fail and still make the round trip
        trident.atomic_cas(c_ptr + offs, ones * 0, ones * value, rank, peer, heap_bases, sem=SEM, scope="sys")


def fill_pattern(t: torch.Tensor, rank: int) -> torch.Tensor:
    """Fill ``t`` (1-D) with the data rank ``rank`` sends: exact in fp16/bf16, different for
    neighbouring ranks; in chunks, so a 2 GiB buffer needs no 8 GiB index temporary."""
    chunk = 1 << 24
    for i in range(0, t.numel(), chunk):
        m = min(chunk, t.numel() - i)
        t[i:i + m] = ((torch.arange(i, i + m, device=t.device) % 127) + 128 * (rank % 8)).to(t.dtype)
    return t


def parse_args(argv=None) -> argparse.Namespace:
    """The benchmark's arguments (``trident bench p2p --help``)."""
    parser = argparse.ArgumentParser(prog="trident bench p2p", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bytes", type=arguments.parse_bytes, default=256 << 20,
                        help="bytes per memory-op measurement (default 256M)")
    parser.add_argument("--atomic-elems", type=int, default=1 << 22, help="int32 counters per atomic measurement")
    parser.add_argument("--ops", nargs="+", choices=OPS, default=list(OPS))
    parser.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    parser.add_argument("--block", type=int, default=4096, help="elements per program")
    parser.add_argument("--num-warps", type=int, default=8)
    parser.add_argument("--sem", default="relaxed", choices=["relaxed", "acquire", "release", "acq_rel"],
                        help="memory order of the atomics (scope is sys)")
    arguments.add_common_args(parser, "p2p")
    return parser.parse_args(argv)


def sim_sizes(args) -> None:
    """Shrink a run for the simulator (Triton's interpreter): check the path, not the speed."""
    args.bytes, args.atomic_elems = min(args.bytes, 8 << 10), min(args.atomic_elems, 512)
    args.block, args.num_warps = min(args.block, 256), 4
    args.warmup, args.repeats = min(args.warmup, 1), min(args.repeats, 2)


def _measure(ctx, args, op, peer, bufs) -> dict:
    """Run and check one (this rank -> peer) measurement; only the rank that issues calls this."""
    x, y, c, n, na = bufs
    calls = args.warmup + max(args.repeats, 1)
    if op in MEMORY_OPS:
        grid = (triton.cdiv(n, args.block),)
        fn = lambda: p2p_memory_kernel[grid](x, y, n, ctx.rank, peer, ctx.heap_bases, OP=op, BLOCK=args.block,
                                             num_warps=args.num_warps)
    else:
        grid = (na // args.block,)
        fn = lambda: p2p_atomic_kernel[grid](c, ctx.rank + 1, ctx.rank, peer, ctx.heap_bases, OP=op, SEM=args.sem,
                                             BLOCK=args.block, num_warps=args.num_warps)
    ms = harness.time_ms(ctx, fn, args.warmup, args.repeats)
    harness.synchronize(ctx)
    if op in ("load", "get"):  # peer's x landed in my y
        ok = torch.equal(y, ctx.peer_view(x, peer).to(ctx.device))
    elif op in ("store", "put"):  # my x landed in peer's y
        ok = torch.equal(ctx.peer_view(y, peer).to(ctx.device), x)
    else:
        want = calls if op == "atomic_add" else ctx.rank + 1
        ok = bool((ctx.peer_view(c, peer).to(ctx.device) == want).all())
    row = {"op": op, "rank": ctx.rank, "peer": peer, "ms": ms, "grid": grid[0], "correct": ok}
    if op in MEMORY_OPS:
        row.update(bytes=n * x.element_size(), gbps=n * x.element_size() / (ms * 1e-3) / 1e9)
        row["value"] = row["gbps"]
    else:
        row.update(ops=na, mops=na / (ms * 1e-3) / 1e6)
        row["value"] = row["mops"]
    return row


def run(ctx, args) -> dict:
    """Measure every op on every (rank, peer) pair (collective); returns the record on every rank.

    Example::

        record = run(ctx, parse_args(["--bytes", "64M"]))
    """
    dtype = getattr(torch, args.dtype)
    n = max(args.bytes // dtype.itemsize, 1)
    na = triton.cdiv(args.atomic_elems, args.block) * args.block  # atomic_cas has no mask
    x, y = ctx.empty(n, dtype=dtype), ctx.empty(n, dtype=dtype)
    c = ctx.zeros(na, dtype=torch.int32)
    fill_pattern(x, ctx.rank)
    record = harness.new_record(ctx, "p2p", {**harness.params(args),
                                            "elements": n, "atomic_elements": na, "atomic_scope": "sys"})
    pairs = [(op, src, peer) for op in args.ops for src in range(ctx.world_size) for peer in range(ctx.world_size)]
    for op, src, peer in harness.progress(pairs, ctx, args, "p2p"):
        y.zero_()
        c.zero_()
        ctx.barrier()  # every rank's buffers are reset, and only src runs from here
        row = _measure(ctx, args, op, peer, (x, y, c, n, na)) if ctx.rank == src else None
        ctx.barrier()
        record["rows"].append(ctx.broadcast(row, src=src))
    ctx.free(x, y, c)
    record["all_correct"] = all(r["correct"] for r in record["rows"])
    return record


def unit(op: str) -> str:
    """The unit of an op's figure: GB/s for memory ops, Mops/s for atomics."""
    return "GB/s" if op in MEMORY_OPS else "Mops/s"


def report(record: dict, out: str) -> list[str]:
    """Write the JSON and the heatmaps into ``out``, print the table; returns the files written."""
    columns = [("op", "op", ""), ("rank", "rank", "d"), ("peer", "peer", "d"), ("grid", "programs", "d"),
               ("ms", "ms", ".4f"), ("gbps", "GB/s", ".4g"), ("mops", "Mops/s", ".4g"), ("correct", "ok", "")]
    ops = list(dict.fromkeys(r["op"] for r in record["rows"]))
    return harness.write_report(record, out, columns,
                                plots=[lambda: plots.heatmaps(record, f"{out}/p2p.png", ops, "value", unit)],
                                wrong="some measurements moved wrong data (see 'ok')")


def _heap(args) -> int:
    dtype_bytes = torch.tensor([], dtype=getattr(torch, args.dtype)).element_size()
    return harness.heap_for(2 * args.bytes + 4 * args.atomic_elems + 8 * args.block * dtype_bytes)


def main(argv=None) -> int:
    """Run ``trident bench p2p`` on this rank (started once per rank by ``trident bench``); returns the exit code."""
    record = harness.bench_main(argv, parse_args, run, report, _heap, sim_sizes)
    return 0 if record["all_correct"] else 1


if __name__ == "__main__":
    sys.exit(main())
