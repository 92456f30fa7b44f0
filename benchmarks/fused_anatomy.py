"""Where the fused GEMM ops' ``workgroup_specialized`` kernels spend their time over the GEMM, at one
rank (a profiling aid for issue 33).

At one rank nothing crosses a link, so a pattern's time over the GEMM alone is its machinery. This
script times each op's ``workgroup_specialized`` pattern as it is and with one part changed, each
variant a copy of the op's kernel module with one text edit (built in a temporary folder, never
imported by trident), against the matmul and the op's ``fused_sequential`` in the same run:

* all_gather_gemm: ``current`` (every round of tiles but the last two dealt out, the rest claimed
  one atomic at a time); ``every tile claimed`` (the schedule before 2026-12-08); ``static tile
  loop`` (program ``p`` computes tiles ``p, p + P, ...``, as ``fused_sequential`` does: right at one
  rank only, where no program gathers); ``no wait branch`` (the tile loop without the code that
  waits for a peer's rows: timing only);
* gemm_reduce_scatter and gemm_all_reduce: ``current``; ``own tile flags at sys scope`` (as before
  a8bd2d5: a system-wide fence after every tile);
* gemm_all_scatter: ``current``; ``no tile flags`` (the GEMM programs release no flag per tile:
  timing only, its consumers would wait forever at several ranks).

Each figure is the device time of ``--repeats`` calls (the harness's median), the output checked
against ``torch.matmul``, and its ratio to the matmul timed just before it. Needs a GPU.

    python benchmarks/fused_anatomy.py --out results/    # -> fused_anatomy.json
    python benchmarks/fused_anatomy.py --ops all_gather_gemm --out results/
"""

from __future__ import annotations

import argparse
import importlib
import sys
import tempfile

import torch

import trident
from trident.bench import harness
from trident.bench.variants import edited_module
from trident.ops import matmul
from trident.platform import SIMULATOR

#: The host module whose ``kernels`` attribute each op's launches read, and its kernel module.
MODULES = {"all_gather_gemm": "all_gather_gemm_kernels", "gemm_reduce": "gemm_reduce_kernels",
           "gemm_all_scatter": "gemm_all_scatter_kernels"}
STATIC_TILES = "    static_tiles = tl.maximum(tiles // multipliers - 1, 0) * multipliers\n"
MINE = "        mine = static_tiles // multipliers\n"
WAIT = "        if not own:\n            wait(flags + src * blocks + pid_m,"
OWN_FLAG = 'signal(flag, epoch, team.rank, team.rank, team.heap_bases, scope="gpu")'
TILE_FLAG = 'signal(flags + tile, call.epoch, team.rank, team.rank, team.heap_bases, scope="gpu")'
#: name -> (host module, edits of its kernel module: (old, new) text pairs).
VARIANTS = {
    "all_gather_gemm: current": ("all_gather_gemm", ()),
    "all_gather_gemm: every tile claimed": ("all_gather_gemm", ((STATIC_TILES, "    static_tiles = tiles * 0\n"),)),
    "all_gather_gemm: static tile loop": ("all_gather_gemm", (
        (STATIC_TILES, "    static_tiles = tiles\n"),
        (MINE, "        mine = tl.cdiv(tiles - (arrival - gather_programs), multipliers)\n"))),
    "all_gather_gemm: no wait branch": ("all_gather_gemm", ((WAIT, "        if False:\n            wait(flags,"),)),
    "gemm_reduce: current": ("gemm_reduce", ()),
    "gemm_reduce: own tile flags at sys scope": ("gemm_reduce", ((OWN_FLAG, OWN_FLAG.replace('"gpu"', '"sys"')),)),
    "gemm_all_scatter: current": ("gemm_all_scatter", ()),
    "gemm_all_scatter: no tile flags": ("gemm_all_scatter", ((TILE_FLAG, "pass"),)),
}
#: Each op's shapes (its benchmark's defaults, M x N x K of the GEMM one rank computes).
SHAPES = {"all_gather_gemm": ((8192, 3584, 8192), (4096, 4096, 4096)),
          "gemm_reduce_scatter": ((8192, 8192, 3584), (4096, 4096, 4096)),
          "gemm_all_reduce": ((8192, 8192, 3584), (4096, 4096, 4096)),
          "gemm_all_scatter": ((8192, 4608, 36864), (4096, 4096, 4096))}
