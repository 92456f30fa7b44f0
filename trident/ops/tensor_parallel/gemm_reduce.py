"""What gemm_all_reduce and gemm_reduce_scatter share: a GEMM whose product is a partial sum.

Each rank holds A (M x K_local) and B (K_local x N), so ``A @ B`` is one of W partial sums of
the M x N result. The two ops differ only in who keeps which rows of the sum: every rank all M
rows (all-reduce), or rank r its m = M / W rows (reduce-scatter): C's rows. Their patterns are
one set of functions here, told which by ``to_every_rank``:

* :func:`partial_product`: ``bulk_synchronous``'s matmul into the collectives' input buffer
  (the op then runs its library collective on it);
* :func:`push_then_sum` (``fused_sequential``) and :func:`push_and_sum`
  (``workgroup_specialized``): the kernels of :mod:`trident.ops.tensor_parallel.gemm_reduce_kernels`, which
  store each partial tile into a slot of the rank that keeps its rows (a rank's own rows straight
  into its C) and add the peers' slots into C there.

:func:`partial_product_spec` makes either op's :class:`~trident.ops.fused.call.OpSpec` from its
own ``bulk_synchronous`` and ``baseline``.

Example::

    GEMM_ALL_REDUCE = partial_product_spec("gemm_all_reduce", _bulk_synchronous, _baseline, AUTO_TABLE,
                                           to_every_rank=True, collective_elements=_collective_elements)
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import triton

from ...ccl.api import input_stage
from ...runtime.resources import GrowingBuffer
from ..fused.call import AutoTable, FusedCall, OpSpec, check_gemm_call, split_roles
from ..gemm.matmul import launch_matmul, num_programs, operands
from . import gemm_reduce_kernels as kernels

#: Reducer programs of ``workgroup_specialized`` on a GPU, when not given.
GPU_COMM_PROGRAMS = 16
#: Elements one program of :func:`~trident.ops.tensor_parallel.gemm_reduce_kernels.reduce_slots_kernel` sums at a time.
REDUCE_BLOCK = 1024


def check_partial_product_args(ctx, spec: OpSpec, A, B, C, pattern, config, comm_programs, rows_per_rank: bool) -> None:
    """Every argument problem of a call of ``spec``, raised before anything runs (the message names the rank).

    C must be ``(M, N)``, or ``(M / world_size, N)`` with ``rows_per_rank`` (M divisible by the world size).

    Example::

        check_partial_product_args(ctx, GEMM_REDUCE_SCATTER, A, B, C, pattern, None, None, rows_per_rank=True)
    """
    where = check_gemm_call(ctx, spec, pattern, config, comm_programs, ("M x K_local", "K_local x N"), A=A, B=B, C=C)
    w = ctx.world_size
    if rows_per_rank and A.shape[0] % w:
        raise ValueError(f"{where}: A has {A.shape[0]} rows; M must be divisible by world_size {w}")
    want = (A.shape[0] // w if rows_per_rank else A.shape[0], B.shape[1])
    if tuple(C.shape) != want:
        expected = "(M / world_size, N)" if rows_per_rank else "(M, N)"
        raise ValueError(f"{where}: C is {tuple(C.shape)}; expected {expected} = {want}")
    ctx.agree_in_debug(spec.name, tuple(A.shape), tuple(B.shape), A.dtype, pattern)


def partial_product(call: FusedCall) -> torch.Tensor:
    """This rank's ``A @ B`` (M x N) in the collectives' input buffer, so that the collective run on
    it next needs no second copy on the heap (zeros when K is 0)."""
    A, B, ctx = call.A, call.B, call.ctx
    M, K = A.shape
    N = B.shape[1]
    partial = input_stage(ctx, M * N, A.dtype).view(M, N)
    if K:
        launch_matmul(A, B, partial, call.cfg, call.trace_ptr, ctx.rank)
    else:
        partial.zero_()
    return partial


def _slots(call: FusedCall, rows: int) -> torch.Tensor:
    """W slots of ``rows x N`` (one heap buffer per op, kept and grown per context): rank s stores
    its partial of my rows into my ``slots[s]``."""
    N, W = call.B.shape[1], call.ctx.world_size
    buffer = call.ctx.resource(f"ops.{call.spec.name}.slots",
                               lambda: GrowingBuffer(call.ctx, what="its partial-sum slots"))
    return buffer.view(W * rows * N, call.A.dtype).view(W, rows, N)


def _operands(call: FusedCall):
    """``(a, b, use_tma)``: A and B as the kernels take them (TMA descriptors where they can be)."""
    A, B = call.A, call.B
    return operands(A, B, call.cfg) if A.shape[1] else (A, B, False)


def _sizes(call: FusedCall, rows: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The kernels' size arguments: ``(rows, N, K)`` and A's and B's strides."""
    A, B = call.A, call.B
    return (rows, B.shape[1], A.shape[1]), (A.stride(0), A.stride(1), B.stride(0), B.stride(1))


