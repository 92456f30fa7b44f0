"""What a dispatch returns: :class:`MoEDispatch` (the rows this rank received) and :class:`MoEHandle`
(the routing its combine needs), and the buffer sets they live in.

A result is valid until the next ``moe_dispatch`` of its buffer set on the same context (or group):
:class:`DispatchCount` counts them per set, and ``moe_combine`` refuses an older result.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from ...errors import CapacityError
from ...faults import describe_capacity_fault
from .kernels import STATUS_NEEDED, STATUS_WORST

#: The per-context resource that counts dispatches (a result is valid until the next of its buffer set).
STATE_KEY = "ops.moe"


def buffer_names(buffer_set: int) -> tuple[str, str]:
    """``(workspace name prefix, dispatch-count resource key)`` of a buffer set: set 0 is ``moe``;
    each set has its own receive buffers, so results of different sets stay valid side by side."""
    return ("moe", STATE_KEY) if buffer_set == 0 else (f"moe{buffer_set}", f"{STATE_KEY}.{buffer_set}")


class DispatchCount:
    """What the context remembers between calls: how many dispatches it ran (a result's generation)."""

    def __init__(self):
        self.calls = 0


@dataclasses.dataclass(frozen=True, eq=False)
class MoEHandle:
    """The routing a dispatch leaves for its combine (as DeepEP's handle): which of its token's k
    choices each received row is (``recv_j``, int32 ``[capacity]``), the dispatch's counters
    (``status``, int64 ``[STATUS_WORDS]``), this rank's ``recv_offsets`` then ``recv_counts``
    (``layout``, int32 ``[2 * E_local]``), where each of this rank's choices went (``sent``, int32
    ``[T * k]``: ``owner * capacity + slot``, -1 for none), the team it ran on and its call number there."""

    recv_j: torch.Tensor
    status: torch.Tensor
    layout: torch.Tensor
    sent: torch.Tensor
    team: object
    call: int


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class MoEDispatch:
    """What ``moe_dispatch`` received on this rank; the input of ``moe_combine``.

    Rows are grouped by local expert: local expert ``e`` (global ``rank * E_local + e``) has rows
    ``recv_offsets[e] .. recv_offsets[e] + recv_counts[e]`` of ``recv_x``, one per (token, j) routed
    to it from any rank, in an order of the call's choosing. In the contiguous layout the experts'
    rows follow each other and rows past the last expert's are unused (``recv_src`` -1); in the
    masked layout expert ``e``'s rows start at ``e * expert_capacity`` (``recv_x.view(E_local,
    expert_capacity, H)`` is the ``[E, M, H]`` input of a masked grouped GEMM, ``recv_counts`` its
    ``masked_m``) and the rest of its region is unused and not cleared.

    Attributes:
        recv_x: ``[capacity, H]``, x's dtype (float8_e4m3fn with ``quantize="fp8"``): the received
            token rows (a view of the heap workspace).
        recv_offsets, recv_counts: ``[E_local]`` int32 device tensors (never read by the host).
        recv_src: ``[capacity]`` int64: each row's origin, ``src_rank * max_tokens_per_rank +
            token_index``; -1 for unused rows in the contiguous layout (the masked one does not clear
            its regions' unused rows).
        recv_scales: ``[capacity, H / 128]`` float32, the rows' scales, for fp8 ``x`` or with
            ``quantize``; else None.
        num_experts, num_local_experts: E and E / world_size.
        max_tokens_per_rank: the T every rank stays within (given, or agreed by the call).
        capacity: rows of the receive buffers (masked: ``E_local * expert_capacity``).
        layout: ``"contiguous"`` or ``"masked"``.
        expert_capacity: rows per local expert in the masked layout; None in the contiguous one.
        buffer_set: which set of receive buffers holds the result (``moe_dispatch``'s ``buffer_set``).
        topk_idx: this rank's routing ``[T, k]`` (the caller's tensor, kept for the combine: do not
            change it in place before :func:`~trident.ops.moe.combine.moe_combine`).
        handle: what the combine needs besides ``recv_src`` (:class:`MoEHandle`).

    A result is valid until the next ``moe_dispatch`` on the same context (or group) and buffer set:
    the receive buffers are reused. With ``max_tokens_per_rank`` given the call does not wait for the device,
    so a capacity overflow is reported later: by :meth:`check`, ``ctx.check()`` or ``ctx.barrier()``.
    """

    recv_x: torch.Tensor
    recv_offsets: torch.Tensor
    recv_counts: torch.Tensor
    recv_src: torch.Tensor
    recv_scales: torch.Tensor | None
    num_experts: int
    num_local_experts: int
    max_tokens_per_rank: int
    capacity: int
    topk_idx: torch.Tensor
    handle: MoEHandle
    layout: str = "contiguous"
    expert_capacity: int | None = None
    buffer_set: int = 0

    def __repr__(self) -> str:
        return (f"MoEDispatch(recv_x={tuple(self.recv_x.shape)} {self.recv_x.dtype}, experts={self.num_experts} "
                f"({self.num_local_experts} here), max_tokens_per_rank={self.max_tokens_per_rank}, "
                f"capacity={self.capacity}, layout={self.layout!r}, fp8 scales={self.recv_scales is not None})")

    def check(self) -> None:
        """Raise :class:`~trident.errors.CapacityError` if the call needed more rows than ``capacity``
        on any rank (waits for the device). Also raises any other fault this rank's kernels recorded.

        Example::

            d = trident.ops.moe_dispatch(ctx, x, idx, 64, max_tokens_per_rank=128, capacity=2048)
            d.check()   # once, outside the captured region, to validate the capacity
        """
        team: Any = self.handle.team
        getattr(team, "ctx", team).check()  # a fault the kernel recorded, raised and cleared
        needed, worst = self.handle.status[STATUS_NEEDED:STATUS_WORST + 1].tolist()
        bound = self.capacity if self.expert_capacity is None else self.expert_capacity
        if needed > bound:
            raise CapacityError(describe_capacity_fault(team.rank, worst, bound, needed, self.layout == "masked"))


__all__ = ["MoEDispatch", "MoEHandle", "DispatchCount", "buffer_names", "STATE_KEY"]
