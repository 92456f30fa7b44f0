"""The matmul's tile configs: :class:`MatmulConfig`, the measured table, and how tiles are cut.

:func:`pick_config` chooses a config from a small table measured on an H200 (a pure function of
the shape, dtype and platform, so every rank chooses the same one: see :mod:`trident.ops.matmul`
for why there is no autotuning). :func:`cut_plan` decides which tiles of a persistent grid are
cut into parts along K (``split_k``, ``split_tail``).
"""

from __future__ import annotations

import dataclasses

import torch

from ... import platform as _platform


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
    ``tail_n`` > 0 widens every tile by a second column block of that many columns (a power of two
    below ``BLOCK_N``, read and multiplied in the same K loop): tiles ``BLOCK_M x (BLOCK_N + tail_n)``
    tile a width no power of two divides, such as an 8-rank shard's 576 = 2 x (256 + 32), with no
    ragged columns and one wave of tiles where powers of two leave a partial one. Only the matmul
    has such tiles (not the fused ops' kernels); C is stored through pointers, and no tile is cut.
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
    tail_n: int = 0

    def __post_init__(self):
        if self.split_k < 1:
            raise ValueError(f"MatmulConfig: split_k must be at least 1, got {self.split_k}")
        if self.split_k > 1 and self.split_tail:
            raise ValueError("MatmulConfig: split_k > 1 and split_tail=True are two ways to cut K; choose one")
        if self.tail_n:
            if self.tail_n < 16 or self.tail_n & (self.tail_n - 1) or self.tail_n >= self.BLOCK_N:
                raise ValueError(f"MatmulConfig: tail_n must be 0 or a power of two >= 16 below BLOCK_N="
                                 f"{self.BLOCK_N}, got {self.tail_n}")
            if self.split_k > 1 or self.split_tail or self.c_tma:
                raise ValueError("MatmulConfig: tiles with a tail (tail_n > 0) are never cut and store C through "
                                 "pointers: leave split_k=1, split_tail=False and c_tma=False")

    @property
    def width(self) -> int:
        """Columns of one tile: ``BLOCK_N + tail_n``."""
        return self.BLOCK_N + self.tail_n


#: The simulator: small tiles, since every program runs in Python.
SIM_CONFIG = MatmulConfig(BLOCK_M=32, BLOCK_N=32, BLOCK_K=32, GROUP_M=2, num_warps=4, num_stages=1)

#: H200 candidates (bf16/fp16): ``wide`` (128x256 tiles, flattened loop) for full-width products,
#: ``tall`` (256x128 tiles, descriptor store, split tail) for narrow shards, ``shard``
#: (128x(256+32) tiles) for widths of 288 columns a tile such as an 8-rank 8192x576x36864 (128 tiles:
#: one wave on 132 SMs), ``small`` for small products. The sweeps behind them: docs/results/journal.md.
GPU_CONFIGS = {
    "wide": MatmulConfig(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, GROUP_M=8, num_warps=8, num_stages=3, flatten=True,
                         split_tail=True),
    "tall": MatmulConfig(BLOCK_M=256, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_warps=8, num_stages=4, c_tma=True,
                         subtile=True, split_tail=True),
    "narrow": MatmulConfig(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_warps=4, num_stages=4,
                           split_tail=True),
    "small": MatmulConfig(BLOCK_M=64, BLOCK_N=64, BLOCK_K=64, GROUP_M=8, num_warps=4, num_stages=4),
    "shard": MatmulConfig(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, GROUP_M=8, num_warps=8, num_stages=4, tail_n=32),
}
#: Candidates for large products with the relative speed of one full tile on the H200
#: (measurements: docs/results/journal.md; ``shard``'s, per column, on an H100 on 2026-12-08).
_CANDIDATES = ((GPU_CONFIGS["wide"], 1.0), (GPU_CONFIGS["tall"], 0.97), (GPU_CONFIGS["narrow"], 0.85),
               (GPU_CONFIGS["shard"], 0.81))


def _efficiency(M: int, N: int, K: int, cfg: MatmulConfig, sms: int, speed: float) -> float:
    """Useful fraction of the work a persistent grid does: ragged edges, and the last, partial
    wave (or, with ``split_tail``, the parts that fill it and their cost: :func:`cut_plan`)."""
    tiles_m, tiles_n = -(-M // cfg.BLOCK_M), -(-N // cfg.width)
    tiles = tiles_m * tiles_n
    time = _plan(tiles, sms, cfg, -(-K // cfg.BLOCK_K))[0]
    return speed * (M * N) / (tiles_m * cfg.BLOCK_M * tiles_n * cfg.width) * tiles / (time * sms)


def pick_config(M: int, N: int, K: int, dtype: torch.dtype, platform: _platform.Platform,
                column_tail: bool = True) -> MatmulConfig:
    """The table's config for an ``M x K @ K x N`` product on ``platform`` (the same on every rank).

    Args:
        M, N, K: the product's sizes.
        dtype: A's and B's dtype.
        platform: where it runs (``ctx.platform``, or ``trident.platform.for_device(A.device)``).
        column_tail: whether tiles may have a tail of columns (``tail_n``; the matmul's kernel only,
            so the fused ops pass False).

    Returns:
        :data:`SIM_CONFIG` in the simulator. On a GPU: 64x64 tiles for small products; otherwise
        the candidate whose tiles waste the least (ragged edges, a last wave that leaves SMs idle
        on ``platform.sm_count`` SMs), weighted by its measured tile speed.

    Example::

        cfg = pick_config(8192, 576, 36864, torch.bfloat16, ctx.platform)   # H200: 128x(256+32), one wave
    """
    if platform.simulator:
        return SIM_CONFIG
    if M * N <= 1024 * 1024:
        return GPU_CONFIGS["small"]
    if dtype == torch.float32:  # fp32 tiles are twice the bytes: 128x128, fewer stages
        return dataclasses.replace(GPU_CONFIGS["narrow"], num_stages=3)
    candidates = [c for c in _CANDIDATES if column_tail or not c[0].tail_n]
    return max(candidates, key=lambda c: _efficiency(M, N, K, c[0], platform.sm_count, c[1]))[0]


#: Cost of cutting tiles (the parts' sums written and read back), in tile-times: a plan that cuts
#: must beat keeping every tile whole by more than this, since cutting costs more than the parts'
#: traffic alone (the measurement that set it: docs/results/journal.md).
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
    best: tuple[float, int, int] = (-(-tiles // programs), tiles, 1)
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
