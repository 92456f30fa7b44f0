"""Fused compute + communication ops on a Hopper-tuned persistent matmul.

``trident.ops.matmul(A, B)`` is the GEMM alone. The collective ops, each in several overlap
patterns chosen by name (docs/gemm-all-scatter.md, docs/tensor-parallel-ops.md):

* ``gemm_all_scatter(ctx, A, B_local, C)``: ``C = A @ [B_0 | B_1 | ...]`` on every rank;
* ``all_gather_gemm(ctx, A_local, B, C)``: ``C = [A_0; A_1; ...] @ B`` (rows gathered);
* ``gemm_reduce_scatter(ctx, A, B, C)``: ``C = my rows of sum over ranks of A @ B``.
"""

from .all_gather_gemm import PATTERNS as _AGG_PATTERNS
from .all_gather_gemm import all_gather_gemm
from .gemm_all_scatter import AUTO_TABLE, PATTERNS, choose_pattern, gemm_all_scatter
from .gemm_reduce_scatter import PATTERNS as _GRS_PATTERNS
from .gemm_reduce_scatter import gemm_reduce_scatter
from .matmul import MatmulConfig, matmul, pick_config

#: Patterns of each collective op, by op name.
OP_PATTERNS = {"gemm_all_scatter": PATTERNS, "all_gather_gemm": _AGG_PATTERNS,
               "gemm_reduce_scatter": _GRS_PATTERNS}

__all__ = ["matmul", "MatmulConfig", "pick_config", "gemm_all_scatter", "PATTERNS", "AUTO_TABLE", "choose_pattern",
           "all_gather_gemm", "gemm_reduce_scatter", "OP_PATTERNS"]
