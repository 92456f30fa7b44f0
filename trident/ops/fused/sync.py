"""Call-level synchronization shared by the fused GEMM + communication kernels.

Every fused op is one collective call made of one kernel (or two, stream-ordered). Ranks meet
through one symmetric block of int64 words per context, the *sync block*, kept on the device
and never reset between calls (:func:`sync_block`). Its layout (word indices)::

    EPOCH_WORD                        the epoch of the last call this rank finished (0, 1, 2, ...)
    TICKET_WORD                       programs of the running launch that reached finish_call
    ARRIVAL_WORD                      programs of the running launch that have started (enter_call)
    WORK_WORD + i, i < WORK_COUNTERS  work counters of the running launch: items claimed so far
                                      (:func:`claim_work`) or done (:func:`count_done`), 0 between
                                      launches; the last two, STAGE_COUNTER and STAGE_DONE_COUNTER,
                                      count the chunks of a staged operand claimed and copied
                                      (:func:`enter_call_staging`)
    READY_WORD + p                    READY[p]: the last call rank p has entered
    READY_WORD + world_size + p       ARRIVED[p]: the last call rank p is done with this rank in
    READY_WORD + 2 * world_size + p   OFFSET[p]: where rank p's symmetric operand of the running call
                                      lies in its heap (bytes from its base)
    READY_WORD + 3 * world_size + p   LOCAL[p]: this rank's heap base, world_size times (see below)
    READY_WORD + 4 * world_size + i   FLAGS[i]: tile (or row block) i of the running call is done
                                      when it holds the call's epoch

Kernels take the block as one ``sync_ptr``. :func:`enter_call` returns the call's
:class:`~trident.device.bundles.CallSync` (the block, the call's epoch, ``WORLD_BLOCK``); the helpers
below take it with the kernel's :class:`~trident.device.bundles.Team` and find the regions with
:func:`ready_words`, :func:`arrived_words` and :func:`flag_words`. The handshake:

* :func:`enter_call`: every program reads the call's epoch (the last finished call's + 1) and
  takes an *arrival ticket* (0, 1, 2, ... in the order the programs start). The program with
  arrival 0, the first that runs, tells every peer where this rank's symmetric operand lies
  (``OFFSET[rank]``) and then "I am in call ``epoch``" (``READY[rank] = epoch`` at each peer):
  this rank's inputs for the call are written and its outputs of the last call are consumed.
* :func:`enter_call_staging`: the same for a call whose symmetric operand is staged by the kernel
  itself from a plain tensor (all_gather_gemm's A_local when not on the heap): the programs copy it
  into its heap buffer in chunks they claim, and the program that copies the last chunk announces the
  call. A chunk is claimed only by a program that runs, and copying waits on nothing, so every chunk
  is copied however few programs run at a time.
* :func:`wait_peers_ready`: before a program first touches a peer (reads its input, writes its
  output), it acquires that from every peer, and returns the team it must reach peers with.

Symmetry check. Peers reach a rank's operand at their own offset of it (pointer translation), so a
call whose ranks pass the operand at different heap offsets (tensors allocated in a different
order; a heap tensor on one rank, a staged plain one on another) would read and write the wrong
memory. :func:`wait_peers_ready` compares every peer's ``OFFSET`` with this rank's. On a mismatch
it records the fault (``ERR_OFFSETS_DIFFER``: both offsets; the host raises
:class:`~trident.errors.DivergenceError` at the next ``ctx.check()``/``ctx.barrier()``) and
returns a team whose every heap base is this rank's own (``LOCAL``): every "peer" access of the
program then lands in this rank's own operand, never in a peer's memory. Every rank finds the
mismatch (it is symmetric), so no rank reaches a peer; waits for peers' signals give up at once
(:func:`trident.wait`), and the call ends on every rank with nothing written to a wrong place. Its
results are invalid; the next call, with symmetric operands, runs normally. The check costs a
store per peer at entry and a load per peer per program, next to the handshake's own.
* :func:`finish_call`: every program takes a ticket at its end; the last one resets that counter,
  the work counters and the staging counters (the last to arrive resets the arrival counter), tells
  every peer "I am done with you" (``ARRIVED[rank] = epoch``), waits until every peer has said the
  same, and stores the new epoch.
  So when the kernel ends, every peer's writes into this rank have landed and no peer still reads
  this rank's inputs.

A rank and itself. READY and ARRIVED go to the *other* ranks only. What they would tell a rank about
itself its stream already says: its inputs of the call were written by work stream-ordered before the
launch, and its outputs of the last call were consumed the same way; the finish ticket already
orders its own programs' stores. So a program never waits on its own rank's READY, the last one
never on its own ARRIVED, and at one rank the handshake is the two tickets alone. The exception
would be an operand that programs of the launch write and others read (a staged one): peers wait
for it through READY, and the rank's own programs read the source it was staged from instead
(all_gather_gemm's ``a_own``), never their own staging.

Forward progress. A GPU need not run all programs of a launch at once, nor start them in
program-id order: under MPS a process has a share of the SMs, and a kernel on another stream may
hold some of them. So a kernel whose programs wait on each other takes each program's role (and
its index inside the role) from its arrival ticket, never from ``tl.program_id``: the role that
waits on no other program of the launch takes the first tickets. A program then waits only on
programs that started before it (resident, or done), and the launch finishes however few of its
programs can run at a time (docs/reliability.md, "Forward progress when the GPU is shared").
The same holds for READY: it comes from the first program that runs, not from program 0, which
may be the last to start.

Epochs only grow, so flags never need a reset: a flag from an earlier call holds a smaller
epoch. When a call needs more flags than the block holds, the block is replaced by a bigger,
zeroed one on every rank at that call (the sizes are the same everywhere), after every earlier
kernel has finished: epochs restart from 0 everywhere at once. A CUDA graph keeps the block's
address: capture a fused op after an uncaptured call of the same sizes, so that it does not grow
during capture (a call that would grow it inside capture is refused with that advice), and
capture again after a call that grew it.

In the simulator a launch's programs run one after another in program-id order, so a program's
arrival is its program id, and the program that waits in :func:`finish_call` is the last one to
finish: nothing waits for a program not yet run.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...device import arrival_ticket, signal_peers, store, sync_ranks, wait
from ...device.bundles import CallSync, Team
from ...device.memory import control_block, record_fault
from ...device.words import ERR_OFFSETS_DIFFER, ERROR_COUNT
from ...runtime.resources import GrowingBuffer
from ...runtime.team import Team as TeamLike

# Word indices (int64) inside the sync block; the READY, ARRIVED and FLAGS regions follow READY_WORD.
EPOCH_WORD = 0
TICKET_WORD = 1
ARRIVAL_WORD = 2
WORK_WORD = 3
#: Work counters of a launch (:func:`claim_work`, :func:`count_done`): 0 and 1 for a kernel's own work,
#: STAGE_COUNTER and STAGE_DONE_COUNTER for :func:`enter_call_staging`'s chunks (claimed, copied).
WORK_COUNTERS = 4
STAGE_COUNTER = WORK_COUNTERS - 2
STAGE_DONE_COUNTER = WORK_COUNTERS - 1
READY_WORD = WORK_WORD + WORK_COUNTERS
#: Elements of a staged operand one program copies per claim (:func:`enter_call_staging`).
STAGE_CHUNK = 4096
#: Tile flags the block has room for at least (so that small calls never grow it).
MIN_FLAGS = 64

_EPOCH = tl.constexpr(EPOCH_WORD)
_TICKET = tl.constexpr(TICKET_WORD)
_ARRIVAL = tl.constexpr(ARRIVAL_WORD)
_WORK = tl.constexpr(WORK_WORD)
_WORK_COUNTERS = tl.constexpr(WORK_COUNTERS)
_STAGE_COUNTER = tl.constexpr(STAGE_COUNTER)
_STAGE_DONE_COUNTER = tl.constexpr(STAGE_DONE_COUNTER)
_STAGE_CHUNK = tl.constexpr(STAGE_CHUNK)
_READY = tl.constexpr(READY_WORD)


def sync_words(world_size: int, flags: int = 0) -> int:
    """Words of a sync block for ``world_size`` ranks with ``flags`` tile flags (at least :data:`MIN_FLAGS`):
    the three counters (epoch, finish ticket, arrival ticket), the work counters, the staging counters,
    READY, ARRIVED, OFFSET and LOCAL, then the flags.

    Example::

        sync = ctx.zeros(sync_words(ctx.world_size, tiles), dtype=torch.int64)   # a kernel's own block
    """
    return READY_WORD + 4 * world_size + max(flags, MIN_FLAGS)


def sync_block(ctx: TeamLike, flags: int = 0) -> torch.Tensor:
    """The context's sync block (int64, symmetric) with room for ``flags`` tile flags; collective.

    Made on first use and grown when a call needs more flags, zeroed, on every rank at the same
    call (:class:`~trident.runtime.resources.GrowingBuffer`). Shared by every fused op of the
    context, so that their epochs follow one count.

    Example::

        sync = sync_block(ctx, flags=tiles)
        kernel[grid](..., sync, trace_ptr, ctx.rank, ctx.world_size, ctx.heap_bases, ...)
    """
    block = ctx.resource("ops.sync", lambda: GrowingBuffer(ctx, zeroed=True, what="its sync block"))
    return block.view(sync_words(ctx.world_size, flags), torch.int64)


@triton.jit
def ready_words(call):
    """``READY[0 .. world_size - 1]``: ``READY[p]`` is the last call rank ``p`` has entered."""
    return call.sync_ptr + _READY


@triton.jit
def arrived_words(call, team):
    """``ARRIVED[0 .. world_size - 1]``: ``ARRIVED[p]`` is the last call rank ``p`` is done with this rank in."""
    return call.sync_ptr + _READY + team.world_size


@triton.jit
def flag_words(call, team):
    """The tile flags: ``FLAGS[i]`` holds the call's epoch once tile (or row block) ``i`` is done.

    Example::

        flags = flag_words(call, team)
        signal(flags + tile, call.epoch, team.rank, team.rank, team.heap_bases, scope="gpu")
    """
    return call.sync_ptr + _READY + 4 * team.world_size


@triton.jit
def _offset_words(call, team):
    """``OFFSET[0 .. world_size - 1]``: ``OFFSET[p]`` is where rank ``p``'s symmetric operand of the call lies."""
    return call.sync_ptr + _READY + 2 * team.world_size


