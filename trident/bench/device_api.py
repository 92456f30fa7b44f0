"""``trident bench device-api``: the cost of the device API's pointer translation.

Every variant copies one heap buffer into another on the rank's own heap (``peer == rank``),
once with plain ``tl.load``/``tl.store`` and once through each device-API call, so the only
difference is trident's translation (two scalar loads of ``heap_bases`` and an add). Bandwidth
counts bytes read plus bytes written; the best of ``--blocks`` for each variant. On a GPU it
also reports the widest global access in the compiled PTX (``ld.global.v4`` / ``st.global.v4``
are the 16-byte vector accesses translation must keep). With several ranks, all measure at
once and the slowest counts.

    trident bench device-api --sizes-mib 256 1024 --out results/device_api

Writes ``device_api_bandwidth.json`` and ``device_api_bandwidth.png`` into ``--out``.
"""

from __future__ import annotations

import argparse
import sys

import torch
import triton
import triton.language as tl

import trident

from . import arguments, harness, plots


@triton.jit
def plain_copy_kernel(x_ptr, y_ptr, n, rank, heap_bases, BLOCK: tl.constexpr):
    """The reference: one BLOCK of x -> y with plain tl.load / tl.store."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask), mask=mask)


@triton.jit
def load_kernel(x_ptr, y_ptr, n, rank, heap_bases, BLOCK: tl.constexpr):
    """x -> y, reading x through trident.load (peer == rank)."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, trident.load(x_ptr + offs, rank, rank, heap_bases, mask=mask), mask=mask)


@triton.jit
def store_kernel(x_ptr, y_ptr, n, rank, heap_bases, BLOCK: tl.constexpr):
    """x -> y, writing y through trident.store (peer == rank)."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    trident.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask), rank, rank, heap_bases, mask=mask)


@triton.jit
def get_kernel(x_ptr, y_ptr, n, rank, heap_bases, BLOCK: tl.constexpr):
    """x -> y with trident.get (peer == rank)."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    trident.get(x_ptr + offs, y_ptr + offs, rank, rank, heap_bases, mask=offs < n)


@triton.jit
def put_kernel(x_ptr, y_ptr, n, rank, heap_bases, BLOCK: tl.constexpr):
    """x -> y with trident.put (peer == rank)."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    trident.put(x_ptr + offs, y_ptr + offs, rank, rank, heap_bases, mask=offs < n)


@triton.jit
def copy_kernel(x_ptr, y_ptr, n, rank, heap_bases, BLOCK: tl.constexpr):
    """x -> y with trident.copy (both ends on this rank)."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    trident.copy(x_ptr + offs, y_ptr + offs, rank, rank, rank, heap_bases, mask=offs < n)


VARIANTS = {"plain copy": plain_copy_kernel, "trident.load": load_kernel, "trident.store": store_kernel,
            "trident.get": get_kernel, "trident.put": put_kernel, "trident.copy": copy_kernel}


def vector_width(compiled) -> str:
    """The widest global load and store in a compiled kernel's PTX (``"ld v4 / st v4"``), or ``"n/a"``."""
    ptx = getattr(compiled, "asm", {}).get("ptx", "") if compiled is not None else ""
    if not ptx:
        return "n/a"
    loads = "v4" if "ld.global.v4" in ptx else ("v2" if "ld.global.v2" in ptx else "scalar")
    stores = "v4" if "st.global.v4" in ptx else ("v2" if "st.global.v2" in ptx else "scalar")
    return f"ld {loads} / st {stores}"


def _launcher(ctx, kernel, x, y, n: int, block: int):
    """A call that launches ``kernel`` over all of ``x`` and returns the compiled kernel."""
    grid, warps = (triton.cdiv(n, block),), 8 if block >= 4096 else 4
    return lambda: kernel[grid](x, y, n, ctx.rank, ctx.heap_bases, BLOCK=block, num_warps=warps)


