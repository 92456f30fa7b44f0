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

from .. import config

#: Why the host raised the abort word (set by the host; the simulator's waits put it in their error).
ABORT_REASON = ""

if config.BACKEND == "sim":

    def now_ns():
        """Nanoseconds from a monotonic clock (the host clock in the simulator)."""
        return time.monotonic_ns()

    def backoff():
        """Let other rank processes run: in the simulator ranks share a few CPU cores."""
        os.sched_yield()

    def on_wait_timeout(rank, peer, offset, expected, observed, timeout_ns, aborted):
        """Raise at once: the simulator can stop a kernel with a Python exception."""
        from ..errors import RankTimeoutError

        raise RankTimeoutError(
            describe_wait_fault(_scalar(rank), _scalar(peer), _scalar(offset), _scalar(expected),
                                _scalar(observed), _scalar(timeout_ns), bool(_scalar(aborted)), ABORT_REASON)
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
    def on_wait_timeout(rank, peer, offset, expected, observed, timeout_ns, aborted):
        """On a GPU the fault record in the control block is the report; the host raises it."""
        pass

    @triton.jit
    def on_out_of_heap(rank, peer, offset, heap_size):
        """On a GPU the fault record in the control block is the report; the host raises it."""
        pass


def describe_wait_fault(rank, peer, offset, expected, observed, timeout_ns, aborted, reason="") -> str:
    """The message of a wait that gave up, shared by the simulator and the host-side check."""
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
