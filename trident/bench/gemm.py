"""``trident bench gemm``: trident's persistent matmul against torch.matmul (cuBLAS) on one GPU.

Shapes (M x N x K): the paper's full products 8192x4608x36864 and 8192x3584x14336, their per-rank
column shards for 8 ranks (N = 576 and 448), and 4096-class squares. For each shape: the table's
config (``trident.ops.pick_config``) and, with ``--sweep``, a list of candidate configs; each
checked against torch first, then timed (median of ``--repeats`` CUDA-event timings after warm-up,
on random data). Writes JSON (GPU, driver, versions, date, every row) and prints a table.
One process is enough (``trident bench gemm``); in the simulator it runs tiny shapes as a smoke test.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Sequence
from typing import Any

import torch

from trident.ops import MatmulConfig, matmul, pick_config

from . import arguments, harness, plots

PAPER_SHAPES = [(8192, 4608, 36864), (8192, 3584, 14336), (8192, 576, 36864), (8192, 448, 14336),
                (4096, 4096, 4096), (4096, 4096, 16384)]
SIM_SHAPES = [(64, 48, 80), (96, 64, 32)]

C = MatmulConfig
SWEEP = [
    C(128, 256, 64, 8, 8, 3), C(128, 256, 64, 8, 8, 4, c_tma=True, subtile=True),
    C(128, 256, 64, 8, 8, 3, c_tma=True, subtile=True), C(128, 256, 64, 8, 8, 3, flatten=True),
    C(128, 256, 64, 8, 8, 4, c_tma=True, subtile=True, flatten=True),
    C(256, 128, 64, 8, 8, 3), C(256, 128, 64, 8, 8, 4, c_tma=True, subtile=True),
    C(128, 128, 64, 8, 8, 4), C(128, 128, 64, 8, 4, 4), C(128, 128, 64, 8, 8, 5, c_tma=True),
    C(128, 128, 64, 8, 8, 4, flatten=True), C(128, 128, 128, 8, 8, 3),
    C(128, 64, 64, 8, 4, 5), C(128, 64, 128, 8, 4, 4), C(64, 128, 64, 8, 4, 5),
    C(128, 128, 64, 16, 8, 4), C(128, 256, 64, 16, 8, 3),
    # split-K, for the narrow shards (more work items than tiles; not in the table until measured)
    C(128, 128, 64, 8, 4, 4, split_k=2), C(128, 128, 64, 8, 8, 4, split_k=2), C(128, 128, 64, 8, 4, 4, split_k=3),
    C(128, 256, 64, 8, 8, 3, split_k=2), C(128, 256, 64, 8, 8, 3, split_k=3),
    # split_tail: the tiles of the last wave(s) cut along K so the parts fill whole waves
    C(128, 128, 64, 8, 4, 4, split_tail=True), C(128, 128, 64, 8, 8, 4, split_tail=True),
    C(128, 256, 64, 8, 8, 3, flatten=True, split_tail=True), C(128, 256, 64, 8, 8, 3, split_tail=True),
    C(256, 128, 64, 8, 8, 4, c_tma=True, subtile=True, split_tail=True),
    C(128, 256, 64, 8, 8, 4, c_tma=True, subtile=True, split_tail=True),
    # a tail of columns: 288-column tiles for the 8-rank 576 shard (one wave of 128 tiles on 132 SMs)
    C(128, 256, 64, 8, 8, 4, tail_n=32), C(128, 256, 32, 8, 8, 8, tail_n=32), C(128, 256, 64, 16, 8, 4, tail_n=32),
    C(256, 128, 64, 8, 8, 4, tail_n=16),
]


def _rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).norm() / want.float().norm().clamp_min(1e-30))


def bench_shape(M, N, K, dtype, device, configs, warmup, repeats) -> list[dict]:
    """Rows for one shape: torch.matmul, then each config (``error`` instead of a time when it fails)."""
    gen = torch.Generator(device=device).manual_seed(M + N + K)
    A = torch.randn(M, K, device=device, dtype=dtype, generator=gen)
    B = torch.randn(K, N, device=device, dtype=dtype, generator=gen)
    flops = 2.0 * M * N * K
    want = torch.matmul(A, B)
    ms, host_ms = harness.measure(A.device, lambda: torch.matmul(A, B), warmup, repeats)
    rows = [{"shape": [M, N, K], "impl": "torch.matmul", "ms": ms, "host_ms": host_ms, "tflops": flops / ms / 1e9}]
    out = torch.empty(M, N, device=device, dtype=dtype)
    for cfg in configs:
        row: dict[str, Any] = {"shape": [M, N, K], "impl": "trident", "config": dataclasses.asdict(cfg)}
        try:
            out.fill_(float("nan"))
            matmul(A, B, out=out, config=cfg)
            err = _rel_err(out, want)
            row["rel_err_vs_torch"] = err
            if not err < 2e-2:
                raise RuntimeError(f"wrong result: relative error {err:.3g} against torch.matmul")
            row["ms"], row["host_ms"] = harness.measure(A.device, lambda cfg=cfg: matmul(A, B, out=out, config=cfg),
                                                        warmup, repeats)
            row["tflops"] = flops / row["ms"] / 1e9
            row["vs_torch"] = ms / row["ms"]
        except Exception as exc:  # a config that does not fit (shared memory) or fails: recorded, not fatal
            row["error"] = f"{type(exc).__name__}: {exc}"[:300]
        rows.append(row)
    return rows


def candidates(only: str | None) -> list[MatmulConfig]:
    """The sweep's configs, or those whose fields match ``only`` (``"split_tail=True,BLOCK_M=256"``)."""
    if not only:
        return list(SWEEP)
    wanted = dict(item.split("=", 1) for item in only.split(","))
    fields = {f.name for f in dataclasses.fields(MatmulConfig)}
    if not set(wanted) <= fields:
        raise SystemExit(f"--only: unknown config field(s) {sorted(set(wanted) - fields)}; fields: {sorted(fields)}")
    return [c for c in SWEEP if all(str(getattr(c, k)) == v for k, v in wanted.items())]