@triton.jit
def _local_bases(call, team):
    """``LOCAL[0 .. world_size - 1]``: a heap-bases table whose every entry is this rank's base."""
    return call.sync_ptr + _READY + 3 * team.world_size


@triton.jit
def call_epoch(sync_ptr):
    """The epoch of the call in progress (the last finished call's + 1), without entering the call:
    for a kernel that only signals local flags while another kernel of the call does the handshake.

    Example::

        call = CallSync(sync_ptr, call_epoch(sync_ptr), 0, WORLD_BLOCK)   # the call, not entered
    """
    return tl.load(sync_ptr + _EPOCH) + 1


@triton.jit
def enter_call(sync_ptr, operand, team, WORLD_BLOCK: tl.constexpr):
    """``(call, arrival)``: the call's :class:`~trident.device.bundles.CallSync` (its epoch: 1, 2, ...,
    and where ``operand`` lies in this rank's heap) and this program's arrival ticket (0, 1, ... in
    the order the launch's programs start). The first program to start (arrival 0) also tells every
    peer that offset (``OFFSET[rank]``), then releases ``READY[rank] = epoch`` there.

    ``operand`` is the call's symmetric operand: the heap tensor peers reach at this rank's offset
    of it (gemm_all_scatter's C, all_gather_gemm's A_local, the slots or receive buffers of the ops
    that push into peers, the expert outputs a pulling MoE combine reads). A kernel whose programs
    wait on each other takes their roles from ``arrival`` (the role that waits on none of them
    first), never from ``tl.program_id``: see the module doc.

    Example::

        team = Team(rank, world_size, heap_bases)
        call, arrival = enter_call(sync_ptr, c, team, WORLD_BLOCK)
        if arrival < producers:   # the producers start first: whoever waits on them started later
            ...
    """
    call, arrival = _open_call(sync_ptr, operand, team, WORLD_BLOCK)
    if arrival == 0:
        _announce(call, team)
    return call, arrival


