"""Device side of tracing: a timer and one call that records an event into a trace buffer.

A trace buffer is an int64 tensor on the heap (made by :class:`trident.trace.Trace`)::

    word 0        how many events kernels tried to record (a slot counter, bumped atomically)
    word 1        capacity: how many records fit
    words 2..7    start times of the open host spans, outermost first (:meth:`trident.trace.Trace.span`)
    word 8 + 8*i  record i: kind, program, tile, peer, t_start, t_end, rank, 1 (written)

``record`` reserves a slot with one atomic add and writes the record only when the slot is
below the capacity, so a full buffer drops events (the host counts them) and never writes past
its end. Events go into the caller's own buffer: tracing adds no cross-rank traffic.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..device.leaves import now_ns

#: Event kinds (``kind`` argument of :func:`record`); usable in kernels as ``trident.trace.COMPUTE``.
COMPUTE = tl.constexpr(0)
COMM = tl.constexpr(1)
WAIT = tl.constexpr(2)
KIND_NAMES = {0: "compute", 1: "comm", 2: "wait"}

HEADER_WORDS = 8
RECORD_WORDS = 8
COUNT_WORD = 0
CAPACITY_WORD = 1
#: Host spans (:meth:`trident.trace.Trace.span`) keep their start times in the header's last words,
#: one per level of nesting; the header stays 8 words so that records stay 64-byte aligned.
SPAN_STACK_WORD = 2
MAX_SPAN_DEPTH = HEADER_WORDS - SPAN_STACK_WORD
FIELDS = ("kind", "program", "tile", "peer", "t_start", "t_end", "rank", "written")

_HEADER = tl.constexpr(HEADER_WORDS)
_RECORD = tl.constexpr(RECORD_WORDS)
_COUNT = tl.constexpr(COUNT_WORD)
_CAPACITY = tl.constexpr(CAPACITY_WORD)
_SPAN_STACK = tl.constexpr(SPAN_STACK_WORD)


@triton.jit
def now():
    """Nanoseconds from the device timer: ``%globaltimer`` on a GPU, the host's monotonic clock
    in the simulator. Only differences of two readings (on one machine) are meaningful.

    Example::

        t0 = trident.trace.now()
        acc = tl.dot(a, b, acc)
        trident.trace.record(trace_ptr, trident.trace.COMPUTE, tile, rank, t0, rank, TRACE)
    """
    return now_ns()


@triton.jit
def now_if(TRACE: tl.constexpr):
    """:func:`now` when ``TRACE`` (a constexpr), else 0 without reading the timer: the start
    time of an event that a kernel records only when tracing.

    Example::

        t0 = trident.trace.now_if(TRACE)
        ...  # compute a tile
        trident.trace.record(trace_ptr, trident.trace.COMPUTE, tile, rank, t0, rank, TRACE)
    """
    t = 0
    if TRACE:
        t = now_ns()
    return t


@triton.jit
def _program_id():
    """This program's linear id over a grid of up to three axes."""
    return (tl.program_id(0) + tl.program_id(1) * tl.num_programs(0)
            + tl.program_id(2) * tl.num_programs(0) * tl.num_programs(1))


@triton.jit
def record(trace_ptr, kind, tile, peer, t_start, rank, ENABLED: tl.constexpr):
    """Record one event that started at ``t_start`` (from :func:`now`) and ends now.

    Args:
        trace_ptr: the trace buffer (``trace.ptr``, or the :class:`Trace`'s tensor), on this rank.
        kind: ``trident.trace.COMPUTE``, ``COMM`` or ``WAIT``.
        tile: which tile (any integer the kernel chooses).
        peer: the rank the event talks to (``rank`` for compute).
        t_start: the start time, read with ``trident.trace.now()``.
        rank: the caller's rank.
        ENABLED: constexpr; when false the call compiles to nothing (pass a trace flag of your kernel).

    Returns:
        Nothing. When the buffer is full the event is dropped and counted.

    Example::

        t0 = trident.trace.now()
        trident.put(c_ptr + offs, c_ptr + offs, rank, peer, heap_bases, mask=mask)
        trident.trace.record(trace_ptr, trident.trace.COMM, tile, peer, t0, rank, TRACE)
    """
    if ENABLED:
        t_end = now()
        base = trace_ptr.to(tl.pointer_type(tl.int64))
        slot = tl.atomic_add(base + _COUNT, 1, sem="relaxed", scope="gpu").to(tl.int64)
        capacity = tl.load(base + _CAPACITY)
        if slot < capacity:
            # One vector store of the whole record, built without branches: field i is selected
            # by (f == i), which also works for Python ints (the simulator's clock readings).
            f = tl.arange(0, _RECORD).to(tl.int64)
            values = ((f == 0) * kind + (f == 1) * _program_id().to(tl.int64) + (f == 2) * tile
                      + (f == 3) * peer + (f == 4) * t_start + (f == 5) * t_end + (f == 6) * rank + (f == 7))
            tl.store(base + _HEADER + slot * _RECORD + f, values.to(tl.int64))


@triton.jit
def span_start_kernel(trace_ptr, depth):
    """One program: store the timer into the span word of nesting level ``depth`` (a span starts)."""
    tl.store(trace_ptr + _SPAN_STACK + depth, now())


@triton.jit
def span_end_kernel(trace_ptr, depth,
                    kind, tile, peer, rank):
    """One program: record an event from the start time of the span at level ``depth`` until now."""
    record(trace_ptr, kind, tile, peer, tl.load(trace_ptr + _SPAN_STACK + depth), rank, True)
