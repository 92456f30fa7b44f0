"""Where a decode-sized MoE dispatch spends its time, part by part (a profiling aid for issue 31).

At 128 tokens a dispatch moves a few MB and its time is a chain of dependent steps: the launch, the
call's entry handshake (READY), the routing ids and slot claims, the rows, the exit handshake
(``finish_call``) and the masked layout's close. This script times the dispatch kernel in CUDA
graphs (one rank, DeepSeek-V3 sizes by default) as it is and with parts taken out, each a copy of
``trident/ops/moe/kernels.py`` (and of ``trident/ops/fused/sync.py``) with one edit, so each row's
difference from ``current`` is what that part costs on the chain:

* ``current``: the kernel as it is;
* ``no READY wait``: without ``wait_peers_ready`` (wrong at several ranks; timing only);
* ``no rows``: no ``_send_rows`` (enter, READY, finish, close);
* ``no READY, no rows``: enter, finish and close alone;
* ``system-scope ticket``: ``finish_call``'s ticket at system scope (as before 2026-12-07);
* ``empty kernel``: a kernel of the same signature and grid that does nothing (the launch).

Each is timed with bf16 rows, fp8 rows with scales, and a routing of -1 only (no row routed), and
against a plain device copy of the bytes the bf16 and fp8 dispatches write (the floor). Needs a
GPU. The timing variants are built in a temporary folder, never imported by trident.

    python benchmarks/moe_decode_anatomy.py --out results/   # -> moe_decode_anatomy.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import torch
import triton
import triton.language as tl

import trident
import trident.ops.moe.dispatch as dispatch
from trident.bench import harness
from trident.bench.moe import _graph, inputs
from trident.bench.variants import edited_module
from trident.platform import SIMULATOR

MASKED_READY = "        team = wait_peers_ready(call, team)\n        _send_rows("
SEND = "        _send_rows(x_ptr, scales_ptr, topk_ptr, ids, recv, counts_ptr, sizes, team, BLOCKS, OPTIONS)\n"
TICKET = 'sem="acq_rel", scope="gpu") == tl.num_programs(0) - 1'
NOT_SELF = "(peers < team.world_size) & (peers != team.rank)"
NOT_SELF_DEVICE = "(peers < world_size) & (peers != rank)"
READY_SELF = "        if peer != team.rank:  # no READY from itself"
#: How the handshake (trident/ops/fused/sync.py) imports the device API; a variant that edits
#: trident/device/sync.py (signal_peers, sync_ranks) imports those two from its copy instead.
DEVICE_IMPORT = "from trident.device import arrival_ticket, signal_peers, store, sync_ranks, wait"
#: Each variant: (edits to ops/moe/kernels.py, to ops/fused/sync.py, to device/sync.py), every edit an
#: (old, new) text pair.
VARIANTS = {
    "current": ((), (), ()),
    "no READY wait": (((MASKED_READY, "        _send_rows("),), (), ()),
    "no rows": (((SEND, ""),), (), ()),
    "no READY, no rows": (((SEND, ""), ("        team = wait_peers_ready(call, team)\n        if finish_call",
                                        "        if finish_call")), (), ()),
    "system-scope ticket": ((), ((TICKET, TICKET.replace('"gpu"', '"sys"')),), ()),
    "READY and ARRIVED to itself too": ((), ((NOT_SELF, "peers < team.world_size"),
                                             (READY_SELF, "        if True:  # READY from itself too")),
                                        ((NOT_SELF_DEVICE, "peers < world_size"),)),
}


def build_variants(folder: str) -> dict:
    """``{name: kernel}``: the dispatch kernel of each :data:`VARIANTS` entry, written into ``folder``."""
    kernels = {}
    for i, (name, (kernel_edits, sync_edits, device_edits)) in enumerate(VARIANTS.items()):
        if device_edits:
            edited_module("device/sync.py", device_edits, f"anatomy_device_sync_{i}", folder)
            sync_edits = (*sync_edits, (DEVICE_IMPORT, "from trident.device import arrival_ticket, store, wait\n"
                                                       f"from anatomy_device_sync_{i} import signal_peers, sync_ranks"))
        edited_module("ops/fused/sync.py", sync_edits, f"anatomy_sync_{i}", folder)
        module = edited_module("ops/moe/kernels.py", kernel_edits, f"anatomy_kernels_{i}", folder,
                               {"trident.ops.fused.sync": f"anatomy_sync_{i}"})
        kernels[name] = module.moe_dispatch_kernel
    kernels["empty kernel"] = empty_kernel
    return kernels


@triton.jit
def empty_kernel(x_ptr, scales_ptr, topk_ptr, recv_x_ptr, recv_scales_ptr, recv_src_ptr, recv_j_ptr, counts_ptr,
                 local_ptr, status_ptr, sizes, sync_ptr, rank, world_size, heap_bases, BLOCKS: tl.constexpr,
                 OPTIONS: tl.constexpr, WORLD_BLOCK: tl.constexpr):
    """The dispatch kernel's signature doing nothing: what its launch alone costs."""
    if rank < 0:
        tl.store(status_ptr, 1)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--hidden", type=int, default=7168)
    p.add_argument("--topk", type=int, default=8)
    p.add_argument("--experts", type=int, default=256)
    p.add_argument("--calls", type=int, default=10, help="dispatches per CUDA graph")
    p.add_argument("--out", default=".")
    args = p.parse_args(argv)
    if SIMULATOR:
        raise SystemExit("moe_decode_anatomy.py times kernels in CUDA graphs: run it on a GPU")
    T, H, K, E = args.tokens, args.hidden, args.topk, args.experts
    need = trident.ops.moe_heap_bytes(T, H, K, E, 1, torch.bfloat16, fp8_scales=True, layout="masked")
    ctx = trident.init(heap_size=need + (256 << 20))
    x, x8, scales, idx, weights = inputs(ctx, T, H, K, E, seed=2)
    none = torch.full_like(idx, -1)

    def graph_us(fn) -> float:
        graph = _graph(fn, args.calls)
        return harness.time_ms(ctx, graph.replay, 3, 30) * 1e3 / args.calls

    cases = {"bf16": lambda: trident.ops.moe_dispatch(ctx, x, idx, E, max_tokens_per_rank=T, layout="masked"),
             "fp8": lambda: trident.ops.moe_dispatch(ctx, x8, idx, E, x_scales=scales, max_tokens_per_rank=T,
                                                     layout="masked"),
             "no row routed": lambda: trident.ops.moe_dispatch(ctx, x, none, E, max_tokens_per_rank=T,
                                                               layout="masked")}
    record = {"gpu": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "command": " ".join(sys.argv), "sizes": vars(args), "rows": {}}
    for label, nbytes in (("floor: device copy of the bf16 rows", T * K * H * 2),
                          ("floor: device copy of the fp8 rows", T * K * H)):
        src = torch.empty(nbytes, dtype=torch.uint8, device=ctx.device)
        dst = torch.empty_like(src)
        record["rows"][label] = round(graph_us(lambda d=dst, s=src: d.copy_(s)), 2)
    original = dispatch.moe_dispatch_kernel
    with tempfile.TemporaryDirectory() as folder:
        try:
            for name, kernel in build_variants(folder).items():
                dispatch.moe_dispatch_kernel = kernel  # the call records whichever kernel the module holds
                ctx.call_cache.clear()
                record["rows"][name] = {case: round(graph_us(fn), 2) for case, fn in cases.items()}
        finally:
            dispatch.moe_dispatch_kernel = original
    for name, row in record["rows"].items():
        print(f"{name:40s} {row}")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "moe_decode_anatomy.json"), "w") as f:
        json.dump(record, f, indent=1)
    ctx.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
