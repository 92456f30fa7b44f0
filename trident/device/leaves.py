"""The few device functions whose body differs between the GPU and the CPU simulator.

Everything else in the device API is one ``@triton.jit`` body for both backends. These leaves
cannot be: a GPU reads its nanosecond timer with PTX, which Triton's interpreter cannot run,
and the simulator can do things a GPU cannot (yield the CPU while spinning, raise a Python
exception the moment a wait gives up). In the simulator the interpreter runs kernels as
Python, so a leaf may be a plain Python function.
"""

from __future__ import annotations

import os
import time

import triton
import triton.language as tl

from .. import layout, platform
from ..faults import (
    abort_reason,
    describe_heap_fault,
    describe_peer_fault,
    describe_unreachable_fault,
    describe_wait_fault,
)

if platform.SIMULATOR:

    #: Polls between two reads of the clock in a wait. Few: the interpreter takes milliseconds per
    #: poll, and 256 of them made a wait overrun its timeout by seconds.
    SPIN_POLLS = tl.constexpr(4)

    def now_ns():
        """Nanoseconds from a monotonic clock (the host clock in the simulator)."""
        return time.monotonic_ns()

    def backoff():
        """Let other rank processes run: in the simulator ranks share a few CPU cores."""
        os.sched_yield()

    def on_wait_timeout(rank, peer, offset, expected, observed, timeout_ns, aborted, abort_word):
        """Raise at once: the simulator can stop a kernel with a Python exception."""
        from ..errors import RankTimeoutError

        raise RankTimeoutError(
            describe_wait_fault(_scalar(rank), _scalar(peer), _scalar(offset), _scalar(expected),
                                _scalar(observed), _scalar(timeout_ns), bool(_scalar(aborted)),
                                abort_reason(_scalar(abort_word)))
            + " Known causes: the peer never reached the matching call (it called a different collective, "
            "passed different sizes, or failed earlier), or, in the simulator, which runs the programs of "
            "one launch one after another, a program waited for a later program of the same launch."
        )

    def on_access_fault(kind, rank, peer, offset, limit):
        """Raise at once (debug mode): a peer that is no rank (``limit``: the world size) or an address
        outside the heap (``limit``: the heap size)."""
        from ..errors import DeviceError

        rank, peer, offset, limit = (_scalar(v) for v in (rank, peer, offset, limit))
        if _scalar(kind) == layout.ERR_BAD_PEER:
            raise DeviceError(describe_peer_fault(rank, peer, limit))
        if _scalar(kind) == layout.ERR_UNREACHABLE:
            raise DeviceError(describe_unreachable_fault(rank, peer, offset))
        raise DeviceError(describe_heap_fault(rank, peer, offset, limit))

    def _scalar(value):
        data = getattr(getattr(value, "handle", None), "data", value)
        return int(data.item()) if hasattr(data, "item") else int(data)

else:

    #: Polls between two reads of the clock in a wait (a poll is a few hundred nanoseconds).
    SPIN_POLLS = tl.constexpr(256)

    @triton.jit
    def now_ns():
        """Nanoseconds from the GPU's global timer."""
        return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64,
                                         is_pure=False, pack=1)

    @triton.jit
    def backoff():
        """Nothing to yield on a GPU."""
        pass

    @triton.jit
    def on_wait_timeout(rank, peer, offset, expected, observed, timeout_ns, aborted, abort_word):
        """On a GPU the fault record in the control block is the report; the host raises it."""
        pass

    @triton.jit
    def on_access_fault(kind, rank, peer, offset, limit):
        """On a GPU the fault record in the control block is the report; the host raises it."""
        pass