def parse_args(argv=None) -> argparse.Namespace:
    """The benchmark's arguments (``trident bench device-api --help``)."""
    parser = argparse.ArgumentParser(prog="trident bench device-api", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes-mib", type=int, nargs="+", default=[256, 1024])
    parser.add_argument("--blocks", type=int, nargs="+", default=[1024, 2048, 4096, 8192])
    parser.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    arguments.add_common_args(parser, "device_api", warmup=5, repeats=20)
    return parser.parse_args(argv)


def sim_sizes(args) -> None:
    """The simulator runs tiny sizes: it checks the benchmark, not the speed."""
    args.sizes_kib, args.blocks = [4], [256]
    args.warmup, args.repeats = min(args.warmup, 1), min(args.repeats, 2)


def run(ctx, args) -> dict:
    """Measure every variant at every size (collective); returns the record on every rank.

    Example::

        record = run(ctx, parse_args(["--sizes-mib", "64"]))
    """
    dtype = getattr(torch, args.dtype)
    sizes = [kib << 10 for kib in args.sizes_kib] if getattr(args, "sizes_kib", None) else \
        [mib << 20 for mib in args.sizes_mib]
    record = harness.new_record(ctx, "device-api", {**harness.params(args),
                                                    "sizes_bytes": sizes})
    for size in sizes:
        n = size // dtype.itemsize
        x, y = ctx.randn(n, dtype=dtype), ctx.empty(n, dtype=dtype)
        for name, kernel in harness.progress(VARIANTS.items(), ctx, args, arguments.human_bytes(size)):
            y.zero_()
            best = (float("inf"), None, "n/a")
            for block in args.blocks:
                launch = _launcher(ctx, kernel, x, y, n, block)
                compiled = launch()
                ctx.barrier()  # every rank measures at once; the slowest counts
                ms = harness.max_over_ranks(ctx, harness.time_ms(ctx, launch, args.warmup, args.repeats))
                if ms < best[0]:
                    best = (ms, block, vector_width(None if ctx.platform.simulator else compiled))
            correct = bool(all(harness.all_values(ctx, torch.equal(x, y))))
            record["rows"].append({"variant": name, "bytes": size, "size": arguments.human_bytes(size),
                                   "block": best[1], "ms": best[0], "gb_per_s": 2 * size / (best[0] * 1e-3) / 1e9,
                                   "vector_access": best[2], "correct": correct})
        ctx.free(x, y)
    for row in record["rows"]:
        plain = next(r for r in record["rows"] if r["variant"] == "plain copy" and r["bytes"] == row["bytes"])
        row["fraction_of_plain"] = row["gb_per_s"] / plain["gb_per_s"]
    record["all_correct"] = all(r["correct"] for r in record["rows"])
    return record


def report(record: dict, out: str) -> list[str]:
    """Write the JSON and the bar chart into ``out``, print the table; returns the files written."""
    columns = [("variant", "variant", ""), ("size", "size", ""), ("block", "block", "d"), ("ms", "ms", ".4f"),
               ("gb_per_s", "GB/s", ".4g"), ("fraction_of_plain", "vs plain", ".1%"),
               ("vector_access", "vector access", ""), ("correct", "ok", "")]
    what = "trident device API (peer == rank) vs a plain Triton copy"
    return harness.write_report(
        record, out, columns, name="device_api_bandwidth", wrong="a variant copied wrong data",
        plots=[lambda: plots.bars(record, f"{out}/device_api_bandwidth.png", "size", "variant", "gb_per_s",
                                  "GB/s (read + write)", what + " (dashed: the plain copy)",
                                  reference="plain copy", ratio="of")])


def _heap(args) -> int:
    dtype_bytes = torch.tensor([], dtype=getattr(torch, args.dtype)).element_size()
    biggest = (max(args.sizes_kib) << 10) if getattr(args, "sizes_kib", None) else (max(args.sizes_mib) << 20)
    return harness.heap_for(2 * biggest + 8 * max(args.blocks) * dtype_bytes)


def main(argv=None) -> int:
    """Run ``trident bench device-api`` on this rank; returns the exit code (1 if a copy was wrong)."""
    record = harness.bench_main(argv, parse_args, run, report, _heap, sim_sizes)
    return 0 if record["all_correct"] else 1


if __name__ == "__main__":
    sys.exit(main())
