"""Signals and bounded waits: the message-passing pattern on top of the atomics.

The safe pattern for handing data to a peer::

    producer:  trident.store(data...)                      # or put
               trident.signal(flag_ptr, 1, rank, peer, heap_bases)      # release, sys scope
    consumer:  trident.wait(flag_ptr, 1, rank, rank, heap_bases)        # acquire, sys scope
               x = tl.load(data...)

A wait never hangs silently: it gives up after the context's wait timeout (``ctx.wait_timeout``,
``TRIDENT_WAIT_TIMEOUT`` seconds) or when the host aborts (``ctx.abort()``), records the fault
in the control block, and returns. The host raises it, naming the rank, the flag and the value
waited for, at the next ``ctx.barrier()`` or ``ctx.check()``; the simulator raises at once.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .atomics import atomic_add, atomic_xchg
from .leaves import SPIN_POLLS, backoff, now_ns, on_wait_timeout
from .memory import control_block, record_fault, translate
from .words import (
    ABORT_ADDR,
    ERR_ABORTED,
    ERR_OFFSETS_DIFFER,
    ERR_WAIT_TIMEOUT,
    ERROR_COUNT,
    ERROR_KIND,
    WAIT_TIMEOUT_NS,
)

# Volatile polls between two full checks (ordered read, clock): fewer in the simulator.
_SPIN_POLLS = SPIN_POLLS
# The host's abort word is read only once a wait has lasted this long: on GPUs it lives in pinned
# host memory, and a program reading host memory while it spins slows kernels on the other SMs by
# orders of magnitude (docs/results/journal.md, 2026-12-03). Short waits never touch it.
_ABORT_AFTER_NS = tl.constexpr(5_000_000)


@triton.jit
def signal(flag_ptr, value, rank, peer, heap_bases, op: tl.constexpr = tl.constexpr("set"), mask=None,
           sem: tl.constexpr = tl.constexpr("release"), scope: tl.constexpr = tl.constexpr("sys")):
    """Set (``op="set"``) or add to (``op="add"``) ``peer``'s copy of a flag; returns the old value.

    With the default ``sem="release"`` every store the program made before the signal (all its
    threads: ``signal`` starts with a CTA barrier) is visible to a peer that acquires the flag
    (``wait``) and sees the new value.

    Example::

        trident.signal(ready_ptr + tile, 1, rank, peer, heap_bases)
    """
    tl.static_assert(op == "set" or op == "add", "signal: op must be 'set' or 'add'")
    # A scalar atomic is issued by one thread: a CTA barrier first puts every thread's earlier
    # stores before it, so the release publishes the whole program's data, not one thread's.
    tl.debug_barrier()
    if op == "set":
        old = atomic_xchg(flag_ptr, value, rank, peer, heap_bases, mask=mask, sem=sem, scope=scope)
    else:
        old = atomic_add(flag_ptr, value, rank, peer, heap_bases, mask=mask, sem=sem, scope=scope)
    return old


@triton.jit
def _meets(seen, value, cmp: tl.constexpr):
    tl.static_assert(cmp == "eq" or cmp == "ne" or cmp == "ge" or cmp == "gt" or cmp == "le" or cmp == "lt",
                     "wait: cmp must be one of eq, ne, ge, gt, le, lt")
    if cmp == "eq":
        ok = seen == value
    elif cmp == "ne":
        ok = seen != value
    elif cmp == "ge":
        ok = seen >= value
    elif cmp == "gt":
        ok = seen > value
    elif cmp == "le":
        ok = seen <= value
    else:
        ok = seen < value
    return ok


@triton.jit
def _all(ok, mask):
    """True when every lane is ``ok`` (lanes outside ``mask`` count as done). Works for scalars too."""
    if mask is not None:
        ok = ok | (mask == 0)
    IS_BLOCK: tl.constexpr = len(ok.shape) > 0
    if IS_BLOCK:
        ok = tl.min(ok.to(tl.int32), axis=None) > 0
    return ok


@triton.jit
def _summary(seen, value, cmp: tl.constexpr, mask):
    """Scalars for the fault record: the smallest offset waited on and the smallest unmet value seen."""
    IS_BLOCK: tl.constexpr = len(seen.shape) > 0
    if IS_BLOCK:
        pending = _meets(seen, value, cmp) == 0
        if mask is not None:
            pending = pending & mask
        seen = tl.min(tl.where(pending, seen, 2**31 - 1), axis=None)
    return seen


@triton.jit
def _poll(ptr, mask, sem: tl.constexpr, scope: tl.constexpr):
    """An ordered read of the flag(s): an atomic add of 0, which Triton turns into an ``ld.acquire``
    (with ``sem="acquire"``). Its value feeds the loop, so it is never dropped."""
    return tl.atomic_add(ptr, 0, mask=mask, sem=sem, scope=scope)


@triton.jit
def _spin(ptr, value, cmp: tl.constexpr, mask):
    """Up to ``_SPIN_POLLS`` plain volatile reads, until the flag(s) look met (the caller re-reads them ordered).

    The cheap part of a wait: one load per poll, no barrier, no clock, no ordered access.
    """
    polls = 0
    seen = tl.load(ptr, mask=mask, volatile=True)
    while (_all(_meets(seen, value, cmp), mask) == 0) & (polls < _SPIN_POLLS):
        backoff()
        seen = tl.load(ptr, mask=mask, volatile=True)
        polls += 1


@triton.jit
def _lowest(x):
    IS_BLOCK: tl.constexpr = len(x.shape) > 0
    if IS_BLOCK:
        x = tl.min(x, axis=None)
    return x


@triton.jit
def wait(flag_ptr, value, rank, peer, heap_bases, cmp: tl.constexpr = tl.constexpr("eq"), mask=None,
         sem: tl.constexpr = tl.constexpr("acquire"), scope: tl.constexpr = tl.constexpr("sys")):
    """Spin until ``peer``'s copy of the flag(s) compares ``cmp`` to ``value``; returns what was seen.

    Usually ``peer == rank``: a rank waits on its own flag, which peers ``signal``. For a block of
    flags it waits until every lane (under ``mask``) is satisfied. Flags are integers. Every poll
    is a ``sem``-ordered read (acquire by default), and a CTA barrier at the end extends that
    order to the whole program: after ``wait`` returns, every thread sees what the signaller
    stored before its release.

    Gives up after ``ctx.wait_timeout`` seconds or when the host calls ``ctx.abort()``: the
    fault is recorded for the host to raise (the simulator raises at once) and the wait returns.

    Example::

        trident.wait(ready_ptr + tile, 1, rank, rank, heap_bases)          # one flag
        trident.wait(ready_ptr + offs, epoch, rank, rank, heap_bases, cmp="ge", mask=offs < world)
    """
    tl.static_assert(flag_ptr.dtype.element_ty.is_int(), "trident.wait: flags must be integers")
    remote = translate(flag_ptr, rank, peer, heap_bases)
    # The common case costs what a bare spin does: plain volatile polls until the flag looks met,
    # then one ordered read, which decides. The clock, the timeout and the abort word are only
    # read once that first round of polls has not been enough.
    _spin(remote, value, cmp, mask)
    seen = _poll(remote, mask, sem, scope)
    done = _all(_meets(seen, value, cmp), mask)
    if done == 0:
        ctrl = control_block(rank, heap_bases)
        timeout_ns = tl.load(ctrl + WAIT_TIMEOUT_NS)
        abort_word = tl.load(ctrl + ABORT_ADDR).to(tl.pointer_type(tl.int64))
        start = now_ns()
        # A wait of this rank already gave up and the host has not raised it yet: ranks are out of
        # step, and waiting the whole timeout again only delays the error (a collective's second
        # wait made it fail after 2x wait_timeout on the GPU). Give up at once, as the first did;
        # also when a fused call found its operands asymmetric: then no peer signals this call.
        out_of_step = _out_of_step(ctrl)
        gave_up = (done == 0) & (out_of_step != 0)
        aborted = done != 0
        while (done == 0) & (gave_up == 0):
            _spin(remote, value, cmp, mask)
            # What the spin saw is only a hint: the ordered read decides (and gives the acquire).
            seen = _poll(remote, mask, sem, scope)
            done = _all(_meets(seen, value, cmp), mask)
            waited = now_ns() - start
            aborted = tl.load(abort_word, mask=waited > _ABORT_AFTER_NS, other=0, volatile=True) != 0
            out_of_step = _out_of_step(ctrl)
            gave_up = (done == 0) & (aborted | (waited > timeout_ns) | (out_of_step != 0))
        # An asymmetric call is already recorded (and is the error the host raises): no second report.
        if gave_up & (out_of_step != ERR_OFFSETS_DIFFER):
            offset = _lowest(flag_ptr.to(tl.int64) - tl.load(heap_bases + rank))
            last = _summary(seen, value, cmp, mask)
            on_wait_timeout(rank, peer, offset, value, last, timeout_ns, aborted, abort_word)
            record_fault(ctrl, tl.where(aborted, ERR_ABORTED, ERR_WAIT_TIMEOUT), rank, peer, offset,
                         value, last)
    # The acquire was made by the thread(s) that read the flag; a CTA barrier extends it to every
    # thread of the program, so all of them see the signaller's data.
    tl.debug_barrier()
    return seen


@triton.jit
def _out_of_step(ctrl):
    """The kind of the fault this rank has recorded and the host not yet raised, if it means no peer
    will signal (a wait that gave up, an abort, an asymmetric fused call); else 0."""
    kind = tl.load(ctrl + ERROR_KIND, volatile=True)
    pending = tl.load(ctrl + ERROR_COUNT, volatile=True) != 0
    stops = (kind == ERR_WAIT_TIMEOUT) | (kind == ERR_ABORTED) | (kind == ERR_OFFSETS_DIFFER)
    return tl.where(pending & stops, kind, 0)


@triton.jit
def arrival_ticket(counter_ptr):
    """This program's arrival ticket: 0, 1, 2, ... in the order the launch's programs start.

    ``counter_ptr`` is a local int64 word, zero before the launch; the last program to arrive
    sets it back to zero, so the next launch (stream-ordered after this one) counts afresh. Take
    roles and work from the ticket rather than ``tl.program_id`` when programs of one launch wait
    on each other: a program then only waits on programs that started before it. An int32, as
    ``tl.program_id`` is.

    Example::

        me = trident.arrival_ticket(counter_ptr)
        if me < producers:
            ...   # producers never wait on this launch's other programs
    """
    # Relaxed: the ticket only has to be unique and in start order; this GPU alone counts it.
    ticket = tl.atomic_add(counter_ptr, 1, sem="relaxed", scope="gpu")
    if ticket == tl.num_programs(0) - 1:
        tl.atomic_xchg(counter_ptr, 0, sem="relaxed", scope="gpu")
    return ticket.to(tl.int32)


@triton.jit
def signal_peers(flag_ptr, value, rank, world_size, heap_bases, WORLD_BLOCK: tl.constexpr):
    """Release ``*flag_ptr = value`` at every other rank (the same symmetric word in each peer's heap),
    all at once: one vector :func:`signal` with a lane per peer, so the release waits once for this
    program's earlier stores, not once per peer. Not at this rank: its own stream orders its own work.
    ``WORLD_BLOCK`` is ``world_size`` rounded up to a power of two (sys scope, ``op="set"``).

    Send every peer its data first, then one ``signal_peers``: a :func:`signal` after each peer's
    copy would wait for each copy to land before sending the next.

    Example::

        for i in range(1, world_size):
            trident.store(tile_ptr + offs, tile, rank, (rank + i) % world_size, heap_bases)
        trident.signal_peers(flag_ptr + rank, epoch, rank, world_size, heap_bases, WORLD_BLOCK)
    """
    peers = tl.arange(0, WORLD_BLOCK)
    signal(flag_ptr + peers * 0, value, rank, peers, heap_bases, mask=(peers < world_size) & (peers != rank))


@triton.jit
def sync_ranks(slots_ptr, epoch, rank, world_size, heap_bases, WORLD_BLOCK: tl.constexpr):
    """Wait until every rank's program has reached ``epoch`` at this point (a barrier for one program).

    ``slots_ptr`` points to ``world_size`` int64 slots, the same symmetric slots on every rank:
    this program writes ``epoch`` into slot ``rank`` of every other rank (release), then waits until
    every other rank's slot here is ``>= epoch`` (acquire). Its own slot is neither written nor
    awaited: the program itself is there by definition (and alone, a rank does no sys-scoped fence).
    Epochs only grow, so slots are never reset and a captured CUDA graph replays correctly when the
    epoch lives on the device. ``WORLD_BLOCK`` is ``world_size`` rounded up to a power of two.

    Example::

        epoch = tl.load(count_ptr + pid) + 1
        trident.sync_ranks(slots_ptr + pid * world_size, epoch, rank, world_size, heap_bases, WORLD_BLOCK)
        tl.store(count_ptr + pid, epoch)
    """
    signal_peers(slots_ptr + rank, epoch, rank, world_size, heap_bases, WORLD_BLOCK)
    peers = tl.arange(0, WORLD_BLOCK)
    wait(slots_ptr + peers, epoch, rank, rank, heap_bases, cmp="ge", mask=(peers < world_size) & (peers != rank))
