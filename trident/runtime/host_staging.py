"""torch.distributed calls through host copies, for a gloo group given GPU tensors.

Where ranks share a GPU, NCCL cannot run ("Duplicate GPU detected"), so trident's torch groups
fall back on gloo. Gloo handles a few collectives on CUDA tensors itself, but not point-to-point
or most others (``send``/``recv`` fail with ``writev ... Bad address``), so :class:`HostStaged`
runs every call of its inner group on host copies of the GPU tensors and copies them back.
Slow, but the same results: the code a user tests on one shared GPU runs unchanged on a cluster,
where NCCL takes these calls. Calls finish before they return (an ``async_op=True`` call's Work
is already complete).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist


class CompletedWork(dist.Work):
    """A completed Work holding a call's result: trident launched its kernel on the current stream
    (as NCCL would), or a staged call already finished. Its future is made only when asked for
    (most callers only ``wait()``, and a torch Future made on every call would cost more than a
    small collective's own host time).

    Example::

        return CompletedWork(tensors)
    """

    def __init__(self, result):
        super().__init__()
        self._result = result

    def wait(self, timeout=None) -> bool:
        """Already done."""
        return True

    def is_completed(self) -> bool:
        """Always True."""
        return True

    def is_success(self) -> bool:
        """Always True (a failed call raised)."""
        return True

    def result(self):
        """The call's tensors."""
        return self._result

    def hold(self, result) -> None:
        """Hold ``result`` from now on (a Work reused for a later call)."""
        self._result = result

    def get_future(self) -> torch.futures.Future:
        """A completed future of :meth:`result`."""
        future: torch.futures.Future = torch.futures.Future()
        future.set_result(self._result)
        return future


def _to_host(value, copies: list, stage: Callable[[torch.Tensor], bool]):
    """``value`` with every tensor ``stage`` picks replaced by a host copy (lists and tuples walked);
    ``copies`` collects ``(original, copy)`` pairs."""
    if isinstance(value, torch.Tensor):
        if not stage(value):
            return value
        host = value.detach().to("cpu", copy=True)
        copies.append((value, host))
        return host
    if isinstance(value, (list, tuple)):
        return type(value)(_to_host(v, copies, stage) for v in value)
    return value


def staged_call(method: Callable, args: tuple, stage: Callable[[torch.Tensor], bool]):
    """``method(*args)`` with the tensors ``stage`` picks (those on the GPU) on host copies, waited for, and
    the copies written back into the originals (outputs get their results; inputs are unchanged).

    Returns:
        A completed :class:`CompletedWork` holding the call's original tensors' first argument.

    Example::

        work = staged_call(gloo_group.send, ([t_on_gpu], 1, 0), stage=lambda t: t.device == ctx.device)
    """
    copies: list = []
    host_args = tuple(_to_host(a, copies, stage) for a in args)
    work = method(*host_args)
    if work is not None:
        work.wait()
    for original, host in copies:
        original.copy_(host)
    return CompletedWork(args[0] if args else [])


class HostStaged:
    """A process group (gloo) whose every call runs on host copies of the GPU tensors it is given.

    Args:
        inner: the group that runs the calls (gloo).
        stage: which tensors go through the host (those on the rank's GPU).

    Example::

        fallback = HostStaged(dist.ProcessGroupGloo(store, rank, size, timeout), lambda t: t.device == ctx.device)
        fallback.send([t_on_gpu], 1, 0).wait()
    """

    def __init__(self, inner, stage: Callable[[torch.Tensor], bool]):
        self.inner, self.stage = inner, stage

    def __getattr__(self, name: str):
        method = getattr(self.inner, name)
        if not callable(method) or name in ("shutdown", "abort", "size", "rank", "getBackendName", "name"):
            return method
        return lambda *args: staged_call(method, args, self.stage)
