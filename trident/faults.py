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
from .errors import CapacityError, DeviceError, DivergenceError, RankTimeoutError

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


def fault_error(kind: int) -> type[DeviceError] | type[RankTimeoutError] | type[DivergenceError]:
    """The exception a fault recorded in the control block with ``kind`` is raised as.

    A device wait that gave up, by its own timeout or aborted by the host because a rank is gone,
    is a :class:`RankTimeoutError`, as the host's waits are; which of the two it was is in the message.
    """
    errors: dict[int, type[DeviceError] | type[RankTimeoutError] | type[DivergenceError]] = {
        layout.ERR_WAIT_TIMEOUT: RankTimeoutError, layout.ERR_ABORTED: RankTimeoutError,
        layout.ERR_CAPACITY: CapacityError, layout.ERR_OFFSETS_DIFFER: DivergenceError}
    return errors.get(kind, DeviceError)


def describe_wait_fault(rank, peer, offset, expected, observed, timeout_ns, aborted, reason="") -> str:
    """The message of a wait that gave up (timed out, or aborted by the host for ``reason``)."""
    why = f"was aborted by the host ({reason})" if aborted and reason else (
        "was aborted by the host" if aborted else f"timed out after {timeout_ns / 1e9:.3g} s")
    return (
        f"rank {rank}: trident.wait {why} waiting on the flag at heap offset {offset:#x} of rank {peer} "
        f"(waited for {expected}, last saw {observed})."
    )


# The messages of the faults a kernel records, as str.format templates (filled by the functions below).
_HEAP_FAULT = (
    "rank {rank}: access outside the symmetric heap: peer {peer}, heap offset {offset:#x} (offset {offset}), "
    "heap size {heap_size} bytes. The pointer was not into a tensor made by ctx.zeros/empty/... (a tensor "
    "computed from one, like `t + 1`, lives off the heap), or an index ran past the end of one.")
_PEER_FAULT = (
    "rank {rank}: access to peer {peer}, which is not a rank of this job (world size {world_size}, ranks "
    "0..{last}). A peer computed as `rank + 1` needs `% world_size`.")
_UNREACHABLE_FAULT = (
    "rank {rank}: access to peer {peer} at heap offset {offset:#x} (offset {offset}): rank {peer} is in another "
    "node, and its heap is not mapped here (heap_bases[{peer}] == 0). Kernels reach only the ranks of their own "
    "node (ctx.topology.local_ranks); across nodes use trident.ccl's collectives, which run the inter-node part "
    "with torch.distributed.")
_CAPACITY_FAULT = (
    "rank {rank}: moe_dispatch: capacity={capacity} rows is too small: rank {worst_rank} had to receive {needed} "
    "rows. The rows past the capacity were not delivered, so this call's results (and a moe_combine on them) "
    "are incomplete. Pass capacity >= {needed}, or capacity=None (the worst case, world_size * "
    "max_tokens_per_rank * k).")
_EXPERT_CAPACITY_FAULT = (
    "rank {rank}: moe_dispatch: layout='masked' with capacity={capacity} rows per local expert is too small: an "
    "expert of rank {worst_rank} had to receive at least {needed} rows. The rows past its region were not "
    "delivered, so this call's results (and a moe_combine on them) are incomplete. Pass a larger capacity (at "
    "least {needed}; rank {worst_rank} reports the most its experts needed); the default, world_size * "
    "max_tokens_per_rank, holds when no token names one expert in several of its k slots.")
_OFFSETS_FAULT = (
    "rank {rank}: a fused op's symmetric operand (gemm_all_scatter's C, all_gather_gemm's A_local, moe_combine's "
    "expert_out, or the slots and buffers the ops push into) lies at heap offset {mine:#x} on rank {rank} but at "
    "{theirs:#x} on rank {peer}. Peers reach it at their own offset, so the call reached no peer (nothing was "
    "read or written at a wrong place) and its results are invalid. Ranks must pass the same heap tensor: make "
    "heap tensors in the same order and sizes on every rank (ctx.barrier() names where their allocations "
    "diverged), and pass a heap operand on every rank or on none.")


def describe_heap_fault(rank, peer, offset, heap_size) -> str:
    """The message of an access outside the symmetric heap (debug mode)."""
    return _HEAP_FAULT.format(rank=rank, peer=peer, offset=offset, heap_size=heap_size)


def describe_peer_fault(rank, peer, world_size) -> str:
    """The message of an access to a rank that does not exist (debug mode)."""
    return _PEER_FAULT.format(rank=rank, peer=peer, world_size=world_size, last=world_size - 1)


def describe_unreachable_fault(rank, peer, offset) -> str:
    """The message of an access to a peer in another node, whose heap this rank does not map (debug mode)."""
    return _UNREACHABLE_FAULT.format(rank=rank, peer=peer, offset=offset)


def describe_capacity_fault(rank, worst_rank, capacity, needed, per_expert=False) -> str:
    """The message of an MoE dispatch whose receive buffer was too small (rows past it were not delivered);
    ``per_expert``: the masked layout's region of ``capacity`` rows per local expert."""
    template = _EXPERT_CAPACITY_FAULT if per_expert else _CAPACITY_FAULT
    return template.format(rank=rank, worst_rank=worst_rank, capacity=capacity, needed=needed)


def describe_offsets_fault(rank, peer, mine, theirs) -> str:
    """The message of a fused call whose symmetric operand lay at different heap offsets on two ranks."""
    return _OFFSETS_FAULT.format(rank=rank, peer=peer, mine=mine, theirs=theirs)
