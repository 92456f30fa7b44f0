"""Naming the cause when a rank's CUDA context fails because a peer died mid-kernel.

Ranks sharing a GPU under MPS (``trident run --mps``) are clients of one daemon. When one of them
dies while its kernel runs (killed, or its own GPU fault), MPS ends the GPU work of every client:
the survivors' next launch or synchronization fails with a *sticky* CUDA error such as "an illegal
memory access was encountered", which says nothing of the peer. :func:`explain_lost_context`
turns such an error into a :class:`~trident.errors.LostGpuContextError` that names the lost ranks
and the MPS fault domain, once the watchdog (:mod:`trident.runtime.watchdog`) has seen the peer's
process end; every trident call (:func:`trident.calls.run_call`) and ``ctx.check()`` apply it.
"""

from __future__ import annotations

import contextlib
import time
from typing import NoReturn

from ..errors import LostGpuContextError

#: What CUDA (through torch or Triton) says when a context has lost its device state for good.
STICKY_CUDA_ERRORS = ("illegal memory access", "unspecified launch failure", "illegal instruction",
                      "misaligned address", "hardware stack error", "CUDA_ERROR_ILLEGAL_ADDRESS",
                      "CUDA_ERROR_LAUNCH_FAILED", "cudaErrorIllegalAddress", "cudaErrorLaunchFailure")
#: Watchdog intervals to wait for a dying peer to be seen gone before the original error is raised.
SETTLE_INTERVALS = 3


def explain_lost_context(team, error: BaseException) -> LostGpuContextError | None:
    """The error to raise instead of ``error`` when it is a sticky CUDA error and a peer of ``team`` (a
    context or a group) is gone; None otherwise (raise ``error`` as it is).

    A peer that died a moment ago may not be seen yet: this waits up to :data:`SETTLE_INTERVALS` of the
    watchdog's interval for it (only for a sticky CUDA error, after which the rank cannot go on anyway).

    Example::

        try:
            launch()
        except RuntimeError as error:
            raise (explain_lost_context(ctx, error) or error) from error
    """
    text = str(error)
    if not any(s in text for s in STICKY_CUDA_ERRORS):
        return None
    ctx = getattr(team, "ctx", team)  # a group's world context holds the watchdog
    lost = ctx.lost_ranks
    deadline = time.monotonic() + SETTLE_INTERVALS * ctx.watchdog_interval
    while not lost and time.monotonic() < deadline:
        time.sleep(ctx.watchdog_interval / 4)
        lost = ctx.lost_ranks
    if not lost:
        return None
    gone = "; ".join(f"rank {r} is gone: {why}" for r, why in sorted(lost.items()))
    cuda_said = text.strip().splitlines()[-1][:200]
    return LostGpuContextError(
        f"{team.who()}: this rank's GPU work failed ({cuda_said}) after a peer died ({gone}). "
        f"Ranks sharing a GPU under MPS (trident run --mps) are clients of one MPS daemon, and a client that dies "
        f"while its kernel runs ends the GPU work of every client: the MPS fault domain. This rank's CUDA context "
        f"cannot be used again; the job must restart (docs/reliability.md, 'the MPS fault domain').")


@contextlib.contextmanager
def naming_lost_peers(team):
    """Inside it, a sticky CUDA error after a peer of ``team`` died is raised as a
    :class:`~trident.errors.LostGpuContextError` (:func:`explain_lost_context`).

    Example::

        with naming_lost_peers(ctx):
            torch.cuda.synchronize()
    """
    try:
        yield
    except RuntimeError as error:
        raise_explained(team, error)


def raise_explained(team, error: RuntimeError) -> NoReturn:
    """Raise ``error``, or, when a peer of ``team`` died mid-kernel, the error that says so
    (:func:`explain_lost_context`). For an ``except`` block on a path too hot for a ``with``.

    Example::

        try:
            entry.replay(tensors)
        except RuntimeError as error:
            raise_explained(team, error)
    """
    explained = explain_lost_context(team, error)
    if explained is None:
        raise error
    raise explained from error