@triton.jit
def enter_call_staging(sync_ptr, operand, source, numel, team, WORLD_BLOCK: tl.constexpr):
    """:func:`enter_call` for a call whose symmetric operand (``numel`` elements, contiguous, on the heap)
    is a copy of ``source`` (a plain tensor of the same layout) that this kernel makes. Every program
    claims chunks of :data:`STAGE_CHUNK` elements and copies them until none is left; the program that
    copies the last chunk announces the call (``OFFSET``, then ``READY``), so peers read the operand
    only once it is whole. The previous call's readers of the operand passed its :func:`finish_call`.

    Example::

        call, arrival = enter_call_staging(sync_ptr, stage, a_plain, m * K, team, WORLD_BLOCK)
    """
    call, arrival = _open_call(sync_ptr, operand, team, WORLD_BLOCK)
    chunks = tl.cdiv(numel, _STAGE_CHUNK)
    if chunks == 0:
        if arrival == 0:
            _announce(call, team)
    lanes = tl.arange(0, _STAGE_CHUNK)
    chunk = claim_work(call, _STAGE_COUNTER)
    while chunk < chunks:
        offs = chunk.to(tl.int64) * _STAGE_CHUNK + lanes
        tl.store(operand + offs, tl.load(source + offs, mask=offs < numel), mask=offs < numel)
        # The program that copies the last chunk acquires every other chunk's stores (count_done), and
        # its READY release (cumulative) hands them to the peers.
        if count_done(call, _STAGE_DONE_COUNTER) == chunks - 1:
            _announce(call, team)
        chunk = claim_work(call, _STAGE_COUNTER)
    return call, arrival


