"""Host side of tracing: the trace buffer on the heap, decoding, gathering across ranks."""

from __future__ import annotations

import contextlib
from typing import NamedTuple

import torch

from .device import (
    CAPACITY_WORD,
    COMM,
    COUNT_WORD,
    FIELDS,
    HEADER_WORDS,
    KIND_NAMES,
    MAX_SPAN_DEPTH,
    RECORD_WORDS,
    span_end_kernel,
    span_start_kernel,
)


class Event(NamedTuple):
    """One recorded event; times are device nanoseconds (``t_end >= t_start``)."""

    kind: int
    program: int
    tile: int
    peer: int
    t_start: int
    t_end: int
    rank: int

    @property
    def kind_name(self) -> str:
        """``"compute"``, ``"comm"``, ``"wait"`` (or ``"kind N"`` for a kind trident does not name)."""
        return KIND_NAMES.get(self.kind, f"kind {self.kind}")


class Events(list):
    """A list of :class:`Event` sorted by start time, with ``dropped``: events lost to a full buffer.

    ``dropped_by_rank`` maps each rank to its count (one entry for a single rank's events).
    """

    def __init__(self, events=(), dropped_by_rank: dict[int, int] | None = None):
        super().__init__(sorted(events, key=lambda e: (e.t_start, e.rank, e.program)))
        self.dropped_by_rank = dict(dropped_by_rank or {})

    @property
    def dropped(self) -> int:
        """Events that did not fit, over all ranks these events come from."""
        return sum(self.dropped_by_rank.values())

    @property
    def ranks(self) -> list[int]:
        """The ranks with events or drop counts, sorted."""
        return sorted({e.rank for e in self} | set(self.dropped_by_rank))


def decode(buffer: torch.Tensor, rank: int) -> Events:
    """Decode a trace buffer (any device) into :class:`Events`.

    Args:
        buffer: the int64 trace buffer (header, then records).
        rank: the rank the buffer belongs to (for the drop count).

    Returns:
        The written records, sorted by start time, with the number of dropped events.

    Example::

        events = decode(trace.tensor, ctx.rank)
    """
    words = buffer.detach().to("cpu")
    count, capacity = int(words[COUNT_WORD]), int(words[CAPACITY_WORD])
    used = min(count, capacity)
    rows = words[HEADER_WORDS:HEADER_WORDS + used * RECORD_WORDS].view(used, RECORD_WORDS).tolist()
    written = FIELDS.index("written")
    events = [Event(*row[:written]) for row in rows if row[written] == 1]
    return Events(events, {rank: max(count - capacity, 0)})


class Trace:
    """A trace buffer on the symmetric heap for kernels to record events into.

    Making one is collective (it allocates on the heap, like every heap tensor).

    Args:
        ctx: the trident context.
        capacity: how many events fit on each rank; further events are dropped and counted.

    Example::

        trace = trident.trace.Trace(ctx, capacity=4096)
        my_kernel[grid](..., trace.ptr, TRACE=True)
        ctx.barrier()
        events = trace.gather()          # collective: every rank's events
        if ctx.rank == 0:
            trace.to_chrome("trace.json"); trace.plot("timeline.png")
    """

    def __init__(self, ctx, capacity: int = 1 << 16):
        if capacity < 1:
            raise ValueError(f"Trace capacity must be at least 1, got {capacity}")
        self.ctx = ctx
        self.capacity = int(capacity)
        self.tensor = ctx.zeros(HEADER_WORDS + self.capacity * RECORD_WORDS, dtype=torch.int64)
        self._gathered: Events | None = None
        self._open_spans = 0  # spans open now: the next one starts at this nesting level
        self.reset()

    @property
    def ptr(self) -> torch.Tensor:
        """What to pass as a kernel's ``trace_ptr`` (the buffer tensor; Triton passes its address)."""
        return self.tensor

    def reset(self) -> None:
        """Forget every recorded event (ordered after earlier kernels on this rank's stream)."""
        self.tensor.zero_()
        self.tensor[CAPACITY_WORD] = self.capacity
        self._gathered = None

    @contextlib.contextmanager
    def span(self, kind: int = COMM, tile: int = 0, peer: int | None = None):
        """Record the device work queued inside the block, on the current stream, as one event.

        For work whose kernels record nothing (a library collective, a torch call): a
        one-program kernel reads the timer before the block's work and another records the event
        after it, both stream-ordered, so the event spans that work. It shows as program 0.
        Spans nest, up to ``trident.trace.MAX_SPAN_DEPTH`` (6) deep: each level keeps its
        start time in a word of the buffer's header. A block that raises records no event.

        Args:
            kind: the event kind (``trident.trace.COMM`` by default).
            tile: the event's tile number.
            peer: the rank the work talks to (default: this rank).

        Raises:
            ValueError: when ``MAX_SPAN_DEPTH`` spans are open already.

        Example::

            with trace.span(trident.trace.COMM, tile=0):
                trident.ccl.all_gather(ctx, out, inp)
                with trace.span(trident.trace.COMPUTE, tile=1):   # nested: its own event
                    out.mul_(2)
        """
        depth = self._open_spans
        if depth >= MAX_SPAN_DEPTH:
            raise ValueError(f"rank {self.ctx.rank}: trace spans nest at most {MAX_SPAN_DEPTH} deep "
                             f"({depth} are open)")
        span_start_kernel[(1,)](self.tensor, depth)
        self._open_spans += 1
        try:
            yield self
        finally:
            self._open_spans -= 1
        rank = self.ctx.rank
        span_end_kernel[(1,)](self.tensor, depth, int(kind), int(tile), rank if peer is None else int(peer), rank)

    def events(self) -> Events:
        """This rank's events, decoded (waits for this rank's device work first).

        Returns:
            :class:`Events`; ``.dropped`` counts the events that did not fit.
        """
        if not self.ctx.platform.simulator:  # the simulator's kernels finish before their launch returns
            torch.cuda.synchronize(self.ctx.device)
        return decode(self.tensor, self.ctx.rank)

    def gather(self) -> Events:
        """Every rank's events, on every rank (collective; call it on all ranks).

        Returns:
            :class:`Events` of all ranks; ``.dropped_by_rank`` has each rank's drop count.
            ``to_chrome`` and ``plot`` export these until the next ``reset``.
        """
        mine = self.events()
        merged, dropped = [], {}
        for src in range(self.ctx.world_size):
            theirs = self.ctx.broadcast((list(mine), mine.dropped_by_rank) if src == self.ctx.rank else None,
                                        src=src)
            merged += [Event(*e) for e in theirs[0]]
            dropped.update(theirs[1])
        self._gathered = Events(merged, dropped)
        return self._gathered

    def _exported(self) -> Events:
        return self._gathered if self._gathered is not None else self.events()

    def to_chrome(self, path: str, title: str | None = None) -> dict:
        """Write the gathered events (or this rank's, before ``gather``) as Chrome/Perfetto JSON.

        Returns:
            The JSON document (see :func:`trident.trace.export.chrome_trace`).
        """
        from .export import write_chrome

        return write_chrome(self._exported(), path, title=title)

    def plot(self, path: str, title: str | None = None) -> str:
        """Draw the gathered events (or this rank's) as a PNG timeline; returns ``path``."""
        from .export import plot_timeline

        return plot_timeline(self._exported(), path, title=title)