def push_then_sum(call: FusedCall, to_every_rank: bool) -> None:
    """``fused_sequential``: one kernel pushes every partial tile into the slot of the rank(s) that
    keep its rows (my own rows' straight into C); then a local kernel adds the peers' slots into C."""
    ctx, cfg, (rows, N) = call.ctx, call.cfg, call.C.shape
    slots = _slots(call, rows)
    a, b, use_tma = _operands(call)
    per_slot = triton.cdiv(rows, cfg.BLOCK_M) * triton.cdiv(N, cfg.BLOCK_N)
    computed = per_slot if to_every_rank else ctx.world_size * per_slot  # the tiles of my whole product
    call.launch_gemm(kernels.push_kernel, (num_programs(ctx.platform, computed, cfg),), (
        a, b, slots, call.C, *_sizes(call, rows),
        call.sync(), call.trace_ptr,
        ctx.rank, ctx.world_size, ctx.heap_bases,
    ), tile_as_tuple=True, USE_TMA=use_tma, TO_EVERY_RANK=to_every_rank)
    if ctx.world_size == 1:
        return  # my own partial is C: no peer's slot to add
    programs = max(1, min(triton.cdiv(rows * N, REDUCE_BLOCK), 4 * ctx.platform.sm_count))
    call.launch(kernels.reduce_slots_kernel, (programs,), (slots, call.C, rows, N, ctx.rank, ctx.world_size),
                dict(BLOCK=REDUCE_BLOCK), num_warps=4)


def push_and_sum(call: FusedCall, to_every_rank: bool) -> None:
    """``workgroup_specialized``: one kernel whose GEMM programs push tiles and flag them where they
    stored them (my own rows' into C), and whose reducer programs add the peers' slots into each of my
    tiles of C once all W ranks flagged it."""
    ctx, cfg, (rows, N) = call.ctx, call.cfg, call.C.shape
    slots = _slots(call, rows)
    a, b, use_tma = _operands(call)
    per_slot = triton.cdiv(rows, cfg.BLOCK_M) * triton.cdiv(N, cfg.BLOCK_N)  # my tiles of C, and each peer's
    computed = per_slot if to_every_rank else ctx.world_size * per_slot
    sync = call.sync(flags=ctx.world_size * per_slot)
    # The reducers wait for the GEMM programs of every rank's launch; alone, there is no peer's slot to add.
    reduce_work = per_slot if ctx.world_size > 1 else 0
    gemm_programs, comm = split_roles(call, comm_work=reduce_work, other_work=computed)
    call.launch_gemm(kernels.push_reduce_kernel, (gemm_programs + comm,), (
        a, b, slots, call.C, *_sizes(call, rows),
        gemm_programs,
        sync, call.trace_ptr,
        ctx.rank, ctx.world_size, ctx.heap_bases,
    ), tile_as_tuple=True, USE_TMA=use_tma, TO_EVERY_RANK=to_every_rank)


def partial_product_extra_bytes(to_every_rank: bool, collective_elements: Callable[[int, int, int], int]):
    """The op's ``extra_bytes`` (:class:`OpSpec`): ``collective_elements(M, N, W)`` is what its
    ``bulk_synchronous`` moves after the matmul; the fused patterns move nothing at one rank and
    else read the W - 1 peers' slots, then read and write C once (``rows x N``, rows the rows a rank keeps)."""
    def extra_bytes(pattern: str, shape: tuple[int, int, int], world_size: int, element_size: int) -> int | None:
        M, N, _ = shape
        rows = M if to_every_rank else M // world_size
        if pattern == "bulk_synchronous":
            return collective_elements(M, N, world_size) * element_size
        if pattern in ("fused_sequential", "workgroup_specialized"):
            return (world_size + 1) * rows * N * element_size if world_size > 1 else 0
        return None
    return extra_bytes


def partial_product_spec(name: str, bulk_synchronous: Callable[[FusedCall], None],
                         baseline: Callable[[FusedCall], None], auto_table: AutoTable, to_every_rank: bool,
                         collective_elements: Callable[[int, int, int], int]) -> OpSpec:
    """The :class:`OpSpec` of a partial-product op: its own ``bulk_synchronous`` and ``baseline``,
    and the fused patterns here (:func:`push_then_sum`, :func:`push_and_sum`) told ``to_every_rank``.

    Args:
        name: the op's name.
        bulk_synchronous, baseline: the op's patterns of those names (a library collective, NCCL).
        auto_table: the op's measured ``auto`` choices.
        to_every_rank: every rank keeps all M rows of the sum (all-reduce), else only its own (reduce-scatter).
        collective_elements: ``(M, N, world_size)`` -> the elements ``bulk_synchronous`` reads and writes
            after its matmul (:func:`partial_product_extra_bytes`).

    Example::

        GEMM_REDUCE_SCATTER = partial_product_spec("gemm_reduce_scatter", _bulk_synchronous, _baseline,
                                                   AUTO_TABLE, to_every_rank=False,
                                                   collective_elements=_collective_elements)
    """
    return OpSpec(
        name=name,
        patterns={"bulk_synchronous": bulk_synchronous,
                  "fused_sequential": functools.partial(push_then_sum, to_every_rank=to_every_rank),
                  "workgroup_specialized": functools.partial(push_and_sum, to_every_rank=to_every_rank),
                  "baseline": baseline},
        auto_table=auto_table,
        gpu_comm_programs=lambda world_size: GPU_COMM_PROGRAMS,
        replayable=frozenset({"fused_sequential", "workgroup_specialized"}),
        extra_bytes=partial_product_extra_bytes(to_every_rank, collective_elements))