@triton.jit
def _open_call(sync_ptr, operand, team, WORLD_BLOCK: tl.constexpr):
    """``(call, arrival)``: the call's :class:`~trident.device.bundles.CallSync` (its epoch, ``operand``'s
    heap offset) and this program's arrival ticket, before any announcement."""
    offset = operand.to(tl.int64) - tl.load(team.heap_bases + team.rank)  # bytes, whatever its dtype
    call = CallSync(sync_ptr, call_epoch(sync_ptr), offset, WORLD_BLOCK)
    arrival = arrival_ticket(sync_ptr + _ARRIVAL)  # int32: it takes a program id's place (TMA coordinates)
    return call, arrival


@triton.jit
def _announce(call, team):
    """Tell every peer where this rank's operand lies (``OFFSET[rank]``), then release
    ``READY[rank] = epoch`` there: this rank's inputs of the call are written."""
    peers = tl.arange(0, call.WORLD_BLOCK)
    is_peer = (peers < team.world_size) & (peers != team.rank)  # this rank's own accesses follow its stream
    store(_offset_words(call, team) + team.rank + peers * 0, call.offset + peers * 0, team.rank, peers,
          team.heap_bases, mask=is_peer)
    # The release's CTA barrier and fence order the offsets' stores before READY.
    signal_peers(ready_words(call) + team.rank, call.epoch, team.rank, team.world_size, team.heap_bases,
                 call.WORLD_BLOCK)


