"""What a device fault says, and why the host aborted: shared by the host runtime and the device leaves.

A wait that gives up and an access outside the heap (debug mode) are reported the same way on
both backends: on a GPU the kernel records the fault in the control block and the host raises it
(``ctx.check()``, ``ctx.barrier()``); in the simulator the wait raises at once. Both build their
message here, so the two read alike.

Why the host raised a rank's abort word is kept per abort word (per context), keyed by the
word's address, so two contexts in one process never report each other's reasons.
"""

from __future__ import annotations

from . import layout
from .errors import CapacityError, DeviceError, RankTimeoutError

_abort_reasons: dict[int, str] = {}


def set_abort_reason(abort_addr: int, reason: str) -> None:
    """Remember (or, with an empty ``reason``, forget) why the abort word at ``abort_addr`` is raised."""
    if reason:
        _abort_reasons[abort_addr] = reason
    else:
        _abort_reasons.pop(abort_addr, None)


def abort_reason(abort_addr: int) -> str:
    """Why the abort word at ``abort_addr`` was raised ("" when unknown or lowered)."""
    return _abort_reasons.get(abort_addr, "")


def fault_error(kind: int) -> type[DeviceError] | type[RankTimeoutError]:
    """The exception a fault recorded in the control block with ``kind`` is raised as.

    A device wait that gave up, by its own timeout or aborted by the host because a rank is gone,
    is a :class:`RankTimeoutError`, as the host's waits are; which of the two it was is in the message.
    """
    waits: dict[int, type[DeviceError] | type[RankTimeoutError]] = {
        layout.ERR_WAIT_TIMEOUT: RankTimeoutError, layout.ERR_ABORTED: RankTimeoutError}
    return {**waits, layout.ERR_CAPACITY: CapacityError}.get(kind, DeviceError)


def describe_wait_fault(rank, peer, offset, expected, observed, timeout_ns, aborted, reason="") -> str:
    """The message of a wait that gave up (timed out, or aborted by the host for ``reason``)."""
    why = f"was aborted by the host ({reason})" if aborted and reason else (
        "was aborted by the host" if aborted else f"timed out after {timeout_ns / 1e9:.3g} s")
    return (
        f"rank {rank}: trident.wait {why} waiting on the flag at heap offset {offset:#x} of rank {peer} "
        f"(waited for {expected}, last saw {observed})."
    )


def describe_heap_fault(rank, peer, offset, heap_size) -> str:
    """The message of an access outside the symmetric heap (debug mode)."""
    return (
        f"rank {rank}: access outside the symmetric heap: peer {peer}, heap offset {offset:#x} "
        f"(offset {offset}), heap size {heap_size} bytes. The pointer was not into a tensor made by "
        f"ctx.zeros/empty/... (a tensor computed from one, like `t + 1`, lives off the heap), or an "
        f"index ran past the end of one."
    )


def describe_peer_fault(rank, peer, world_size) -> str:
    """The message of an access to a rank that does not exist (debug mode)."""
    return (
        f"rank {rank}: access to peer {peer}, which is not a rank of this job (world size {world_size}, "
        f"ranks 0..{world_size - 1}). A peer computed as `rank + 1` needs `% world_size`."
    )


def describe_unreachable_fault(rank, peer, offset) -> str:
    """The message of an access to a peer in another node, whose heap this rank does not map (debug mode)."""
    return (
        f"rank {rank}: access to peer {peer} at heap offset {offset:#x} (offset {offset}): rank {peer} is in "
        f"another node, and its heap is not mapped here (heap_bases[{peer}] == 0). Kernels reach only the "
        f"ranks of their own node (ctx.topology.local_ranks); across nodes use trident.ccl's collectives, "
        f"which run the inter-node part with torch.distributed."
    )


def describe_capacity_fault(rank, worst_rank, capacity, needed) -> str:
    """The message of an MoE dispatch whose receive buffer was too small (rows past it were not delivered)."""
    return (
        f"rank {rank}: moe_dispatch: capacity={capacity} rows is too small: rank {worst_rank} had to receive "
        f"{needed} rows. The rows past the capacity were not delivered, so this call's results (and a "
        f"moe_combine on them) are incomplete. Pass capacity >= {needed}, or capacity=None (the worst "
        f"case, world_size * max_tokens_per_rank * k)."
    )
