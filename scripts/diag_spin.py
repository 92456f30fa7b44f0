"""GPU diagnosis (developer tool): what slows a GEMM when other programs of the same launch spin.

Run on a GPU: ``PYTHONPATH=$PWD TRIDENT_BACKEND=cuda python3 scripts/diag_spin.py``. It times, at
one rank, the GEMM alone, the four gemm_all_scatter patterns, and a workgroup-specialized kernel
(``ws_diag``) whose communication programs spin on the tile flags in different ways (``SPIN``),
or with parts of the pattern left out; plus the all-scatter kernel alone with parts left out.
It prints one line per variant: the median time of 10 launches.
"""

import torch
import triton
import triton.language as tl

import trident
from trident.device import wait
from trident.device.platform import now_ns
from trident.ops import gas_kernels as G
from trident.ops.common import sync_state
from trident.ops.matmul import launch_matmul, operands, pick_config
from trident.ops.tiles import tile_coords, tile_offsets

SPINS = {"trident.wait": 0, "volatile": 1, "ordered each poll": 2, "volatile+clock": 3,
         "volatile+abort word": 4, "volatile+abort word/64": 5, "ordered+barrier": 6}


@triton.jit
def spin_on(ptr, epoch, abort_word, rank, heap_bases, SPIN: tl.constexpr):
    if SPIN == 0:
        wait(ptr, epoch, rank, rank, heap_bases, cmp="ge", scope="gpu")
    else:
        seen = tl.load(ptr, volatile=True)
        polls = 0
        while seen < epoch:
            if SPIN == 2:
                seen = tl.atomic_add(ptr, 0, sem="acquire", scope="gpu")
            elif SPIN == 6:
                tl.debug_barrier()
                seen = tl.atomic_add(ptr, 0, sem="acquire", scope="gpu")
            else:
                seen = tl.load(ptr, volatile=True)
            if SPIN == 3:
                seen = seen + (now_ns() < 0).to(tl.int64)
            if SPIN == 4:
                seen = seen + tl.load(abort_word, volatile=True)
            if SPIN == 5:
                seen = seen + tl.load(abort_word, mask=polls % 64 == 0, other=0, volatile=True)
            polls += 1
        tl.debug_barrier()


@triton.jit
def scatter_range(first, step, c, M, N, scm, flags_ptr, epoch, abort_word, rank, world_size, heap_bases,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr, WAIT_FLAGS: tl.constexpr,
                  SPIN: tl.constexpr):
    """Tiles ``first, first + step, ...``: (with ``WAIT_FLAGS``) spin on the tile's flag, read it back, scatter it."""
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    for tile in tl.range(first, num_pid_m * num_pid_n, step):
        if WAIT_FLAGS:
            spin_on(flags_ptr + tile, epoch, abort_word, rank, heap_bases, SPIN)
        pid_m, pid_n = tile_coords(tile, num_pid_m, num_pid_n, GROUP_M)
        offs, mask = tile_offsets(pid_m, pid_n, M, N, scm, 1, BLOCK_M, BLOCK_N)
        v = tl.load(c + offs, mask=mask)
        G.scatter_tile(c, offs, mask, v, tile, flags_ptr, rank, world_size, heap_bases, 1, False)  # no trace


@triton.jit
def end_call(state_ptr, arrived_ptr, epoch, rank, world_size, heap_bases, WORLD_BLOCK: tl.constexpr,
             FINISH: tl.constexpr):
    """The call's end: the real ``finish_call``, or (left out) program 0 just advancing the epoch."""
    if FINISH:
        G.finish_call(state_ptr, arrived_ptr, epoch, rank, world_size, heap_bases, WORLD_BLOCK)
    elif tl.program_id(0) == 0:
        tl.store(state_ptr, epoch)


@triton.jit
def ws_diag(a, b, c, M, N, K, sam, sak, sbk, sbn, scm, gemm_programs, state_ptr, ready_ptr, arrived_ptr, flags_ptr,
            abort_word, rank, world_size, heap_bases, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
            BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, WORLD_BLOCK: tl.constexpr, SIGNAL: tl.constexpr,
            COMM: tl.constexpr, WAIT_FLAGS: tl.constexpr, FINISH: tl.constexpr, SPIN: tl.constexpr):
    pid = tl.program_id(0)
    epoch = G.enter_call(state_ptr, ready_ptr, rank, world_size, heap_bases, WORLD_BLOCK)
    if pid < gemm_programs:
        G.produce_tiles(pid, gemm_programs, a, b, c, M, N, K, sam, sak, sbk, sbn, scm, flags_ptr, epoch, state_ptr,
                        rank, heap_bases, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, True, SIGNAL, False)
    elif COMM:
        G.wait_peers_ready(ready_ptr, epoch, rank, world_size, heap_bases)
        scatter_range(pid - gemm_programs, tl.num_programs(0) - gemm_programs, c, M, N, scm, flags_ptr, epoch,
                      abort_word, rank, world_size, heap_bases, BLOCK_M, BLOCK_N, GROUP_M, WAIT_FLAGS, SPIN)
    end_call(state_ptr, arrived_ptr, epoch, rank, world_size, heap_bases, WORLD_BLOCK, FINISH)