@triton.jit
def wait_peers_ready(call, team):
    """Acquire: every other rank has entered the call (not this one: its stream orders its own
    accesses, module doc). Called once per program, before its first access to a peer; returns the
    :class:`~trident.device.bundles.Team` to reach peers with. One scalar wait per peer: each poll is
    a plain acquire load, so many programs polling the same flag do not queue up behind each other
    as read-modify-write atomics would.

    The returned team is ``team`` when every peer's operand lies at this rank's offset; otherwise
    the fault is recorded and the team maps every peer to this rank itself (module doc, "Symmetry
    check"), so nothing reaches a peer.

    Example::

        team = wait_peers_ready(call, team)
        trident.store(c + offs, tile, team.rank, peer, team.heap_bases, mask=mask)
    """
    ready = ready_words(call)
    offsets = _offset_words(call, team)
    bases = team.heap_bases
    for peer in range(team.world_size):
        if peer != team.rank:  # no READY from itself: see the module doc, "A rank and itself"
            wait(ready + peer, call.epoch, team.rank, team.rank, team.heap_bases, cmp="ge")
            theirs = tl.load(offsets + peer)
        else:
            theirs = call.offset
        if theirs != call.offset:
            ctrl = control_block(team.rank, team.heap_bases)
            if tl.load(ctrl + ERROR_COUNT, volatile=True) == 0:  # the first program to see it reports
                record_fault(ctrl, ERR_OFFSETS_DIFFER, team.rank, peer, call.epoch, call.offset, theirs)
            local = _local_bases(call, team)
            lanes = tl.arange(0, call.WORLD_BLOCK)
            tl.store(local + lanes, tl.load(team.heap_bases + team.rank) + lanes * 0,
                     mask=lanes < team.world_size)
            tl.debug_barrier()  # every thread's translation reads the table
            bases = local
    return Team(team.rank, team.world_size, bases)


@triton.jit
def claim_work(call, counter):
    """The next item of work counter ``counter`` (0 or 1 for a kernel's own work; :data:`STAGE_COUNTER` is
    :func:`enter_call_staging`'s) of this launch: 0, 1,
    2, ... in the order programs claim them, each item once. A program that claims until the items run
    out shares the work with whichever programs run (a dynamic schedule); the counters are 0 at every
    launch's start (:func:`finish_call` resets them).

    Example::

        tile = claim_work(call, 0)
        while tile < tiles:
            ...
            tile = claim_work(call, 0)
    """
    return tl.atomic_add(call.sync_ptr + _WORK + counter, 1, sem="relaxed", scope="gpu")


@triton.jit
def count_done(call, counter):
    """Count one item of work counter ``counter`` done; returns how many were counted before it. The
    count is acq_rel (after a CTA barrier: every thread's writes first), so the program that gets
    ``items - 1`` sees every other program's writes made before its count: it may act on the whole.

    Example::

        if count_done(call, 1) == chunks - 1:   # the last chunk: every other chunk's results are visible
            ...
    """
    tl.debug_barrier()
    return tl.atomic_add(call.sync_ptr + _WORK + counter, 1, sem="acq_rel", scope="gpu")


@triton.jit
def finish_call(call, team):
    """Called by every program at its end, after its :func:`enter_call`; the last one to get here
    completes the call and resets the finish counter for the next launch (see module doc). Returns
    whether this program was that last one: when it returns True every peer's writes (stores and
    atomics) into this rank have landed, so it may read what they wrote.

    Example::

        if finish_call(call, team):   # the last program: every peer is done with this rank
            total = tl.load(counter_ptr)
    """
    tl.debug_barrier()  # every thread's stores before the ticket's release
    # The ticket is this launch's own word, so gpu scope: the last program acquires every program's
    # stores (into peers too) and its ARRIVED release at sys scope hands them on (release is cumulative).
    last = tl.atomic_add(call.sync_ptr + _TICKET, 1, sem="acq_rel", scope="gpu") == tl.num_programs(0) - 1
    if last:
        tl.store(call.sync_ptr + _TICKET, 0)  # the next launch (stream-ordered after this one) counts afresh
        for i in tl.static_range(_WORK_COUNTERS):  # no program of this launch claims any more
            tl.store(call.sync_ptr + _WORK + i, 0)
        tl.store(call.sync_ptr + _EPOCH, call.epoch)
        # ARRIVED with every peer (the ticket already ordered this rank's own stores)
        sync_ranks(arrived_words(call, team), call.epoch, team.rank, team.world_size, team.heap_bases,
                   call.WORLD_BLOCK)
    return last
