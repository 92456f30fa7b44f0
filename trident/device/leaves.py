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

from .. import platform
from ..faults import abort_reason, describe_heap_fault, describe_wait_fault

if platform.SIMULATOR:

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
            + " In the simulator the programs of one launch run one after another, so a program that"
            " waits for a later program of the same launch never sees it."
        )

    def on_out_of_heap(rank, peer, offset, heap_size):
        """Raise at once with the faulting rank, peer and offset."""
        from ..errors import DeviceError

        raise DeviceError(describe_heap_fault(_scalar(rank), _scalar(peer), _scalar(offset),
                                              _scalar(heap_size)))

    def _scalar(value):
        data = getattr(getattr(value, "handle", None), "data", value)
        return int(data.item()) if hasattr(data, "item") else int(data)

else:

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
    def on_out_of_heap(rank, peer, offset, heap_size):
        """On a GPU the fault record in the control block is the report; the host raises it."""
        pass
