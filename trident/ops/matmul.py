"""A persistent Triton matmul for Hopper: ``trident.ops.matmul(A, B)``.

One program per SM walks the output tiles in grouped order (:func:`~trident.ops.tiles.tile_coords`),
reads A and B through tensor descriptors (TMA) when their layout allows and through pointers
otherwise, accumulates in fp32 and stores the tile in C's dtype. The block sizes come from a
small table keyed by the shape (:func:`pick_config`), measured on an H200
(docs/gemm-all-scatter.md); in the simulator small blocks keep the interpreter quick.
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from .. import config as _config
from .. import trace
from ..backends import interpreter_fixups
from .tiles import tile_coords, tile_dot, tile_dot_range, tile_offsets

DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@dataclasses.dataclass(frozen=True)
class MatmulConfig:
    """Tile shape and launch parameters of the persistent matmul.

    ``programs`` is the persistent grid (None: one per SM on a GPU, a few in the simulator).
    ``tma`` None reads A and B through descriptors whenever their layout allows, False never;
    ``c_tma`` stores C through one too (when A, B and C allow), ``subtile`` in two halves.
    ``split_k`` > 1 cuts each tile's K range into that many work items, so a grid with few tiles
    (narrow N: the per-rank shards) still fills every SM; each part stores its fp32 sum into a
    workspace and the last part of a tile to finish adds them up and writes it. ``split_tail`` cuts only the
    tiles of the last wave(s), into as many parts as make the work fill every SM (:func:`cut_plan`),
    so no SM idles in a partial last wave (the idea of Stream-K, Osama et al. 2023, with whole
    parts: programs working at once read the same K range of neighbouring tiles, which keeps A and
    B in L2). At most one of the two.
    """

    BLOCK_M: int = 128
    BLOCK_N: int = 256
    BLOCK_K: int = 64
    GROUP_M: int = 8
    num_warps: int = 8
    num_stages: int = 3
    programs: int | None = None
    tma: bool | None = None
    c_tma: bool = False
    subtile: bool = False
    flatten: bool = False
    split_k: int = 1
    split_tail: bool = False

    def __post_init__(self):
        if self.split_k < 1:
            raise ValueError(f"MatmulConfig: split_k must be at least 1, got {self.split_k}")
        if self.split_k > 1 and self.split_tail:
            raise ValueError("MatmulConfig: split_k > 1 and split_tail=True are two ways to cut K; choose one")


#: The simulator: small tiles, since every program runs in Python.
SIM_CONFIG = MatmulConfig(BLOCK_M=32, BLOCK_N=32, BLOCK_K=32, GROUP_M=2, num_warps=4, num_stages=1)

#: H200 candidates (bf16/fp16), from the sweeps in docs/gemm-all-scatter.md: 128x256 tiles with a
#: flattened loop are the fastest on the paper's full shapes (96-106% of cuBLAS); 256x128 tiles
#: with a descriptor store and a split tail on the narrow 8-rank shard 8192x576x36864 (2026-12-03).
GPU_CONFIGS = {
    "wide": MatmulConfig(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, GROUP_M=8, num_warps=8, num_stages=3, flatten=True,
                         split_tail=True),
    "tall": MatmulConfig(BLOCK_M=256, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_warps=8, num_stages=4, c_tma=True,
                         subtile=True, split_tail=True),
    "narrow": MatmulConfig(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_warps=4, num_stages=4,
                           split_tail=True),
    "small": MatmulConfig(BLOCK_M=64, BLOCK_N=64, BLOCK_K=64, GROUP_M=8, num_warps=4, num_stages=4),
}
#: Candidates for large products with the relative speed of one full tile (measured on the H200:
#: 256x128 tiles at ~97% of the speed of 128x256 ones, 128x128 at 78-94%).
_CANDIDATES = ((GPU_CONFIGS["wide"], 1.0), (GPU_CONFIGS["tall"], 0.97), (GPU_CONFIGS["narrow"], 0.85))


def _efficiency(M: int, N: int, K: int, cfg: MatmulConfig, sms: int, speed: float) -> float:
    """Useful fraction of the work a persistent grid does: ragged edges, and the last, partial
    wave (or, with ``split_tail``, the parts that fill it and their cost: :func:`cut_plan`)."""
    tiles_m, tiles_n = -(-M // cfg.BLOCK_M), -(-N // cfg.BLOCK_N)
    tiles = tiles_m * tiles_n
    time = _plan(tiles, sms, cfg, -(-K // cfg.BLOCK_K))[0]
    return speed * (M * N) / (tiles_m * cfg.BLOCK_M * tiles_n * cfg.BLOCK_N) * tiles / (time * sms)


def pick_config(M: int, N: int, K: int, dtype: torch.dtype, backend: str | None = None,
                sms: int = 132) -> MatmulConfig:
    """The table's config for an ``M x K @ K x N`` product.

    On a GPU: small products take 64x64 tiles; otherwise the candidate whose tiles waste the least
    (ragged edges, a last wave that leaves SMs idle), weighted by its measured tile speed.

    Example::

        cfg = pick_config(8192, 576, 36864, torch.bfloat16)   # 256x128 tiles, the tail cut in parts
    """
    if (backend or _config.BACKEND) == "sim":
        return SIM_CONFIG
    if M * N <= 1024 * 1024:
        return GPU_CONFIGS["small"]
    if dtype == torch.float32:  # fp32 tiles are twice the bytes: 128x128, fewer stages
        return dataclasses.replace(GPU_CONFIGS["narrow"], num_stages=3)
    return max(_CANDIDATES, key=lambda c: _efficiency(M, N, K, c[0], sms, c[1]))[0]


@triton.jit
def matmul_kernel(a, b, c, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn, part_ptr,
                  count_ptr, whole_tiles, parts, trace_ptr, rank, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, USE_TMA: tl.constexpr, C_TMA: tl.constexpr,
                  SUBTILE: tl.constexpr, FLATTEN: tl.constexpr, CUT: tl.constexpr = False,
                  TRACE: tl.constexpr = False):
    """``C = A @ B``, persistent: program ``pid`` computes tiles ``pid, pid + P, ...`` (P programs).

    With ``C_TMA`` the tile leaves through a descriptor (a bulk tensor store), in two halves along
    N when ``SUBTILE`` (half the shared memory for the epilogue, so more stages fit). With ``CUT``
    only the first ``whole_tiles`` tiles are computed whole; each of the others is cut into
    ``parts`` along K (:func:`_cut_tiles`). With ``TRACE`` every tile (every part) is recorded
    as a compute event of ``rank`` in the trace buffer ``trace_ptr``.
    """
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    for tile in tl.range(tl.program_id(0), whole_tiles, tl.num_programs(0), flatten=FLATTEN):
        t0 = trace.now_if(TRACE)
        pid_m, pid_n = tile_coords(tile, num_pid_m, num_pid_n, GROUP_M)
        acc = tile_dot(a, b, pid_m, pid_n, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                       BLOCK_M, BLOCK_N, BLOCK_K, USE_TMA)
        _store_tile(c, acc, pid_m, pid_n, M, N, stride_cm, stride_cn, BLOCK_M, BLOCK_N, C_TMA, SUBTILE)
        trace.record(trace_ptr, trace.COMPUTE, tile, rank, t0, rank, TRACE)
    if CUT:
        _cut_tiles(a, b, c, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn, part_ptr,
                   count_ptr, whole_tiles, parts, trace_ptr, rank, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, USE_TMA,
                   C_TMA, SUBTILE, TRACE)


@triton.jit
def _store_tile(c, acc, pid_m, pid_n, M, N, stride_cm, stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                C_TMA: tl.constexpr, SUBTILE: tl.constexpr):
    """Store an fp32 tile into C in C's dtype: through the descriptor ``c`` (``C_TMA``; in two
    halves along N when ``SUBTILE``) or through the pointer ``c`` with the edges masked."""
    if C_TMA:
        if SUBTILE:
            halves = tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1))
            left, right = tl.split(halves)
            c.store([pid_m * BLOCK_M, pid_n * BLOCK_N], left.to(c.dtype))
            c.store([pid_m * BLOCK_M, pid_n * BLOCK_N + BLOCK_N // 2], right.to(c.dtype))
        else:
            c.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc.to(c.dtype))
    else:
        offs, mask = tile_offsets(pid_m, pid_n, M, N, stride_cm, stride_cn, BLOCK_M, BLOCK_N)
        tl.store(c + offs, acc.to(c.dtype.element_ty), mask=mask)


@triton.jit
def _cut_tiles(a, b, c, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn, part_ptr,
               count_ptr, first_tile, parts, trace_ptr, rank, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, USE_TMA: tl.constexpr, C_TMA: tl.constexpr,
               SUBTILE: tl.constexpr, TRACE: tl.constexpr):
    """Tiles ``first_tile ..``, each cut into ``parts`` parts along K (K blocks split evenly; the
    host keeps ``parts <= `` the K blocks, so none is empty).

    Work item ``w`` is part ``w // n`` of cut tile ``w % n`` (n cut tiles): programs running at
    the same time compute the same part of neighbouring tiles, i.e. read the same K range, so A
    and B are shared in L2 as in the whole-tile loop. Each part goes through :func:`_add_part`.
    """
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    cut = num_pid_m * num_pid_n - first_tile
    for work in tl.range(tl.program_id(0), cut * parts, tl.num_programs(0)):
        part = work // cut
        cut_tile = work % cut
        t0 = trace.now_if(TRACE)
        tile = first_tile + cut_tile
        pid_m, pid_n = tile_coords(tile, num_pid_m, num_pid_n, GROUP_M)
        acc = tile_dot_range(a, b, pid_m * BLOCK_M, pid_n * BLOCK_N, M, N, K, stride_am, stride_ak, stride_bk,
                             stride_bn, part * k_tiles // parts, (part + 1) * k_tiles // parts, BLOCK_M, BLOCK_N,
                             BLOCK_K, USE_TMA)
        _add_part(acc, c, part_ptr, count_ptr, cut_tile, part, parts, pid_m, pid_n, M, N, stride_cm, stride_cn,
                  BLOCK_M, BLOCK_N, C_TMA, SUBTILE)
        trace.record(trace_ptr, trace.COMPUTE, tile, rank, t0, rank, TRACE)


@triton.jit
def _add_part(acc, c, part_ptr, count_ptr, cut_tile, part, parts, pid_m, pid_n, M, N, stride_cm, stride_cn,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, C_TMA: tl.constexpr, SUBTILE: tl.constexpr):
    """Part ``part`` (fp32 ``acc``) of cut tile ``cut_tile``: the last of its ``parts`` to finish stores the tile.

    Each part stores its sum into its own slot of ``part_ptr`` (``cut_tile * parts + part``,
    blocks of ``BLOCK_M * BLOCK_N``; plain stores, not fp32 atomics, which cost more) and counts
    itself in ``count_ptr[cut_tile]`` (acq_rel). The part that counts last adds the other parts'
    slots to its own sum and stores the tile into C. Nothing waits, so the simulator's
    one-after-another programs are fine.
    """
    block = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    first_slot = part_ptr + tl.cast(cut_tile, tl.int64) * parts * (BLOCK_M * BLOCK_N)
    tl.store(first_slot + part * (BLOCK_M * BLOCK_N) + block, acc)
    tl.debug_barrier()  # every thread's stores before the count's release
    if tl.atomic_add(count_ptr + cut_tile, 1, sem="acq_rel", scope="gpu") == parts - 1:
        tl.debug_barrier()  # the acquire (one thread) before every thread's reads
        for other in range(0, parts):
            if other != part:
                acc += tl.load(first_slot + other * (BLOCK_M * BLOCK_N) + block, cache_modifier=".cg")
        _store_tile(c, acc, pid_m, pid_n, M, N, stride_cm, stride_cn, BLOCK_M, BLOCK_N, C_TMA, SUBTILE)


def tma_ok(t: torch.Tensor) -> bool:
    """Whether a 2-D tensor can be read through a TMA descriptor: unit inner stride, 16-byte aligned
    base and row stride."""
    return (t.dim() == 2 and t.stride(1) == 1 and t.data_ptr() % 16 == 0
            and (t.stride(0) * t.element_size()) % 16 == 0 and t.shape[1] * t.element_size() >= 16)


def operands(A: torch.Tensor, B: torch.Tensor, cfg: MatmulConfig):
    """``(a, b, use_tma)``: descriptors for A and B when the config and the layouts allow, else the tensors."""
    use_tma = cfg.tma is not False and tma_ok(A) and tma_ok(B)
    if cfg.tma and not use_tma:
        raise ValueError("config asks for TMA (tma=True) but A or B is not 16-byte aligned with a unit inner stride")
    if not use_tma:
        return A, B, False
    return (TensorDescriptor.from_tensor(A, [cfg.BLOCK_M, cfg.BLOCK_K]),
            TensorDescriptor.from_tensor(B, [cfg.BLOCK_K, cfg.BLOCK_N]), True)


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (4 stand-ins for the simulator's CPU)."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4


def num_programs(device: torch.device, tiles: int, cfg: MatmulConfig) -> int:
    """The persistent grid: ``cfg.programs``, else one program per SM (4 in the simulator), at most ``tiles``."""
    return max(1, min(tiles, cfg.programs or sm_count(device)))


def check_matrices(where: str, device: torch.device | None = None, contiguous: bool = False, **tensors) -> None:
    """Raise a clear error unless every tensor is a 2-D torch.Tensor of one supported dtype, all on
    one device (``device`` when given), and contiguous when asked.

    Example::

        check_matrices("matmul", A=A, B=B)
    """
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{where}: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 2:
            raise ValueError(f"{where}: {name} must be 2-D, got shape {tuple(t.shape)}")
        if t.dtype not in DTYPES:
            raise ValueError(f"{where}: {name} has dtype {t.dtype}; supported: float16, bfloat16, float32")
        if device is not None and t.device != device:
            raise ValueError(f"{where}: {name} is on {t.device}, expected {device}")
        if contiguous and not t.is_contiguous():
            raise ValueError(f"{where}: {name} must be contiguous (call .contiguous())")
    for kind in ("dtype", "device"):
        if len({getattr(t, kind) for t in tensors.values()}) > 1:
            listing = ", ".join(f"{name}: {getattr(t, kind)}" for name, t in tensors.items())
            verb = "share one dtype" if kind == "dtype" else "be on one device"
            raise ValueError(f"{where}: {', '.join(tensors)} must {verb}, got {listing}")


def check_operands(A: torch.Tensor, B: torch.Tensor, what: str) -> None:
    """Raise a clear error unless A (M x K) and B (K x N) are 2-D, on one device, of one supported dtype."""
    check_matrices(what, A=A, B=B)
    if A.shape[1] != B.shape[0]:
        raise ValueError(f"{what}: K mismatch: A is {tuple(A.shape)} (M x K) but B is {tuple(B.shape)} (K x N)")


#: Cost of cutting tiles (the parts' sums written and read back), in tile-times: a plan that cuts
#: must beat keeping every tile whole by more than this. Measured: with a cost of 0.05 the plan
#: cut 8192x3584x14336 (128x256 tiles) for a predicted 2% and ran 2-3% slower (H200, 2026-12-03).
CUT_COST = 0.25
#: The fewest K blocks in a part (shorter loops do not keep the pipeline full).
MIN_PART_K_BLOCKS = 8
#: The most parts a tile is cut into by ``split_tail``.
MAX_PARTS = 8


def cut_plan(tiles: int, programs: int, cfg: MatmulConfig, k_tiles: int) -> tuple[int, int]:
    """``(whole, parts)``: the matmul computes tiles ``0 .. whole - 1`` whole and cuts each of the
    others into ``parts`` parts along K.

    ``split_k`` cuts every tile. ``split_tail`` keeps the full waves whole but (at most) one and
    cuts the rest into 2 to :data:`MAX_PARTS` parts (each at least :data:`MIN_PART_K_BLOCKS` K blocks) so that the
    parts fill whole waves: the choice with the shortest time in tile-times (waves of whole tiles,
    plus waves of parts times a part's share of a tile, plus :data:`CUT_COST`); nothing is cut
    where that does not beat the whole tiles.

    Example::

        cut_plan(320, 132, MatmulConfig(split_tail=True), 576)   # (264, 7): 56 tiles in 7 parts
    """
    return _plan(tiles, programs, cfg, k_tiles)[1:]


def _plan(tiles: int, programs: int, cfg: MatmulConfig, k_tiles: int) -> tuple[float, int, int]:
    """:func:`cut_plan` with its time in tile-times first."""
    if cfg.split_k > 1 and k_tiles > 1:
        parts = min(cfg.split_k, k_tiles)
        return -(-tiles * parts // programs) / parts + CUT_COST, 0, parts
    best = (-(-tiles // programs), tiles, 1)
    if not cfg.split_tail:
        return best
    full = tiles // programs
    for waves in sorted({full, max(full - 1, 0)}, reverse=True):
        rest = tiles - waves * programs
        for parts in range(2, min(MAX_PARTS, k_tiles // MIN_PART_K_BLOCKS) + 1):
            time = waves + -(-rest * parts // programs) / parts + CUT_COST
            if time < best[0] - 1e-9:
                best = (time, waves * programs, parts)
    return best


def launch_matmul(A: torch.Tensor, B: torch.Tensor, C: torch.Tensor, cfg: MatmulConfig,
                  trace_ptr: torch.Tensor | None = None, rank: int = 0) -> None:
    """Launch the persistent matmul ``C = A @ B`` on the current stream (no checks; C may be a strided view).

    With ``trace_ptr`` (a trace buffer, :class:`trident.trace.Trace`'s ``ptr``) every tile is
    recorded as a compute event of ``rank``.
    """
    M, K = A.shape
    N = B.shape[1]
    if not A.is_cuda:  # the simulator's interpreter fix-ups (loops over runtime sizes), also without a context
        interpreter_fixups.apply()
    a, b, use_tma = operands(A, B, cfg)
    c_tma = use_tma and cfg.c_tma and tma_ok(C)
    c = TensorDescriptor.from_tensor(C, [cfg.BLOCK_M, cfg.BLOCK_N // (2 if cfg.subtile else 1)]) if c_tma else C
    tiles = triton.cdiv(M, cfg.BLOCK_M) * triton.cdiv(N, cfg.BLOCK_N)
    k_tiles = triton.cdiv(K, cfg.BLOCK_K)
    programs = cfg.programs or sm_count(A.device)
    whole, parts = cut_plan(tiles, programs, cfg, k_tiles)
    if whole < tiles:  # per call, on the stream: per-tile counts start at zero (the slots are overwritten)
        slots = (tiles - whole) * parts * cfg.BLOCK_M * cfg.BLOCK_N
        part = torch.empty(slots, dtype=torch.float32, device=A.device)
        count = torch.zeros(tiles - whole, dtype=torch.int32, device=A.device)
    else:
        part = count = C  # unused
    grid = (num_programs(A.device, whole + (tiles - whole) * parts, cfg),)
    matmul_kernel[grid](a, b, c, M, N, K, A.stride(0), A.stride(1), B.stride(0), B.stride(1), C.stride(0),
                        C.stride(1), part, count, whole, parts, C if trace_ptr is None else trace_ptr, rank,
                        CUT=whole < tiles, TRACE=trace_ptr is not None,
                        BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N,
                        BLOCK_K=cfg.BLOCK_K, GROUP_M=cfg.GROUP_M, USE_TMA=use_tma, C_TMA=c_tma,
                        SUBTILE=cfg.subtile,
                        # Triton 3.6 fails to flatten a loop that holds the trace's conditional store
                        FLATTEN=cfg.flatten and trace_ptr is None,
                        num_warps=cfg.num_warps, num_stages=cfg.num_stages)


def matmul(A: torch.Tensor, B: torch.Tensor, out: torch.Tensor | None = None,
           config: MatmulConfig | None = None) -> torch.Tensor:
    """``A @ B`` with the persistent Triton matmul (fp32 accumulation).

    Args:
        A: ``M x K``, float16, bfloat16 or float32 (float32 multiplies in TF32 on GPUs, like
            Triton's ``tl.dot``).
        B: ``K x N``, the same dtype and device.
        out: optional ``M x N`` result of that dtype (any strides); a new tensor when None.
        config: a :class:`MatmulConfig`; None picks one from the table (:func:`pick_config`).

    Returns:
        ``out`` (or the new tensor) holding ``A @ B``.

    Example::

        C = trident.ops.matmul(torch.randn(512, 256, device="cuda", dtype=torch.bfloat16),
                               torch.randn(256, 384, device="cuda", dtype=torch.bfloat16))
    """
    check_operands(A, B, "matmul")
    M, N = A.shape[0], B.shape[1]
    if out is None:
        out = torch.empty(M, N, dtype=A.dtype, device=A.device)
    elif not isinstance(out, torch.Tensor) or tuple(out.shape) != (M, N) or out.dtype != A.dtype \
            or out.device != A.device:
        got = f"{tuple(out.shape)} {out.dtype} on {out.device}" if isinstance(out, torch.Tensor) else type(out).__name__
        raise ValueError(f"matmul: out must be ({M}, {N}) {A.dtype} on {A.device}, got {got}")
    if M == 0 or N == 0:
        return out
    if A.shape[1] == 0:
        return out.zero_()
    cfg = config or pick_config(M, N, A.shape[1], A.dtype, "cuda" if A.is_cuda else "sim", sm_count(A.device))
    launch_matmul(A, B, out, cfg)
    return out