def parse_args(argv=None) -> argparse.Namespace:
    """The benchmark's arguments (``trident bench gemm --help``)."""
    parser = argparse.ArgumentParser(prog="trident bench gemm", description=__doc__)
    parser.add_argument("--dtype", default="bfloat16", choices=["float16", "bfloat16", "float32"])
    parser.add_argument("--shapes", default=None, help="MxNxK,MxNxK,... (default: the paper's shapes)")
    parser.add_argument("--sweep", action="store_true", help="also time the candidate configs")
    parser.add_argument("--only", default=None, metavar="FIELD=VALUE,...",
                        help="sweep only the candidates with these config fields, e.g. split_tail=True")
    arguments.add_common_args(parser, "gemm", warmup=5, repeats=30)
    return parser.parse_args(argv)


def run(ctx, args) -> dict:
    """torch.matmul, the table's config and (``--sweep``) the candidates on every shape; the record."""
    dtype = getattr(torch, args.dtype)
    cuda, device = not ctx.platform.simulator, ctx.device
    shapes: Sequence[tuple[int, ...]]
    if args.shapes:
        shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    else:
        shapes = PAPER_SHAPES if cuda else SIM_SHAPES
    if not cuda:
        args.warmup, args.repeats = 1, 2
    rows = []
    for M, N, K in shapes:
        table = pick_config(M, N, K, dtype, ctx.platform)
        configs = [table] + ([c for c in candidates(args.only) if c != table] if args.sweep and cuda else [])
        shape_rows = bench_shape(M, N, K, dtype, device, configs, args.warmup, args.repeats)
        shape_rows[1]["table_config"] = True
        rows += shape_rows
        best = max((r for r in shape_rows[1:] if "ms" in r), key=lambda r: r["tflops"], default=None)
        line = f"{M}x{N}x{K}: torch {shape_rows[0]['tflops']:.0f} TFLOP/s"
        if "ms" in shape_rows[1]:
            line += f" | table config {shape_rows[1]['tflops']:.0f} ({100 * shape_rows[1]['vs_torch']:.1f}%)"
        if best is not None and args.sweep:
            line += f" | best {best['tflops']:.0f} ({100 * best['vs_torch']:.1f}%) {best['config']}"
        print(line, flush=True)
    record = harness.new_record(ctx, "gemm", harness.params(args))
    record["rows"] = rows
    return record


def report(record: dict, out: str) -> list[str]:
    """Write the JSON and ``gemm.png`` (TFLOP/s per shape: torch, the table's config, the sweep's
    best) into ``out``; returns the files written."""
    bars = []
    for shape in dict.fromkeys(tuple(r["shape"]) for r in record["rows"]):
        rows = [r for r in record["rows"] if tuple(r["shape"]) == shape and "ms" in r]
        label = "x".join(map(str, shape))
        timed = [r for r in rows if r["impl"] == "trident"]
        picks = [("torch.matmul", next((r for r in rows if r["impl"] == "torch.matmul"), None)),
                 ("trident, table config", next((r for r in timed if r.get("table_config")), None)),
                 ("trident, best config", max(timed, key=lambda r: r["tflops"], default=None))]
        bars += [{"shape": label, "impl": name, "tflops": r["tflops"]} for name, r in picks if r is not None]
    return harness.write_report(record, out, None, plots=[lambda: plots.bars(
        dict(record, rows=bars), os.path.join(out, "gemm.png"), "shape", "impl", "tflops", "TFLOP/s",
        "trident.ops.matmul against torch.matmul (dashed)", reference="torch.matmul", ratio="of")])


def main(argv=None) -> int:
    """``trident bench gemm``: parse ``argv``, run, write the results; returns the exit code."""
    args = parse_args(argv)
    if int(os.environ.get("WORLD_SIZE", "1")) != 1:
        raise SystemExit("trident bench gemm runs on one rank (trident bench gemm -n 1)")
    harness.run_benchmark(args, run, report, 64 << 20)  # one rank: the device, the metadata, the record
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