@triton.jit
def scatter_diag(c, M, N, scm, state_ptr, ready_ptr, arrived_ptr, rank, world_size, heap_bases,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr, WORLD_BLOCK: tl.constexpr,
                 READY: tl.constexpr, TILES: tl.constexpr, FINISH: tl.constexpr):
    epoch = G.enter_call(state_ptr, ready_ptr, rank, world_size, heap_bases, WORLD_BLOCK)
    if READY:
        G.wait_peers_ready(ready_ptr, epoch, rank, world_size, heap_bases)
    if TILES:
        scatter_range(tl.program_id(0), tl.num_programs(0), c, M, N, scm, state_ptr, epoch, state_ptr, rank,
                      world_size, heap_bases, BLOCK_M, BLOCK_N, GROUP_M, False, 0)
    end_call(state_ptr, arrived_ptr, epoch, rank, world_size, heap_bases, WORLD_BLOCK, FINISH)


class HostWord:
    """A pointer argument for a raw device address (Triton takes anything with data_ptr and dtype)."""
    dtype = torch.int64

    def __init__(self, address):
        self.address = address

    def data_ptr(self):
        return self.address


def median_ms(fn, n=10):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(n):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[n // 2]


def diagnose(ctx, host_word, M, N, K):
    """Every variant at one shape: ``{name: ms}``."""
    A = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    B = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
    C = ctx.zeros(M, N, dtype=torch.bfloat16)
    cfg = pick_config(M, N, K, torch.bfloat16, "cuda")
    sync = sync_state(ctx)
    flags = sync.tile_flags(triton.cdiv(M, cfg.BLOCK_M) * triton.cdiv(N, cfg.BLOCK_N))
    a, b, _ = operands(A, B, cfg)
    res = {"gemm": median_ms(lambda: launch_matmul(A, B, C, cfg))}
    for p in ("bulk_synchronous", "producer_consumer", "fused_sequential", "workgroup_specialized"):
        res[p] = median_ms(lambda p=p: trident.ops.gemm_all_scatter(ctx, A, B, C, pattern=p))
    common = dict(rank=0, world_size=1, heap_bases=ctx.heap_bases, BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N,
                  GROUP_M=8, WORLD_BLOCK=1)
    gemm_args = (a, b, C, M, N, K, A.stride(0), A.stride(1), B.stride(0), B.stride(1), C.stride(0))
    launch = dict(BLOCK_K=cfg.BLOCK_K, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    sync_args = (sync.state, sync.ready, sync.arrived, flags)
    device_word = torch.zeros(1, dtype=torch.int64, device="cuda")
    full = dict(SIGNAL=True, COMM=True, WAIT_FLAGS=True, FINISH=True, SPIN=0)
    variants = {f"spin: {name}": dict(SPIN=code) for name, code in SPINS.items()}
    variants.update({"no comm": dict(COMM=False), "no flag wait": dict(WAIT_FLAGS=False),
                     "no finish": dict(FINISH=False)})
    for name, v in variants.items():
        kw = dict(full, **v)
        for word in [device_word] + ([host_word] if kw["SPIN"] in (4, 5) else []):
            tag = " (host word)" if word is host_word else ""
            res[f"ws_diag {name}{tag}"] = median_ms(lambda kw=kw, word=word: ws_diag[(132,)](
                *gemm_args, 116, *sync_args, word, **common, **launch, **kw))
    parts = {"all": {}, "no ready wait": dict(READY=False), "no tiles": dict(TILES=False),
             "no finish": dict(FINISH=False), "enter only": dict(READY=False, TILES=False, FINISH=False)}
    for name, kw in parts.items():
        kw = dict(dict(READY=True, TILES=True, FINISH=True), **kw)
        for grid in (132, 16):
            res[f"scatter_diag {name} grid={grid}"] = median_ms(lambda kw=kw, grid=grid: scatter_diag[(grid,)](
                C, M, N, C.stride(0), sync.state, sync.ready, sync.arrived, **common, num_warps=cfg.num_warps, **kw))
    return res


def main():
    ctx = trident.init(heap_size=2 << 30)
    host_word = HostWord(ctx._control.abort_addr)  # the real abort word: pinned host memory, mapped
    for M, N, K in ((4096, 4096, 4096), (8192, 3584, 14336)):
        for name, ms in diagnose(ctx, host_word, M, N, K).items():
            print(f"{M}x{N}x{K} {name:44s} {ms:9.3f} ms", flush=True)
    ctx.close()


if __name__ == "__main__":
    main()
