"""Exceptions raised by trident. Every message says what was wrong, on which rank, and what was expected."""

from __future__ import annotations


class TridentError(RuntimeError):
    """Base class of every error trident raises on purpose."""


class BackendUnavailableError(TridentError):
    """The requested backend cannot run on this machine (for example ``cuda`` with no GPU)."""


class HeapExhaustedError(TridentError, MemoryError):
    """An allocation does not fit in the symmetric heap. The heap stays usable."""


class NotSymmetricError(TridentError, ValueError):
    """A tensor that must live on the symmetric heap does not."""


class DivergenceError(TridentError):
    """Ranks disagree on something that must be identical everywhere (allocations, shapes, world size)."""


class RankTimeoutError(TridentError, TimeoutError):
    """A wait across ranks ran out of time; the message names the ranks that never arrived."""


class DeviceError(TridentError):
    """A kernel reported a fault through the heap's control block (a timed-out wait, an out-of-heap access)."""


class ContextClosedError(TridentError):
    """A context was used after :meth:`trident.Context.close`."""
