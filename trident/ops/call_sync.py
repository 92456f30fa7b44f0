"""Call-level synchronization shared by the fused GEMM + communication kernels.

Every fused op is one collective call made of one kernel (or two, stream-ordered). Ranks meet
through three small symmetric arrays of int64 and one epoch, kept on the device and never reset
(``trident.ops.common.SyncState``):

* :func:`enter_call`: every program reads the call's epoch (the last finished call's + 1);
  program 0 tells every peer "I am in call ``epoch``" (``ready[rank] = epoch`` at each peer):
  this rank's inputs for the call are written and its outputs of the last call are consumed.
* :func:`wait_peers_ready`: before a program first touches a peer (reads its input, writes its
  output), it acquires that from every peer.
* :func:`finish_call`: every program takes a ticket at its end; the last one tells every peer
  "I am done with you" (``arrived[rank] = epoch``), waits until every peer has said the same,
  and stores the new epoch. So when the kernel ends, every peer's writes into this rank have
  landed and no peer still reads this rank's inputs.

In the simulator a launch's programs run one after another: the program that waits in
:func:`finish_call` is the last one to finish, so nothing waits for a program not yet run.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..device import signal, wait


@triton.jit
def enter_call(state_ptr, ready_ptr, rank, world_size, heap_bases, WORLD_BLOCK: tl.constexpr):
    """This call's epoch (1, 2, ...); program 0 also releases ``ready[rank] = epoch`` at every peer."""
    epoch = tl.load(state_ptr) + 1
    if tl.program_id(0) == 0:
        peers = tl.arange(0, WORLD_BLOCK)
        signal(ready_ptr + rank + peers * 0, epoch, rank, peers, heap_bases, mask=peers < world_size)
    return epoch


@triton.jit
def wait_peers_ready(ready_ptr, epoch, rank, world_size, heap_bases):
    """Acquire: every peer has entered call ``epoch``. Called once per program, before its first
    store into a peer. One scalar wait per peer: each poll is a plain acquire load, so many programs
    polling the same flag do not queue up behind each other as read-modify-write atomics would."""
    for peer in range(world_size):
        wait(ready_ptr + peer, epoch, rank, rank, heap_bases, cmp="ge")


@triton.jit
def finish_call(state_ptr, arrived_ptr, epoch, rank, world_size, heap_bases, WORLD_BLOCK: tl.constexpr):
    """Called by every program at its end; the last one to get here completes the call (see module doc)."""
    tl.debug_barrier()  # every thread's stores before the ticket's release
    ticket = tl.atomic_add(state_ptr + 1, 1, sem="acq_rel", scope="sys")
    if ticket == tl.num_programs(0) - 1:
        tl.store(state_ptr + 1, 0)  # the next launch (stream-ordered after this one) counts afresh
        tl.store(state_ptr, epoch)
        peers = tl.arange(0, WORLD_BLOCK)
        is_peer = peers < world_size
        signal(arrived_ptr + rank + peers * 0, epoch, rank, peers, heap_bases, mask=is_peer)
        wait(arrived_ptr + peers, epoch, rank, rank, heap_bases, cmp="ge", mask=is_peer)
