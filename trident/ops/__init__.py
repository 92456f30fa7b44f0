"""Fused compute + communication ops on a Hopper-tuned persistent matmul.

``trident.ops.matmul(A, B)`` is the GEMM alone. The collective ops, each in several overlap
patterns chosen by name (docs/gemm-all-scatter.md, docs/tensor-parallel-ops.md):

* ``gemm_all_scatter(ctx, A, B_local, C)``: ``C = A @ [B_0 | B_1 | ...]`` on every rank;
* ``all_gather_gemm(ctx, A_local, B, C)``: ``C = [A_0; A_1; ...] @ B`` (rows gathered);
* ``gemm_reduce_scatter(ctx, A, B, C)``: ``C = my rows of sum over ranks of A @ B``;
* ``gemm_all_reduce(ctx, A, B, C)``: ``C = sum over ranks of A @ B`` on every rank (row-parallel
  linear layers in tensor-parallel inference);
* ``all_reduce_rmsnorm(ctx, x, weight, residual=...)``: ``h = all_reduce(x) + residual`` and its
  RMSNorm, in one kernel (what follows a row-parallel layer in a decoder).

Expert parallelism (docs/moe.md): ``moe_dispatch(ctx, x, topk_idx, num_experts)`` sends tokens to the
ranks of their experts and ``moe_combine(ctx, expert_out, topk_weights, d)`` brings the weighted
sum back, each one kernel with no host synchronisation; ``moe_heap_bytes(...)`` is the heap they
need (call it before ``trident.init``).

Each op is described by one :class:`~trident.ops.fused.call.OpSpec` in :data:`OPS` (its
patterns, its measured ``auto`` table, its default communication programs), and
:func:`choose_pattern` says what ``pattern="auto"`` runs for any of them.

Example::

    trident.ops.OPS["all_gather_gemm"].pattern_names   # ('bulk_synchronous', ..., 'baseline', 'auto')
    trident.ops.choose_pattern(ctx, "gemm_reduce_scatter", 8192, 8192, 3584)
"""

from .fused.call import OpSpec
from .gemm.matmul import SIM_CONFIG, MatmulConfig, matmul, pick_config
from .moe.combine import moe_combine
from .moe.dispatch import MoEDispatch, moe_dispatch
from .moe.sizing import default_capacity, moe_heap_bytes
from .rmsnorm.all_reduce_rmsnorm import all_reduce_rmsnorm
from .tensor_parallel.all_gather_gemm import ALL_GATHER_GEMM, all_gather_gemm
from .tensor_parallel.gemm_all_reduce import GEMM_ALL_REDUCE, gemm_all_reduce
from .tensor_parallel.gemm_all_scatter import AUTO_TABLE, GEMM_ALL_SCATTER, PATTERNS, gemm_all_scatter
from .tensor_parallel.gemm_reduce_scatter import GEMM_REDUCE_SCATTER, gemm_reduce_scatter

#: The fused ops by name.
OPS: dict[str, OpSpec] = {spec.name: spec for spec in (GEMM_ALL_SCATTER, ALL_GATHER_GEMM, GEMM_REDUCE_SCATTER,
                                                       GEMM_ALL_REDUCE)}
#: Every value of each op's ``pattern`` argument, by op name.
OP_PATTERNS: dict[str, tuple[str, ...]] = {name: spec.pattern_names for name, spec in OPS.items()}


def choose_pattern(ctx, op: str, M: int, N: int, K: int) -> str:
    """What ``pattern="auto"`` of op ``op`` runs for an ``M x N x K`` product on this context.

    ``M, N, K`` as the op sees the problem: for ``gemm_all_scatter`` N is all ranks' columns, for
    ``all_gather_gemm`` M is all ranks' rows, for ``gemm_reduce_scatter`` and ``gemm_all_reduce`` K
    is this rank's shard.
    The first rule of the op's ``auto`` table for this GPU and world size whose size threshold
    ``M*N*K`` reaches, else ``baseline``; with ranks sharing a GPU (NCCL cannot run there)
    ``fused_sequential``, a correctness setting only.

    Example::

        trident.ops.choose_pattern(ctx, "gemm_all_scatter", 8192, 4608, 36864)  # measured choice, else 'baseline'
    """
    if op not in OPS:
        raise ValueError(f"choose_pattern: op={op!r} is not one of {tuple(OPS)}")
    return OPS[op].choose(ctx.platform, M * N * K)


__all__ = ["matmul", "MatmulConfig", "SIM_CONFIG", "pick_config", "gemm_all_scatter", "all_gather_gemm",
           "gemm_reduce_scatter", "gemm_all_reduce", "all_reduce_rmsnorm", "OPS", "OpSpec", "OP_PATTERNS",
           "choose_pattern", "PATTERNS", "AUTO_TABLE", "moe_dispatch", "moe_combine", "MoEDispatch",
           "moe_heap_bytes", "default_capacity"]
