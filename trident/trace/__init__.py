"""Timelines: kernels record per-tile events into a heap buffer; the host exports them.

Device side (inside ``@triton.jit`` kernels)::

    t0 = trident.trace.now()
    ...  # compute a tile
    trident.trace.record(trace_ptr, trident.trace.COMPUTE, tile, rank, t0, rank, TRACE)
    t0 = trident.trace.now()
    ...  # send it
    trident.trace.record(trace_ptr, trident.trace.COMM, tile, peer, t0, rank, TRACE)

``TRACE`` is a ``tl.constexpr`` of your kernel: with ``TRACE=False`` the calls compile to nothing.

Host side::

    trace = trident.trace.Trace(ctx, capacity=1 << 16)    # collective (heap allocation)
    kernel[grid](..., trace.ptr, TRACE=True)
    events = trace.gather()                               # collective
    trace.to_chrome("trace.json"); trace.plot("timeline.png")    # plot: needs matplotlib

Work whose kernels record nothing shows as one event per ``with trace.span(kind):`` block
(spans nest, up to ``MAX_SPAN_DEPTH`` deep). See docs/tracing.md.
"""

from .device import COMM, COMPUTE, KIND_NAMES, MAX_SPAN_DEPTH, WAIT, now, now_if, record
from .export import chrome_trace, plot_timeline, write_chrome
from .host import Event, Events, Trace, decode

__all__ = ["now", "now_if", "record", "COMPUTE", "COMM", "WAIT", "KIND_NAMES", "MAX_SPAN_DEPTH", "Trace", "Event",
           "Events", "decode", "chrome_trace", "write_chrome", "plot_timeline"]
