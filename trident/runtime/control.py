"""Host access to this rank's control block (see ``trident.layout``)."""

from __future__ import annotations

import torch

from .. import faults, layout
from ..faults import (
    describe_capacity_fault,
    describe_heap_fault,
    describe_offsets_fault,
    describe_peer_fault,
    describe_unreachable_fault,
    describe_wait_fault,
)


class ControlBlock:
    """The int64 words at the start of this rank's heap that kernels and the host share.

    The abort word comes from the backend (``HeapBackend.abort_word``): a word the host raises
    with a plain CPU store and kernels read (pinned host memory on a GPU, a heap word in the
    simulator).
    """

    def __init__(self, heap: torch.Tensor, heap_size: int, world_size: int, abort_word: torch.Tensor,
                 abort_addr: int):
        self.words = heap[:layout.CONTROL_BYTES].view(torch.int64)
        self.heap_size, self.world_size = heap_size, world_size
        self.abort_reason = ""
        self.abort_word, self.abort_addr = abort_word, abort_addr

    def release(self) -> None:
        """Drop this object's views of the heap (at ``ctx.close()``)."""
        faults.set_abort_reason(self.abort_addr, "")
        self.words = None  # type: ignore[assignment]  # released: every later use is refused first
        self.abort_word = None  # type: ignore[assignment]

    def reset(self, wait_timeout: float) -> None:
        """Clear everything and write the header (before any peer may touch the heap)."""
        self.words.zero_()
        self.words[layout.MAGIC] = layout.MAGIC_VALUE
        self.words[layout.HEAP_SIZE] = self.heap_size
        self.words[layout.WORLD_SIZE] = self.world_size
        self.words[layout.ABORT_ADDR] = self.abort_addr
        self.wait_timeout = wait_timeout

    @property
    def wait_timeout(self) -> float:
        return int(self.words[layout.WAIT_TIMEOUT_NS].item()) / 1e9

    @wait_timeout.setter
    def wait_timeout(self, seconds: float) -> None:
        self.words[layout.WAIT_TIMEOUT_NS] = int(seconds * 1e9)

    def set_abort(self, on: bool, reason: str = "") -> None:
        """Raise (or lower) the abort word device waits poll; ``reason`` goes into their fault message."""
        self.abort_reason = reason if on else ""
        faults.set_abort_reason(self.abort_addr, self.abort_reason)  # what the simulator's raising wait reports
        # A plain CPU store. A CUDA call here (even on a side stream) can stall for as long as a
        # kernel spins: a dying peer's driver teardown holds the GPU while this rank's wait runs.
        if self.abort_word is not None:
            self.abort_word[0] = int(on)

    def take_fault(self) -> tuple[int, str] | None:
        """The recorded fault as ``(kind, message)``, or None; clears it (the abort word stays)."""
        first, last = layout.ERROR_COUNT, layout.ERROR_OBSERVED
        count, kind, rank, peer, offset, expected, observed = self.words[first:last + 1].tolist()
        if count == 0:
            return None
        self.words[first:last + 1] = 0
        if kind == layout.ERR_OUT_OF_HEAP:
            message = describe_heap_fault(rank, peer, offset, expected)
        elif kind == layout.ERR_BAD_PEER:
            message = describe_peer_fault(rank, peer, expected)
        elif kind == layout.ERR_UNREACHABLE:
            message = describe_unreachable_fault(rank, peer, offset)
        elif kind == layout.ERR_CAPACITY:
            message = describe_capacity_fault(rank, peer, expected, observed, per_expert=offset > 0)
        elif kind == layout.ERR_OFFSETS_DIFFER:
            message = describe_offsets_fault(rank, peer, expected, observed)
        else:
            timeout_ns = int(self.words[layout.WAIT_TIMEOUT_NS].item())
            message = describe_wait_fault(rank, peer, offset, expected, observed, timeout_ns,
                                          kind == layout.ERR_ABORTED, self.abort_reason)
        if count > 1:
            message += f" ({count - 1} more fault(s) were reported after it.)"
        return kind, message
