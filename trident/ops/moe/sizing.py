"""How many rows and heap bytes MoE dispatch and combine need, before ``trident.init``.

``moe_heap_bytes`` is the size hint (as DeepEP's ``get_*_buffer_size_hint``): the heap a context
needs so that dispatch and combine at the given sizes find room for their buffers. Pass it, plus
what your own heap tensors need, to ``trident.init(heap_size=...)``. docs/moe.md has the formula.

Example::

    need = trident.ops.moe_heap_bytes(4096, 7168, 8, 256, world_size=8, fp8_scales=True)
    ctx = trident.init(heap_size=need + (1 << 30))   # + my own heap tensors
"""

from __future__ import annotations

import torch

from ... import layout as heap_layout
from ...ccl.kernels import sync_words as ccl_sync_words
from ..fused.sync import sync_words
from .kernels import MAX_EXPERTS, STATUS_WORDS

#: Columns per fp8 scale (``x_scales`` is ``[T, H / SCALE_BLOCK]``).
SCALE_BLOCK = 128


def default_capacity(world_size: int, max_tokens_per_rank: int, topk: int) -> int:
    """``moe_dispatch``'s default capacity: ``W * max_tokens_per_rank * k`` rows, the worst case.

    Every valid ``(token, j)`` of ``topk_idx`` is one received row, and nothing stops a token from
    naming one expert (or experts of one rank) in all k of its slots, so in the worst case one rank
    receives k rows from every token of every rank.

    Example::

        rows = default_capacity(8, 128, 8)   # 8192
    """
    return int(world_size) * int(max_tokens_per_rank) * int(topk)


#: Rows the prefill path's receive buffer is rounded up to (``max_tokens_per_rank=None``).
PREFILL_ROWS_ROUNDING = 256
#: The masked layout's region (rows per local expert) on that path: the most rows an expert receives,
#: rounded up to this (a GEMM tile's rows).
MASKED_ROWS_ROUNDING = 64


