"""Bandwidth of the device API's translated accesses against a plain Triton copy kernel.

Every variant copies one buffer into another on the local heap (peer == rank), so the only
difference from the plain copy is trident's pointer translation: this measures its cost.
Bandwidth counts bytes read plus bytes written. The best block size is taken for each variant.
The script also reports whether the compiled kernel kept 16-byte vector loads and stores
(``ld.global.v4`` / ``st.global.v4`` in the PTX), which translation must not break.

    python benchmarks/device_api_bandwidth.py --sizes-mib 256 1024 --out results/device_api

Writes ``device_api_bandwidth.json`` and ``device_api_bandwidth.png`` into ``--out``.
On the CPU simulator it runs tiny sizes only, to exercise the script itself.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform

import torch
import triton
import triton.language as tl

import trident


@triton.jit
def plain_copy_kernel(x_ptr, y_ptr, n, rank, heap_bases, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask), mask=mask)


@triton.jit
def load_kernel(x_ptr, y_ptr, n, rank, heap_bases, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, trident.load(x_ptr + offs, rank, rank, heap_bases, mask=mask), mask=mask)


@triton.jit
def store_kernel(x_ptr, y_ptr, n, rank, heap_bases, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    trident.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask), rank, rank, heap_bases, mask=mask)


@triton.jit
def get_kernel(x_ptr, y_ptr, n, rank, heap_bases, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    trident.get(x_ptr + offs, y_ptr + offs, rank, rank, heap_bases, mask=offs < n)


@triton.jit
def put_kernel(x_ptr, y_ptr, n, rank, heap_bases, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    trident.put(x_ptr + offs, y_ptr + offs, rank, rank, heap_bases, mask=offs < n)


@triton.jit
def copy_kernel(x_ptr, y_ptr, n, rank, heap_bases, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    trident.copy(x_ptr + offs, y_ptr + offs, rank, rank, rank, heap_bases, mask=offs < n)


VARIANTS = {"plain copy": plain_copy_kernel, "trident.load": load_kernel, "trident.store": store_kernel,
            "trident.get": get_kernel, "trident.put": put_kernel, "trident.copy": copy_kernel}


def _vector_width(compiled) -> str:
    ptx = getattr(compiled, "asm", {}).get("ptx", "")
    if not ptx:
        return "n/a"
    loads = "v4" if "ld.global.v4" in ptx else ("v2" if "ld.global.v2" in ptx else "scalar")
    stores = "v4" if "st.global.v4" in ptx else ("v2" if "st.global.v2" in ptx else "scalar")
    return f"ld {loads} / st {stores}"


def measure(ctx, kernel, x, y, block: int, reps_ms: int) -> tuple[float, str]:
    n = x.numel()
    grid = (triton.cdiv(n, block),)
    args = (x, y, n, ctx.rank, ctx.heap_bases)
    compiled = kernel[grid](*args, BLOCK=block, num_warps=8 if block >= 4096 else 4)
    if ctx.backend == "sim":
        return float("nan"), "n/a"
    ms = triton.testing.do_bench(lambda: kernel[grid](*args, BLOCK=block, num_warps=8 if block >= 4096 else 4),
                                 warmup=max(reps_ms // 4, 5), rep=reps_ms, return_mode="median")
    return ms, _vector_width(compiled)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes-mib", type=int, nargs="+", default=[256, 1024])
    parser.add_argument("--blocks", type=int, nargs="+", default=[1024, 2048, 4096, 8192])
    parser.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    parser.add_argument("--rep-ms", type=int, default=200, help="timing window per measurement")
    parser.add_argument("--out", default="results/device_api", help="folder for JSON and PNG")
    args = parser.parse_args()

    dtype = getattr(torch, args.dtype)
    sizes = args.sizes_mib
    ctx0_backend = trident.config.BACKEND
    if ctx0_backend == "sim":
        sizes, args.blocks = [1], [1024]  # the interpreter: check the script, not the speed
    heap = 2 * max(sizes) * (1 << 20) + (64 << 20)
    ctx = trident.init(heap_size=heap)
    rows = []
    for size_mib in sizes:
        n = size_mib * (1 << 20) // dtype.itemsize
        x = ctx.randn(n, dtype=dtype)
        y = ctx.empty(n, dtype=dtype)
        for name, kernel in VARIANTS.items():
            y.fill_(0)
            best_ms, best_block, vec = float("inf"), None, "n/a"
            for block in args.blocks:
                ms, width = measure(ctx, kernel, x, y, block, args.rep_ms)
                if not ms >= best_ms:
                    best_ms, best_block, vec = ms, block, width
            assert torch.equal(x, y), f"{name} copied wrong data"
            gbps = 2 * n * dtype.itemsize / (best_ms * 1e-3) / 1e9
            rows.append({"variant": name, "size_mib": size_mib, "block": best_block, "ms": best_ms,
                         "gb_per_s": gbps, "vector_access": vec})
        ctx.free(x, y)
    for row in rows:
        plain = next(r for r in rows if r["variant"] == "plain copy" and r["size_mib"] == row["size_mib"])
        row["fraction_of_plain"] = row["gb_per_s"] / plain["gb_per_s"]

    device = torch.cuda.get_device_name(ctx.device) if ctx.backend == "cuda" else "cpu (simulator)"
    record = {
        "benchmark": "device_api_bandwidth", "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "device": device, "backend": ctx.backend, "dtype": args.dtype, "torch": torch.__version__,
        "triton": triton.__version__, "host": platform.node(), "rows": rows,
        "note": "bytes read + written per second; local heap (peer == rank); best block size per variant",
    }
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "device_api_bandwidth.json"), "w") as f:
        json.dump(record, f, indent=2)
    print(f"device: {device}   dtype: {args.dtype}   {record['date']}")
    print(f"{'variant':<15}{'MiB':>7}{'block':>7}{'ms':>10}{'GB/s':>9}{'vs plain':>10}  vector access")
    for r in rows:
        print(f"{r['variant']:<15}{r['size_mib']:>7}{r['block']:>7}{r['ms']:>10.4f}{r['gb_per_s']:>9.0f}"
              f"{r['fraction_of_plain']:>9.1%}  {r['vector_access']}")
    _plot(rows, device, os.path.join(args.out, "device_api_bandwidth.png"))
    ctx.close()


def _plot(rows, device, path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot")
        return
    sizes = sorted({r["size_mib"] for r in rows})
    names = list(VARIANTS)
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / len(sizes)
    for i, size in enumerate(sizes):
        values = [next(r["gb_per_s"] for r in rows if r["variant"] == v and r["size_mib"] == size) for v in names]
        ax.bar([j + i * width for j in range(len(names))], values, width, label=f"{size} MiB")
    ax.set_xticks([j + width * (len(sizes) - 1) / 2 for j in range(len(names))], names, rotation=15)
    ax.set_ylabel("GB/s (read + write)")
    ax.set_title(f"trident device API vs plain Triton copy, {device}")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
