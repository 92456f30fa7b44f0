"""Exceptions raised by trident. Every message says what was wrong, on which rank, and what was expected."""

from __future__ import annotations


class TridentError(RuntimeError):
    """Base class of every error trident raises on purpose."""


class BackendUnavailableError(TridentError):
    """The requested backend cannot run on this machine (for example ``cuda`` with no GPU)."""


class ContextRefusedError(BackendUnavailableError):
    """CUDA refused this process a context on its GPU ("busy or unavailable"): under an MPS daemon,
    most often because the daemon already serves as many client processes as it admits. Starting
    the process again once other clients have ended works; nothing of trident's was created."""


class HeapExhaustedError(TridentError, MemoryError):
    """An allocation does not fit in the symmetric heap. The heap stays usable."""


class NotSymmetricError(TridentError, ValueError):
    """A tensor that must live on the symmetric heap does not."""


class DivergenceError(TridentError):
    """Ranks disagree on something that must be identical everywhere (allocations, shapes, world size)."""


class RankTimeoutError(TridentError, TimeoutError):
    """A wait across ranks gave up: it ran out of time, or a rank it waited for is gone (host or
    device wait alike); the message names the ranks that never arrived and why."""


class LostGpuContextError(TridentError):
    """This rank's CUDA context failed (an illegal access, a launch failure) because a peer died while
    its kernel ran on the same GPU under MPS: MPS ends every client's GPU work then. The message names
    the lost ranks; nothing on that GPU can be used again, so the rank must exit."""


class DeviceError(TridentError):
    """A kernel reported a fault through the heap's control block (an out-of-heap access, a bad peer)."""


class ContextClosedError(TridentError):
    """A context was used after :meth:`trident.Context.close`."""


class CapacityError(DeviceError):
    """A call's receive buffer is too small for what the ranks sent (an MoE dispatch's ``capacity``).

    Nothing is dropped silently: the call reports how many rows were needed. Raised by the call itself
    where it may synchronise with the host, else recorded by the kernel and raised by ``ctx.check()``,
    ``ctx.barrier()`` or the result's ``check()``."""


class TopologyError(TridentError, ValueError):
    """An operation needs peers in another node that this rank cannot address (their heaps are not
    mapped), or a layout of nodes it cannot use. The message says what runs across nodes."""