def prefill_capacity(received_rows: int, rounding: int = PREFILL_ROWS_ROUNDING) -> int:
    """The capacity ``moe_dispatch`` takes when ``max_tokens_per_rank`` is None and ``capacity`` is
    None (the prefill path): the most rows any rank receives in this call (the ranks exchange their
    counts on the host, which that path does anyway), rounded up to ``rounding`` so that calls of
    similar sizes reuse one buffer. It cannot overflow. In the masked layout, the most rows any
    expert receives, rounded up to :data:`MASKED_ROWS_ROUNDING`: the region per local expert.

    Example::

        prefill_capacity(30)   # 256
        prefill_capacity(30, MASKED_ROWS_ROUNDING)   # 64
    """
    rows = max(int(received_rows), 1)
    return -(-rows // rounding) * rounding


def receive_rows(layout: str, world_size: int, max_tokens_per_rank: int, topk: int, experts_local: int,
                 capacity: int | None = None) -> int:
    """Rows of a dispatch's receive buffers: contiguous, ``capacity`` or :func:`default_capacity`;
    masked, ``experts_local`` regions of ``capacity`` rows, or of ``W * max_tokens_per_rank`` (every
    token of every rank, each naming the expert at most once).

    Example::

        receive_rows("masked", 8, 128, 8, 32)   # 32768
    """
    if layout == "masked":
        return int(experts_local) * (int(world_size) * int(max_tokens_per_rank) if capacity is None else int(capacity))
    return default_capacity(world_size, max_tokens_per_rank, topk) if capacity is None else int(capacity)


def _aligned(nbytes: int) -> int:
    return (int(nbytes) + heap_layout.ALLOC_ALIGN - 1) // heap_layout.ALLOC_ALIGN * heap_layout.ALLOC_ALIGN


def _block(nbytes: int) -> int:
    """The heap bytes of one workspace buffer of ``nbytes`` (a power of two, at least one byte), aligned."""
    return _aligned(1 << (max(int(nbytes), 1) - 1).bit_length())


def moe_heap_bytes(tokens_per_rank: int, hidden: int, topk: int, num_experts: int, world_size: int,
                   dtype: torch.dtype = torch.bfloat16, fp8_scales: bool = False, capacity: int | None = None,
                   combine_dtype: torch.dtype | None = None, layout: str = "contiguous",
                   buffer_sets: int = 1) -> int:
    """Heap bytes that ``moe_dispatch`` and ``moe_combine`` need at these sizes (per rank, the same on all).

    Each buffer is rounded up to a power of two (the workspace grows that way), and the control
    block and the collectives' small state are included; your own heap tensors are not.

    Args:
        tokens_per_rank: ``max_tokens_per_rank`` (the most tokens any rank passes).
        hidden: H. topk: k. num_experts: E. world_size: W (of the context or group).
        dtype: the widest token dtype dispatched (bf16 by default; fp8 rows are half as wide).
        fp8_scales: whether fp8 rows with ``x_scales`` are dispatched too (their scales buffer).
        capacity: the ``capacity`` passed to ``moe_dispatch``; None: the default
            (:func:`default_capacity`; in the masked layout ``world_size * tokens_per_rank`` rows per
            local expert).
        combine_dtype: ``expert_out``'s dtype in ``moe_combine``; None: ``dtype`` (bf16 for fp8).
        layout: ``moe_dispatch``'s ``layout``: ``"contiguous"`` or ``"masked"`` (a region of
            ``capacity`` rows per local expert, and the slot cursors instead of the count matrix).
        buffer_sets: how many ``buffer_set`` values the program uses (each has its own receive buffers).

    Returns:
        Bytes, to add to what the program allocates itself when choosing ``trident.init(heap_size=)``.
        Valid when the largest call is the first (or the buffers never grow): a buffer that grows
        frees the old one and takes new memory, and the freed hole may not fit the next one.

    Example::

        need = trident.ops.moe_heap_bytes(4096, 7168, 8, 256, 8, fp8_scales=True)   # about 4.6 GiB
    """
    experts_local = num_experts // world_size
    rows = receive_rows(layout, world_size, tokens_per_rank, topk, experts_local, capacity)
    token_bytes = torch.empty((), dtype=dtype).element_size()
    out_bytes = torch.empty((), dtype=combine_dtype or (torch.bfloat16 if token_bytes == 1 else dtype)).element_size()
    staged = tokens_per_rank * topk
    per_set = [  # each buffer set's own: what a dispatch result holds
        rows * hidden * token_bytes,                                        # recv_x
        rows * (hidden // SCALE_BLOCK) * 4 if fp8_scales else 0,            # recv_scales (fp32)
        rows * 8, rows * 4,                                                 # recv_src (int64), recv_j (int32)
        (2 * num_experts + 2 * experts_local + staged) * 4,                 # cursors, offsets, counts, map
        STATUS_WORDS * 8,                                                   # status words
    ]
    shared = [  # what lives only during a call
        (experts_local if layout == "masked" else MAX_EXPERTS + world_size * num_experts) * 4,  # cursors, or tally
                                                                            # and count matrix
        sync_words(world_size, world_size + 1) * 8,                         # sync block
    ]
    if world_size > 1:
        shared.append(staged * hidden * out_bytes)                          # combine staging (rows pushed home)
    fixed = [ccl_sync_words(world_size) * 8, 3 * world_size * 8]            # collectives' sync block, table
    buffers = per_set * int(buffer_sets) + shared
    return heap_layout.CONTROL_BYTES + sum(_block(b) for b in buffers) + sum(_aligned(b) for b in fixed)


__all__ = ["default_capacity", "prefill_capacity", "receive_rows", "moe_heap_bytes", "PREFILL_ROWS_ROUNDING",
           "MASKED_ROWS_ROUNDING"]