#: Which variants time which ops.
OPS_OF = {"all_gather_gemm": ("all_gather_gemm",), "gemm_reduce": ("gemm_reduce_scatter", "gemm_all_reduce"),
          "gemm_all_scatter": ("gemm_all_scatter",)}


def build_variants(folder: str) -> dict:
    """``{name: kernel module}``: each :data:`VARIANTS` entry's edited copy, written into ``folder``."""
    return {name: edited_module(f"ops/tensor_parallel/{MODULES[host]}.py", edits, f"fused_anatomy_{i}", folder)
            for i, (name, (host, edits)) in enumerate(VARIANTS.items())}


def _operands(ctx, op: str, M: int, N: int, K: int):
    """``(A, B, C)`` of one call at one rank (the operand peers reach on the heap), bf16."""
    dev, bf16 = ctx.device, torch.bfloat16
    A = ctx.randn(M, K, dtype=bf16) if op == "all_gather_gemm" else torch.randn(M, K, device=dev, dtype=bf16)
    B = torch.randn(K, N, device=dev, dtype=bf16)
    C = ctx.empty(M, N, dtype=bf16) if op == "gemm_all_scatter" else torch.empty(M, N, device=dev, dtype=bf16)
    return A, B, C


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--out", default=".")
    p.add_argument("--ops", default=",".join(SHAPES), help="comma-separated ops to time (default: all four)")
    args = p.parse_args(argv)
    ops = args.ops.split(",")
    if not set(ops) <= set(SHAPES):
        raise SystemExit(f"--ops: unknown op(s) {sorted(set(ops) - set(SHAPES))}; ops: {', '.join(SHAPES)}")
    if SIMULATOR:
        raise SystemExit("fused_anatomy.py times the fused kernels on a GPU: run it on one")
    ctx = trident.init(heap_size=4 << 30)
    hosts = {host: importlib.import_module(f"trident.ops.tensor_parallel.{host}") for host in MODULES}
    originals = {host: module.kernels for host, module in hosts.items()}
    record = harness.new_record(ctx, "fused-anatomy", harness.params(args))

    def timed(op: str, shape: str, case: str, fn, C, want) -> None:
        fn()
        torch.cuda.synchronize()
        error = float((C.float() - want).norm() / want.norm())
        if error > 2e-2:
            raise SystemExit(f"{op} {shape} {case}: relative error {error:.3g} against torch.matmul")
        us = harness.measure(ctx.device, fn, 3, args.repeats).device_ms * 1e3
        matmul_us = us if case == "matmul" else record["rows"][-1]["matmul_us"]
        record["rows"].append({"op": op, "shape": shape, "case": case, "device_us": round(us, 1),
                               "matmul_us": round(matmul_us, 1), "vs_matmul": round(us / matmul_us, 3)})
        print(f"{op:20s} {shape:16s} {case:48s} {us:9.1f} us  {us / matmul_us:6.3f}x matmul", flush=True)

    def time_shape(op: str, M: int, N: int, K: int, variants: dict) -> None:
        A, B, C = _operands(ctx, op, M, N, K)
        want = torch.matmul(A, B).float()
        run, shape = getattr(trident.ops, op), f"{M}x{N}x{K}"
        timed(op, shape, "matmul", lambda: matmul(A, B, out=C), C, want)
        timed(op, shape, "fused_sequential", lambda: run(ctx, A, B, C, pattern="fused_sequential"), C, want)
        for name, (host, _) in VARIANTS.items():
            if op not in OPS_OF[host]:
                continue
            hosts[host].kernels = variants[name]  # the op's launches read the module's kernels
            ctx.call_cache.clear()  # recordings hold the kernels they launched
            timed(op, shape, f"workgroup_specialized, {name.split(': ')[1]}",
                  lambda: run(ctx, A, B, C, pattern="workgroup_specialized"), C, want)
            hosts[host].kernels = originals[host]
            ctx.call_cache.clear()
        for t in (A, C):
            if ctx.is_symmetric(t):
                ctx.free(t)

    with tempfile.TemporaryDirectory() as folder:
        variants = build_variants(folder)
        try:
            for op in ops:
                for M, N, K in SHAPES[op]:
                    time_shape(op, M, N, K, variants)
        finally:
            for host, module in hosts.items():
                module.kernels = originals[host]
    print(harness.write_results(record, args.out))
    ctx.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
