"""Fused compute + communication ops: a Hopper-tuned persistent matmul and GEMM + all-scatter.

``trident.ops.matmul(A, B)`` is the GEMM alone; ``trident.ops.gemm_all_scatter(ctx, A, B_local, C)``
computes ``C = A @ [B_0 | B_1 | ...]`` with every rank's column block scattered into every
rank's ``C``, in one of the overlap patterns of docs/gemm-all-scatter.md.
"""

from .gemm_all_scatter import AUTO_TABLE, PATTERNS, choose_pattern, gemm_all_scatter
from .matmul import MatmulConfig, matmul, pick_config

__all__ = ["matmul", "MatmulConfig", "pick_config", "gemm_all_scatter", "PATTERNS", "AUTO_TABLE", "choose_pattern"]
